"""DP-SGD (Abadi et al., "Deep Learning with Differential Privacy", CCS 2016) as hooks of the
shared training loop, so any algorithm's local training can use it.

Each step samples every record independently with probability ``q = B / n`` (Poisson
subsampling, the scheme the RDP/PRV/PLD accountants assume), computes per-sample gradients in one
vectorised pass (``torch.func.vmap`` over ``grad``, no Python loop over samples), clips each to
L2 norm ``C`` over all trainable parameters, sums, adds ``N(0, sigma^2 C^2)`` per coordinate and
divides by the expected batch size ``q n`` (as Opacus does for Poisson sampling). Momentum and
weight decay act on that private gradient: post-processing. Noise comes from the client's own
generator, so runs stay bitwise repeatable.

An epoch is ``ceil(n / B)`` steps, the count the accountant composes.

The objective is the cross-entropy, or a :class:`SplitObjective` that says which of its terms
read a record: each record's own terms (``per_record``) are differentiated per sample and
clipped with it; the terms that read no record (``record_free``: a distillation target the
server sent, say) are differentiated once and added to the noised gradient, which is
post-processing. Any other objective is refused: its extra terms would vanish silently from the
private step.

BatchNorm layers are held in eval mode during a DP-SGD step (their running statistics stay as
they are): batch statistics make one record's gradient depend on the others, so per-sample
clipping would bound nothing, and running statistics computed from the records would leave the
client with the model, unnoised. Opacus refuses BatchNorm for the same reasons.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from flcore.privacy.mechanisms import MECHANISMS, check_noise_and_clip

__all__ = [
    "DPSGD",
    "SplitObjective",
    "clip_per_sample",
    "freeze_batchnorm",
    "per_sample_gradients",
]

PerRecordLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


@dataclass(frozen=True)
class SplitObjective:
    """A local objective split by what each term reads, so DP-SGD can privatise it.

    Args:
        per_record: ``(model, x, y) -> losses`` of shape ``[B]``, where record k's loss reads
            record k alone (it is evaluated on one record at a time under DP-SGD, so it must
            not index by data-dependent masks).
        record_free: ``model -> scalar``, the terms that read no record, or None.

    Called as a loss it is ``per_record(...).mean() + record_free(model)``.
    """

    per_record: PerRecordLoss
    record_free: Callable[[nn.Module], torch.Tensor] | None = None

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = self.per_record(model, x, y).mean()
        return loss if self.record_free is None else loss + self.record_free(model)


def _cross_entropy_each(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y, reduction="none")


class _Bound(nn.Module):
    """``per_record`` as a module, so ``functional_call`` can swap the model's parameters."""

    def __init__(self, model: nn.Module, fn: PerRecordLoss) -> None:
        super().__init__()
        self.model, self.fn = model, fn

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fn(self.model, x, y)


def per_sample_gradients(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    per_record: PerRecordLoss | None = None,
) -> dict[str, torch.Tensor]:
    """Gradients of each sample's loss (default: its cross-entropy), stacked on dim 0 (one
    vmap pass)."""
    params = {f"model.{k}": p.detach() for k, p in model.named_parameters() if p.requires_grad}
    frozen = {f"model.{k}": p.detach() for k, p in model.named_parameters() if not p.requires_grad}
    buffers = {f"model.{k}": b for k, b in model.named_buffers()}
    bound = _Bound(model, per_record or _cross_entropy_each)

    def loss_one(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(bound, (p, frozen, buffers), (xi.unsqueeze(0), yi.unsqueeze(0)))
        return out.sum()

    grads = vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)
    return {k.removeprefix("model."): g for k, g in grads.items()}


def freeze_batchnorm(model: nn.Module) -> None:
    """Put every BatchNorm layer of ``model`` in eval mode (module docstring)."""
    for m in model.modules():
        if isinstance(m, _BATCHNORMS):
            m.eval()


def clip_per_sample(grads: dict[str, torch.Tensor], clip: float) -> dict[str, torch.Tensor]:
    """Scale each sample's gradient to L2 norm at most ``clip``; returns the clipped sum."""
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
    factor = (clip / (norms + 1e-12)).clamp(max=1.0)
    return {k: torch.einsum("b,b...->...", factor, g) for k, g in grads.items()}


@MECHANISMS.register("dpsgd")
@dataclass(frozen=True)
class DPSGD:
    """The DP-SGD hooks for :func:`flcore.algorithms.training.train_epochs`.

    Args:
        noise_multiplier: sigma (noise std / clip).
        clip: per-sample L2 clipping norm C.
        batch_size: expected batch size B (sample rate ``B / n``).
    """

    noise_multiplier: float
    clip: float
    batch_size: int

    def __post_init__(self) -> None:
        check_noise_and_clip(self.noise_multiplier, self.clip)

    def sample_rate(self, n: int) -> float:
        return min(1.0, self.batch_size / n)

    def steps_per_epoch(self, n: int) -> int:
        return math.ceil(n / self.batch_size)

    def batches(
        self, n: int, batch_size: int, generator: torch.Generator
    ) -> Iterator[torch.Tensor]:
        """One epoch of Poisson-sampled index batches (sizes vary; a batch may be empty)."""
        q = self.sample_rate(n)
        for _ in range(self.steps_per_epoch(n)):
            mask = torch.rand(n, generator=generator) < q
            yield mask.nonzero().flatten()

    def make_backward(self, n: int, generator: torch.Generator):  # type: ignore[no-untyped-def]
        """The ``backward`` hook: fills ``.grad`` with the clipped, noised, averaged gradient."""
        expected = self.sample_rate(n) * n
        std = self.noise_multiplier * self.clip

        def backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn) -> torch.Tensor:  # type: ignore[no-untyped-def]
            from flcore.algorithms.training import cross_entropy

            if loss_fn is cross_entropy:
                per_record, record_free = None, None
            elif isinstance(loss_fn, SplitObjective):
                per_record, record_free = loss_fn.per_record, loss_fn.record_free
            else:
                # per-sample gradients are of the cross-entropy unless the objective says
                # which terms read a record: another objective's extra terms would be
                # silently dropped from the private step
                raise NotImplementedError(
                    "DP-SGD clips per-sample gradients of the cross-entropy only, or of a "
                    "SplitObjective's per-record terms; this algorithm trains another "
                    f"objective ({getattr(loss_fn, '__name__', loss_fn)})"
                )
            freeze_batchnorm(model)
            named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
            if len(y):
                grads = per_sample_gradients(model, x, y, per_record)
                summed = clip_per_sample(grads, self.clip)
                with torch.no_grad():
                    loss = loss_fn(model, x, y)
            else:
                summed = {k: torch.zeros_like(p) for k, p in named}
                loss = torch.zeros(())
            for k, p in named:
                # Drawn even when std is 0, so sigma changes the noise and nothing else.
                noise = torch.normal(0.0, std, size=p.shape, generator=generator)
                p.grad = (summed[k] + noise.to(p.device)) / expected
            if record_free is not None:
                free = torch.autograd.grad(
                    record_free(model), [p for _, p in named], allow_unused=True
                )
                for (_, p), g in zip(named, free, strict=True):
                    if g is not None:
                        p.grad.add_(g)  # type: ignore[union-attr]
            return loss.detach()

        return backward
