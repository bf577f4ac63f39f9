"""The split every model follows: a feature extractor and a classifier head.

HyperFL generates the extractor and keeps the head local, pFedHN-PC personalises the head,
FedHKD distils on the representations, Pa3dFL slices channel widths: all of them need the two
parts addressable by name, so every model exposes ``features`` and ``head``.
"""

from __future__ import annotations

import torch
from torch import nn

from flcore.registry import Registry

__all__ = ["SplitModel", "MODELS", "build_model"]


class SplitModel(nn.Module):
    """A network made of ``features`` (input -> representation) and ``head`` (-> logits)."""

    features: nn.Module
    head: nn.Module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        """The representation the head reads (FedHKD's h, HyperFL's extractor output)."""
        return self.features(x)

    def head_keys(self) -> list[str]:
        """State-dict keys of the classifier head."""
        return [f"head.{k}" for k in self.head.state_dict()]

    def feature_keys(self) -> list[str]:
        """State-dict keys of the feature extractor."""
        return [f"features.{k}" for k in self.features.state_dict()]


MODELS: Registry = Registry("model")


def build_model(name: str, *, num_classes: int, in_channels: int, **kwargs: object) -> SplitModel:
    """Build a registered model by name."""
    return MODELS.create(name, num_classes=num_classes, in_channels=in_channels, **kwargs)
