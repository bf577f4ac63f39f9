"""Covering aggregation: the mean of each entry over only the clients that hold it.

When clients train parts of a full model (a narrower width, their own filters), client i
uploads sub-tensors of the full tensors, and every entry e of the full model becomes

    x_e = sum_{i holds e} w_i x_ie / sum_{i holds e} w_i

over the round's clients that hold it; an entry no client held keeps its previous value
(HeteroFL Sec. 3.1, FjORD Sec. 3, FedRolex Sec. 3, TailorFL's scaling-based aggregation,
LG-FedAvg's nested head).

Which entries a client holds is the caller's to say, as a plain index into each full tensor
(``full[index]`` is the block its upload fills, in the upload's order, each entry at most
once): the leading blocks of a nested model (:func:`flcore.algorithms.lg_fedavg.leading_index`)
or an outer product of kept channels per axis, nested, rolling or selected
(:func:`flcore.algorithms.widths.slicing.submodel_index`).

It streams: one float64 running sum and one running weight per entry, no list of uploads.
Clients are added in the engine's (client-id) order, so the result is bitwise repeatable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["CoverMean", "Index"]

#: an index into a full tensor selecting the entries a client holds (``full[index]``)
Index = tuple[Any, ...]

_WHOLE: Index = (Ellipsis,)


class CoverMean:
    """Streaming covering aggregation over the full model's entries (see the module doc).

    Args:
        reference: the full model's state (names, shapes, dtypes, device; and the values an
            entry no client holds keeps).
    """

    def __init__(self, reference: Mapping[str, torch.Tensor]) -> None:
        self._reference = {k: v.detach() for k, v in reference.items()}
        self._sum = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in reference.items()}
        self._weight = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in reference.items()}
        self.count = 0

    def add(
        self,
        upload: Mapping[str, torch.Tensor],
        index: Mapping[str, Index],
        weight: float = 1.0,
    ) -> None:
        """Fold in one client's ``upload`` at ``weight`` (> 0).

        Args:
            upload: one (sub)tensor per tensor of the reference, every tensor present.
            index: per key, the entries of the full tensor the upload holds; a key absent
                here holds the whole tensor.
            weight: the client's aggregation weight.

        Raises:
            ValueError: a weight <= 0, other tensor names than the reference's, or an
                upload whose shape is not that of its indexed block.
        """
        if weight <= 0:
            raise ValueError(f"aggregation weight must be > 0, got {weight}")
        if set(upload) != set(self._sum):
            raise ValueError(
                f"the upload does not match the model: {sorted(set(upload) ^ set(self._sum))}"
            )
        for key, value in upload.items():
            at = index.get(key, _WHOLE)
            total = self._sum[key]
            held = total[at]
            if held.shape != value.shape:
                raise ValueError(
                    f"upload {key!r} has shape {tuple(value.shape)}, "
                    f"its block of the model {tuple(held.shape)}"
                )
            total[at] = held + weight * value.detach().to(total.device, torch.float64)
            self._weight[key][at] += weight
        self.count += 1

    def result(self) -> dict[str, torch.Tensor]:
        """The held entries' means, each tensor in its reference dtype; entries no client
        held keep the reference value."""
        out = {}
        for key, ref in self._reference.items():
            w = self._weight[key]
            mean = self._sum[key] / w.clamp_min(1e-300)
            out[key] = torch.where(w > 0, mean, ref.to(torch.float64)).to(ref.dtype)
        return out
