"""Streaming weighted aggregation: one running sum, never N client copies in memory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch

__all__ = ["PrototypeMean", "WeightedMean"]


class WeightedMean:
    """Accumulates ``sum_i w_i x_i / sum_i w_i`` over dicts of tensors, one client at a time.

    Sums are kept in float64 so the result does not depend on how many clients were folded in
    before rounding; the mean is cast back to each tensor's own dtype. Clients must be added in a
    fixed order (the engine uses client-id order) for bitwise-repeatable results.
    """

    def __init__(self) -> None:
        self._sum: dict[str, torch.Tensor] = {}
        self._dtypes: dict[str, torch.dtype] = {}
        self.total_weight = 0.0
        self.count = 0

    def add(self, tensors: Mapping[str, torch.Tensor], weight: float) -> None:
        """Add one client's tensors with weight ``weight`` (> 0)."""
        if weight <= 0:
            raise ValueError(f"aggregation weight must be > 0, got {weight}")
        if self._sum and set(tensors) != set(self._sum):
            raise ValueError(
                f"clients uploaded different tensor names: {sorted(set(tensors) ^ set(self._sum))}"
            )
        for key, value in tensors.items():
            v = value.detach().to(torch.float64)
            if key in self._sum:
                self._sum[key].add_(v, alpha=weight)
            else:
                self._sum[key] = v.mul(weight)
                self._dtypes[key] = value.dtype
        self.total_weight += weight
        self.count += 1

    def result(self) -> dict[str, torch.Tensor]:
        """The weighted mean; raises if nothing was added."""
        if not self.count:
            raise ValueError("no client was aggregated this round")
        return {k: (s / self.total_weight).to(self._dtypes[k]) for k, s in self._sum.items()}


class PrototypeMean:
    """Streams ``sum_i w_i^j C_i^j / sum_i w_i^j`` per class over clients' knowledge uploads;
    ``w_i^j = N_i^j`` (``count``) or 1 (``mean``) where client i shares class j, else 0."""

    def __init__(self, weighting: Literal["count", "mean"]) -> None:
        self.weighting = weighting
        self._sum: torch.Tensor | None = None
        self._weight: torch.Tensor | None = None

    def add(self, rep: torch.Tensor, mask: torch.Tensor, counts: torch.Tensor) -> None:
        shared = (mask > 0) & (counts > 0)
        w = counts.double() if self.weighting == "count" else torch.ones_like(counts.double())
        w = torch.where(shared, w, torch.zeros_like(w))
        part = rep.double() * w.unsqueeze(1)
        if self._sum is None or self._weight is None:
            self._sum, self._weight = part, w
        else:
            self._sum, self._weight = self._sum + part, self._weight + w

    def result(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(prototypes [K, d], mask [K])`` float32, zero rows where no client shared the
        class; None when nothing was added."""
        if self._sum is None or self._weight is None:
            return None
        held = self._weight > 0
        protos = self._sum / self._weight.clamp(min=1e-300).unsqueeze(1)
        protos = torch.where(held.unsqueeze(1), protos, torch.zeros_like(protos))
        return protos.float(), held.float()
