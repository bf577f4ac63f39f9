"""A hypernetwork that generates the parameters of a target module from an embedding.

HyperFL's generator (Guo et al., AAAI 2025, section 3.2; the authors' code): an MLP body
``Linear(embed -> hidden) + ReLU`` (``depth`` such layers), then one linear head per weight and
bias tensor of the target, each producing that tensor's ``numel`` values. pFedHN (Shamsian et al.
2021) uses the same shape of generator on the server.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

__all__ = ["HyperNetwork"]


class HyperNetwork(nn.Module):
    """Maps an embedding ``v`` (shape ``[embed_dim]``) to ``{name: tensor}`` with the target's
    exact parameter shapes.

    Args:
        target_shapes: the generated tensors' names and shapes, in order.
        embed_dim: size of the input embedding.
        hidden_dim: width of the MLP body.
        depth: number of ``Linear + ReLU`` layers in the body (>= 1).
    """

    def __init__(
        self,
        target_shapes: Mapping[str, torch.Size | tuple[int, ...]],
        *,
        embed_dim: int = 64,
        hidden_dim: int = 128,
        depth: int = 1,
    ) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.names = list(target_shapes)
        self.shapes = [torch.Size(s) for s in target_shapes.values()]
        layers: list[nn.Module] = []
        d = embed_dim
        for _ in range(depth):
            layers += [nn.Linear(d, hidden_dim), nn.ReLU()]
            d = hidden_dim
        self.body = nn.Sequential(*layers)
        self.heads = nn.ModuleList(nn.Linear(hidden_dim, s.numel()) for s in self.shapes)

    @classmethod
    def for_module(cls, module: nn.Module, **kwargs: int) -> HyperNetwork:
        """A hypernetwork generating every parameter of ``module``."""
        return cls({k: p.shape for k, p in module.named_parameters()}, **kwargs)

    def forward(self, embedding: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.body(embedding)
        return {
            name: head(h).view(shape)
            for name, shape, head in zip(self.names, self.shapes, self.heads, strict=True)
        }
