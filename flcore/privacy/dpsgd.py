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
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from flcore.privacy.mechanisms import MECHANISMS, check_noise_and_clip

__all__ = ["DPSGD", "per_sample_gradients", "clip_per_sample"]


def per_sample_gradients(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Gradients of each sample's cross-entropy, stacked on dim 0 (one vmap pass)."""
    params = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
    frozen = {k: p.detach() for k, p in model.named_parameters() if not p.requires_grad}
    buffers = dict(model.named_buffers())

    def loss_one(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, frozen, buffers), (xi.unsqueeze(0),))
        return F.cross_entropy(out, yi.unsqueeze(0))

    return vmap(grad(loss_one), in_dims=(None, 0, 0))(params, x, y)


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

            if loss_fn is not cross_entropy:
                # per-sample gradients here are of the cross-entropy: another objective's extra
                # terms would be silently dropped from the private step
                raise NotImplementedError(
                    "DP-SGD clips per-sample gradients of the cross-entropy only; this "
                    f"algorithm trains another objective ({getattr(loss_fn, '__name__', loss_fn)})"
                )
            named = [(k, p) for k, p in model.named_parameters() if p.requires_grad]
            if len(y):
                summed = clip_per_sample(per_sample_gradients(model, x, y), self.clip)
                with torch.no_grad():
                    loss = F.cross_entropy(model(x), y)
            else:
                summed = {k: torch.zeros_like(p) for k, p in named}
                loss = torch.zeros(())
            for k, p in named:
                # Drawn even when std is 0, so sigma changes the noise and nothing else.
                noise = torch.normal(0.0, std, size=p.shape, generator=generator)
                p.grad = (summed[k] + noise.to(p.device)) / expected
            return loss.detach()

        return backward
