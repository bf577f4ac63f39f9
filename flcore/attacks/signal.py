"""Does an upload carry any gradient of its record? The float32 rounding floor.

An uploaded float32 weight ``u = w - step * g`` is rounded to the nearest float32: its error is
uniform within half an ulp of ``w``, variance ``ulp(w)^2 / 12``, independently per weight, and
``w - u`` is then exact. The gradient a server reads out of the upload (``(w - u) / step``,
:meth:`~flcore.attacks.surface.GradientSurface.pseudo_gradient`) therefore carries rounding
noise of norm about ``sqrt(sum ulp^2 / 12) / step`` whatever the record: the *rounding floor*.
An upload whose implied gradient is no larger than that carries no signal of its record (the
model already fits it: BENCHMARKS.md's Table 3 per-record check found such uploads for pFedHN
and HyperFL); no attack can recover anything from it, and averaging it in as "privacy" would
flatter the algorithm.

The decision is made on the *noise-free* replay of the upload (the same update with the DP
noise multiplier set to 0, the same clipping and sampling): a DP upload's noise alone has a
norm of about 145 at sigma 10.6 and would otherwise always count as informative. An upload is
informative when its implied gradient exceeds :data:`INFORMATIVE_FACTOR` times the floor: the
rounding noise's norm concentrates tightly at the floor (a sum over 100k+ weights), and a
record's own gradient ``g`` gives ``sqrt(|g|^2 + floor^2)``, so a factor of 2 counts records
whose gradient exceeds about 1.7 floors (BENCHMARKS' weakest recovered FedAvg record carried
4 floors; the no-gradient ones read 0.998 floors).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from flcore.attacks.surface import GradientSurface

__all__ = ["INFORMATIVE_FACTOR", "implied_gradient_norm", "rounding_floor"]

#: an upload is informative when its noise-free implied gradient exceeds this many floors
INFORMATIVE_FACTOR = 2.0


def rounding_floor(start: Mapping[str, torch.Tensor], step: float) -> float:
    """The norm of the gradient an upload implies by float32 rounding alone (module doc):
    ``sqrt(sum ulp(w)^2 / 12) / step`` over the uploaded tensors' starting values ``start``,
    ``step`` being the learning rate times the local steps."""
    if not step > 0:
        raise ValueError(f"step must be > 0, got {step}")
    var = 0.0
    for w in start.values():
        a = w.detach().abs().float()
        ulp = torch.nextafter(a, torch.full_like(a, float("inf"))) - a
        var += float(ulp.double().pow(2).sum()) / 12
    return var**0.5 / step


def implied_gradient_norm(
    surface: GradientSurface, upload: Mapping[str, torch.Tensor], training: object, steps: int
) -> float:
    """The L2 norm, over every uploaded tensor the surface reads, of the gradient ``upload``
    implies (:meth:`GradientSurface.pseudo_gradient`)."""
    target = surface.pseudo_gradient(upload, training, steps)
    return float(sum(float(t.double().pow(2).sum()) for t in target.values())) ** 0.5
