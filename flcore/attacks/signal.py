"""Does an upload carry any gradient of its record? The record-free replay, and the float32
rounding floor.

**The decision** (:func:`carries_record`): an upload carries its record when it differs, in
what the attack reads of it (:meth:`~flcore.attacks.surface.GradientSurface.pseudo_gradient`),
from the *record-free* replay: the same local update, on the same records and random stream,
with every module's output passing no gradient back (:func:`record_free`: ``out.detach() + 0 *
out``, the same values, a zero gradient). What stays in the record-free upload is what no
record put there (weight decay, a proximal term, momentum from an earlier step, the rounding
of all of it), so any difference is the record's. This replaced a rule on the norm alone (an
upload was informative above twice the rounding floor below): HyperFL's Table 3 rerun found
uploads at 1.05 and 1.01 floors whose records IG still picked out of their decoys, because a
gradient under the floor is still a direction (BENCHMARKS.md, session 25).

**The floor** (:func:`rounding_floor`, kept as a diagnostic of how strong the signal is):
An uploaded float32 weight ``u = w - step * g`` is rounded to the nearest float32: its error is
uniform within half an ulp of ``w``, variance ``ulp(w)^2 / 12``, independently per weight, and
``w - u`` is then exact. The gradient a server reads out of the upload (``(w - u) / step``,
:meth:`~flcore.attacks.surface.GradientSurface.pseudo_gradient`) therefore carries rounding
noise of norm about ``sqrt(sum ulp^2 / 12) / step`` whatever the record: the *rounding floor*.
A record's own gradient ``g`` reads ``sqrt(|g|^2 + floor^2)``; an upload with no gradient of
its record reads the floor itself (0.998-1.003 floors measured).

Both are decided on the *noise-free* replay of a DP upload (the same update with the noise
multiplier set to 0, the same clipping and sampling): a DP upload's noise alone has a norm of
about 145 at sigma 10.6 and would always differ.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from flcore.attacks.surface import GradientSurface

__all__ = ["carries_record", "implied_gradient_norm", "record_free", "rounding_floor"]


def _no_gradient(out: Any) -> Any:
    """``out`` with the same values and a zero gradient (tensors inside tuples, lists, dicts)."""
    if isinstance(out, torch.Tensor):
        return out.detach() + 0 * out if out.requires_grad else out
    if isinstance(out, tuple):
        return (
            type(out)(*map(_no_gradient, out))
            if hasattr(out, "_fields")
            else tuple(map(_no_gradient, out))
        )
    if isinstance(out, list):
        return [_no_gradient(o) for o in out]
    if isinstance(out, dict):
        return {k: _no_gradient(v) for k, v in out.items()}
    return out


@contextlib.contextmanager
def record_free() -> Iterator[None]:
    """Within the block every ``nn.Module``'s output passes no gradient back (module doc): a
    local update run inside it is the update its records would give if they had no gradient."""
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: _no_gradient(out)
    )
    try:
        yield
    finally:
        handle.remove()


def carries_record(
    surface: GradientSurface,
    upload: Mapping[str, torch.Tensor],
    free: Mapping[str, torch.Tensor],
    training: object,
    steps: int,
) -> bool:
    """Whether ``upload`` differs from the record-free replay's ``free`` in what the attack
    reads (the surface's pseudo-gradient), in any element."""
    a = surface.pseudo_gradient(upload, training, steps)
    b = surface.pseudo_gradient(free, training, steps)
    return any(not torch.equal(a[k], b[k]) for k in a)


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
