"""FedHKD's networks: a backbone, a projection to a small latent, a BatchNorm, a linear head.

Paper: "The Best of Both Worlds: Accurate Global and Personalized Models through Federated
Learning with Data-Free Hyper-Knowledge Distillation", Huancheng Chen and Haris Vikalo, ICLR 2023.
Sec. 4.1 deploys ShuffleNetV2 on SVHN and ResNet18 on CIFAR-10/100; Appendix A.2 sets the latent
dimension of the data representation to 32 (SVHN) and 64 (CIFAR); Sec. 4.3 states that "the
outermost layer in the feature extractor is a batch normalization (BN) layer" and, from its
eq. (15), bounds each coordinate of the representation by zeta = 3 with probability 99.73%.

What ``represent(x)`` returns (FedHKD's h): ``h = BN(W f(x) + b)``, where ``f`` is the backbone
(its pooled output), ``W, b`` a linear projection to ``latent_dim`` and ``BN`` a
``BatchNorm1d(latent_dim, affine=False)``: each coordinate standardised with the batch's mean and
(biased) variance in training mode, with the running estimates in eval mode, and no learnt scale
or shift afterwards. The head is ``nn.Linear(latent_dim, num_classes)`` on h.

Choices where the paper is silent, and deviations:
- ``affine=False``: eq. (15) is BN without scale and shift, and the zeta = 3 argument needs h to
  be the standardised value; a learnt gamma/beta would let h grow without bound. The bound is
  statistical, not hard: in eval mode (running statistics) or for outliers a coordinate can
  exceed 3; an algorithm that needs a hard sensitivity bound must clamp h itself.
- A training batch of one sample (the last, short mini-batch of an epoch) cannot be
  standardised by its own statistics (PyTorch refuses; the output would be all zeros): such a
  batch is normalised with the running estimates, which it does not update.
- No activation between the projection and the BN (BN is the last layer, as Sec. 4.3 says).
- ``fedhkd_cnn``: the Fashion-MNIST CNN of :mod:`flcore.models.cnn` (conv 16 k5, conv 32 k5
  pad 1, each followed by LeakyReLU and 2x2 max-pool, fc -> 128, LeakyReLU) followed by the
  projection 128 -> ``latent_dim`` (default 32) and the BN. The paper has no FMNIST network;
  this one lets the tests and CPU runs use FedHKD's representation design. ``image_size``
  (default 28 for one input channel, 32 for three) sets the flatten width (800 at 28 px, 1152
  at 32 px).
- ``fedhkd_shufflenet``: torchvision's ``shufflenet_v2_x1_0(weights=None)``, adapted to 32 x 32
  inputs by a stride-1 stem convolution (3x3, ``in_channels`` -> 24) and no stem max-pool, so
  the network downsamples 8x instead of 32x (4 x 4 maps after stage 4 instead of 1 x 1); its
  classifier is replaced by the projection 1024 -> ``latent_dim`` (default 32) and the BN.
- ``fedhkd_resnet18``: torchvision's ``resnet18(weights=None)`` adapted the usual CIFAR way (a
  3x3 stride-1 stem convolution, ``in_channels`` -> 64, and no stem max-pool: 4 x 4 maps after
  layer 4); its classifier is replaced by the projection 512 -> ``latent_dim`` (default 64) and
  the BN.
- Random initialisation: torchvision's for the backbones (the new ResNet stem gets ResNet's
  Kaiming-normal fan-out init; the ShuffleNet stem PyTorch's default, as torchvision applies no
  init of its own there), PyTorch's default for the linear layers; no pretrained weights and no
  dropout.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from flcore.errors import ConfigError
from flcore.models.base import MODELS, SplitModel

__all__ = ["LatentNorm", "FedHKDCNN", "FedHKDShuffleNet", "FedHKDResNet18"]


class LatentNorm(nn.BatchNorm1d):
    """``BatchNorm1d(dim, affine=False)`` that normalises a one-sample training batch with the
    running estimates (leaving them unchanged) instead of failing."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim, affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] == 1:
            return F.batch_norm(x, self.running_mean, self.running_var, eps=self.eps)
        return super().forward(x)


def _check(key: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"model_params.{key}", f"must be an integer >= {minimum}, got {value!r}")
    return value


class _LatentModel(SplitModel):
    """A backbone ending in ``width`` features, projected to ``latent_dim`` and normalised."""

    def __init__(self, backbone: nn.Module, width: int, latent_dim: int, num_classes: int) -> None:
        super().__init__()
        self.latent_dim = _check("latent_dim", latent_dim, 1)
        self.features = nn.Sequential(
            OrderedDict(
                backbone=backbone,
                project=nn.Linear(width, latent_dim),
                norm=LatentNorm(latent_dim),
            )
        )
        self.head = nn.Linear(latent_dim, num_classes)


@MODELS.register("fedhkd_cnn")
class FedHKDCNN(_LatentModel):
    """The FMNIST CNN (conv 16 k5, conv 32 k5 pad 1, fc -> 128) + projection + BN + head."""

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        latent_dim: int = 32,
        image_size: int | None = None,
    ) -> None:
        if image_size is None:
            image_size = 28 if in_channels == 1 else 32
        size = _check("image_size", image_size, 10)
        side = ((size - 4) // 2 - 2) // 2  # conv k5, pool 2, conv k5 pad 1, pool 2
        body = nn.Sequential(
            nn.Conv2d(in_channels, 16, kernel_size=5),
            nn.LeakyReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=5, padding=1),
            nn.LeakyReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * side * side, 128),
            nn.LeakyReLU(),
        )
        super().__init__(body, 128, latent_dim, num_classes)


@MODELS.register("fedhkd_shufflenet")
class FedHKDShuffleNet(_LatentModel):
    """ShuffleNetV2 x1.0 with a stride-1 stem and no stem pool (32 px) + projection + BN + head."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, latent_dim: int = 32) -> None:
        from torchvision.models import shufflenet_v2_x1_0

        net = shufflenet_v2_x1_0(weights=None)
        stem_out = net.conv1[0].out_channels
        net.conv1[0] = nn.Conv2d(in_channels, stem_out, 3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
        width = net.fc.in_features
        net.fc = nn.Identity()
        super().__init__(net, width, latent_dim, num_classes)


@MODELS.register("fedhkd_resnet18")
class FedHKDResNet18(_LatentModel):
    """ResNet-18 with a 3x3 stride-1 stem and no stem pool (32 px) + projection + BN + head."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, latent_dim: int = 64) -> None:
        from torchvision.models import resnet18

        net = resnet18(weights=None)
        net.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        # torchvision's own initialisation of ResNet convolutions, applied to the new stem
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
        net.maxpool = nn.Identity()
        width = net.fc.in_features
        net.fc = nn.Identity()
        super().__init__(net, width, latent_dim, num_classes)
