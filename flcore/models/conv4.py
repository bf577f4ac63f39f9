"""CONV4, the few-shot learner of MAML (Finn et al., ICML 2017) that LoDMeta uses (Yang & Kwok,
Appendix C: "4-layer CNN. Each layer contains 64 3x3 convolutional filters, followed by batch
normalization, ReLU activation, and 2x2 max-pooling").

Choices, stated:
- Padding 1 on each convolution, as MAML's reference code; a 28 x 28 input (FMNIST) ends in a
  1 x 1 x 64 map, an 84 x 84 one (mini-ImageNet) in 5 x 5 x 64 (1,600 features).
- BatchNorm with learnt scale and shift and no running statistics
  (``track_running_stats=False``): every forward pass normalises with the batch's own statistics,
  in training and in evaluation, as MAML's reference code does. The network then has no
  buffers, so functional inner loops (torch.func) carry only parameters, and evaluating a task
  normalises over that task's query batch.
- ``image_size`` defaults to 28 for one input channel and 84 for three.
"""

from __future__ import annotations

from torch import nn

from flcore.errors import ConfigError
from flcore.models.base import MODELS, SplitModel

__all__ = ["Conv4"]


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel_size=3, padding=1),
        nn.BatchNorm2d(cout, track_running_stats=False),
        nn.ReLU(),
        nn.MaxPool2d(2),
    )


@MODELS.register("conv4")
class Conv4(SplitModel):
    """Four conv-BN-ReLU-pool blocks of ``hidden`` channels and a linear head."""

    def __init__(
        self,
        num_classes: int = 5,
        in_channels: int = 1,
        hidden: int = 64,
        image_size: int | None = None,
    ) -> None:
        super().__init__()
        size = image_size if image_size is not None else (28 if in_channels == 1 else 84)
        if isinstance(size, bool) or not isinstance(size, int) or size < 16:
            raise ConfigError("model_params.image_size", f"must be an integer >= 16, got {size!r}")
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ConfigError("model_params.hidden", f"must be an integer >= 1, got {hidden!r}")
        for _ in range(4):
            size //= 2
        self.features = nn.Sequential(
            _block(in_channels, hidden),
            _block(hidden, hidden),
            _block(hidden, hidden),
            _block(hidden, hidden),
            nn.Flatten(),
        )
        self.head = nn.Linear(hidden * size * size, num_classes)
