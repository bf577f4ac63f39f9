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
        head_init_scale: multiplies the heads' default (PyTorch ``nn.Linear``) initial weights
            and biases; 1 is the authors' code. With 1, HyperFL's FMNIST extractor comes out
            with weights of std ~0.2, a first loss in the tens, and the body's ReLUs die in
            round 1 (see HyperFL's module docstring); 0.1 keeps them alive.
    """

    def __init__(
        self,
        target_shapes: Mapping[str, torch.Size | tuple[int, ...]],
        *,
        embed_dim: int = 64,
        hidden_dim: int = 128,
        depth: int = 1,
        head_init_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        if not head_init_scale > 0:
            raise ValueError(f"head_init_scale must be > 0, got {head_init_scale}")
        self.names = list(target_shapes)
        self.shapes = [torch.Size(s) for s in target_shapes.values()]
        layers: list[nn.Module] = []
        d = embed_dim
        for _ in range(depth):
            layers += [nn.Linear(d, hidden_dim), nn.ReLU()]
            d = hidden_dim
        self.body = nn.Sequential(*layers)
        self.heads = nn.ModuleList(nn.Linear(hidden_dim, s.numel()) for s in self.shapes)
        if head_init_scale != 1.0:
            with torch.no_grad():
                for head in self.heads:
                    head.weight.mul_(head_init_scale)
                    head.bias.mul_(head_init_scale)

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
