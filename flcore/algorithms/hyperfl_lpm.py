"""HyperFL-LPM: HyperFL for large pretrained models (Guo et al., AAAI 2025, section 3.3 and
appendix D.1).

A frozen pretrained backbone (``model: resnet18_adapter`` or ``vit_s16_adapter``, see
flcore/models/adapters.py) is the feature extractor; the client's hypernetwork generates only its
adapters' weights from the client embedding. Training is HyperFL's: the classifier for one epoch
on the generated (fixed) adapters, then the hypernetwork and the embedding. Only the
hypernetwork is uploaded. The paper's LPM settings: 20 clients, batch 16, step size 0.02
(EMNIST) / 0.1 (CIFAR-10) with ViT and 0.01 with ResNet.

Table 2's baselines are configurations of ``local`` and ``fedavg`` on the same backbones, with
``algorithm_params.trainable``: ``head`` for "with fixed feature extractor" (dagger) and
``adapters`` for "with adapter fine-tuning" (double dagger); see sweeps/configs/lpm/.

The hypernetwork's heads start from PyTorch's default initialisation, as in the authors' code
(``head_init_scale: 1``); HyperFL's CNN default of 0.1 (see flcore/algorithms/hyperfl.py) was
measured for a generated extractor, not for adapters.
"""

from __future__ import annotations

import torch
from pydantic import Field

from flcore.algorithms.base import ALGORITHMS
from flcore.algorithms.hyperfl import HyperFL, HyperFLParams
from flcore.errors import ConfigError
from flcore.models.base import SplitModel

__all__ = ["HyperFLLPM"]


class HyperFLLPMParams(HyperFLParams):
    head_init_scale: float = Field(
        1.0, gt=0, description="scales the hypernetwork heads' initial weights (1: authors')"
    )


@ALGORITHMS.register("hyperfl_lpm")
class HyperFLLPM(HyperFL):
    """HyperFL generating adapter weights for a frozen pretrained backbone."""

    name = "hyperfl_lpm"
    Params = HyperFLLPMParams

    def _target_shapes(self, model: SplitModel) -> dict[str, torch.Size]:
        shapes = {k: p.shape for k, p in model.features.named_parameters() if "adapter" in k}
        if not shapes:
            raise ConfigError(
                "model",
                f"hyperfl_lpm needs a backbone with adapters (resnet18_adapter, vit_s16_adapter), "
                f"got {self.model_spec.name!r}",
            )
        return shapes
