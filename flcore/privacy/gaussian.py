"""The Gaussian mechanism on a bounded statistic, as FedHKD uses it (Chen & Vikalo, "The Best of
Both Worlds: Accurate Global and Personalized Models through Federated Learning with
Data-Free Hyper-Knowledge Distillation", ICLR 2023; Theorem 1 and Lemma 1).

A client releases, for each class j, the mean of its representations of class j. Each
representation is first clipped to L2 norm ``zeta``, so replacing one record of class j moves
that class mean by at most ``2 zeta / N_j`` (``N_j``: the client's records of class j; the
sensitivity of Lemma 1). Gaussian noise of std ``sigma x 2 zeta / N_j`` is added to class j's
mean. One record touches one class mean, so the whole release is one Gaussian mechanism with
noise multiplier ``sigma`` and the accountant composes it once per release (``q = 1``).

``norm: coordinate`` is the paper's own bound: each coordinate of a representation is clamped to
``[-zeta, zeta]`` (Lemma 1 bounds ``|h(l)|`` per coordinate) and each coordinate of class j's
mean gets noise of std ``sigma x 2 zeta / N_j``, exactly the paper's noise. The L2 sensitivity
of the d-dimensional mean is then ``2 zeta sqrt(d) / N_j``, so the release is a Gaussian
mechanism with noise multiplier ``sigma / sqrt(d)`` (:meth:`GaussianMechanism.
accounted_multiplier`): that is what the paper's noise buys for the whole vector.

:meth:`GaussianMechanism.release_sums` is the add/remove form (FedHKD's ``privacy.protect:
knowledge+model``): it releases per-class SUMS of the clipped statistic, each with noise of std
``sigma x zeta`` (adding or removing one record moves one class sum by at most ``zeta`` in L2:
one Gaussian mechanism at noise multiplier ``sigma``, or ``sigma / sqrt(d)`` for ``coordinate``);
counts and means are then post-processing of noised sums (counts are the class sums of one-hot
rows, ``zeta = 1``).

Deviation, stated: the neighbouring relation replaces one record by another of the same class,
so the counts ``N_j`` are treated as public. That relation is ours: FedHKD's proof of Lemma 1
(Appendix A.5) removes one record of the class (add/remove), which changes the count ``N_j``
that the paper releases in the clear; its sensitivity ``2 zeta / N_j`` holds under ours too.
FedHKD sets sigma with the classic formula
(:func:`~flcore.privacy.mechanisms.classic_gaussian_multiplier`), valid for one release at
epsilon < 1; we compose the per-round releases with the accountant instead of summing
per-round epsilons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from flcore.privacy.mechanisms import MECHANISMS, check_noise_and_clip

__all__ = ["GaussianMechanism", "clip_rows", "clamp_coordinates", "class_means", "class_sums"]


def clip_rows(x: torch.Tensor, bound: float) -> torch.Tensor:
    """Scale each row of ``x`` (flattened from dim 1) to L2 norm at most ``bound``."""
    norms = x.flatten(1).norm(dim=1)
    factor = (bound / (norms + 1e-12)).clamp(max=1.0)
    return x * factor.view(-1, *([1] * (x.dim() - 1)))


def clamp_coordinates(x: torch.Tensor, bound: float) -> torch.Tensor:
    """Clamp every coordinate of ``x`` to ``[-bound, bound]``."""
    return x.clamp(-bound, bound)


def class_sums(x: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per-class sums of the rows of ``x`` (zeros for a class without records)."""
    sums = torch.zeros(num_classes, *x.shape[1:], dtype=x.dtype, device=x.device)
    sums.index_add_(0, labels, x)
    return sums


def class_means(
    x: torch.Tensor, labels: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class means of the rows of ``x`` and the per-class counts (a class without records
    has a zero mean and count 0)."""
    counts = torch.bincount(labels, minlength=num_classes)
    sums = class_sums(x, labels, num_classes)
    shape = (-1,) + (1,) * (x.dim() - 1)
    return sums / counts.clamp(min=1).view(shape).to(x.dtype), counts


@MECHANISMS.register("gaussian")
@dataclass(frozen=True)
class GaussianMechanism:
    """Clipped class means plus Gaussian noise scaled to each class's sensitivity.

    Args:
        noise_multiplier: sigma, the noise std in units of the per-coordinate sensitivity
            ``2 zeta / N_j`` (for ``norm: l2`` that is the L2 sensitivity too).
        clip: zeta, the bound each record's statistic is clipped to.
        norm: ``l2`` (each row clipped to L2 norm zeta) or ``coordinate`` (each coordinate
            clamped to ``[-zeta, zeta]``, the paper's bound).
    """

    noise_multiplier: float
    clip: float
    norm: Literal["l2", "coordinate"] = "l2"

    def __post_init__(self) -> None:
        check_noise_and_clip(self.noise_multiplier, self.clip)
        if self.norm not in ("l2", "coordinate"):
            raise ValueError(f"norm must be 'l2' or 'coordinate', got {self.norm!r}")

    def accounted_multiplier(self, dim: int) -> float:
        """The noise multiplier relative to the release's L2 sensitivity, what an accountant
        composes: sigma for ``l2``; ``sigma / sqrt(dim)`` for ``coordinate`` (the L2
        sensitivity of a ``dim``-coordinate mean is ``sqrt(dim)`` times the per-coordinate one)."""
        if self.norm == "l2":
            return self.noise_multiplier
        return self.noise_multiplier / math.sqrt(dim)

    def bound(self, x: torch.Tensor) -> torch.Tensor:
        """Each record's statistic clipped as ``norm`` says."""
        return clip_rows(x, self.clip) if self.norm == "l2" else clamp_coordinates(x, self.clip)

    def sensitivity(self, counts: torch.Tensor) -> torch.Tensor:
        """``2 zeta / N_j`` per class (0 where a class has no record: nothing is released); for
        ``norm: coordinate`` this is the per-coordinate sensitivity."""
        c = counts.to(torch.float64)
        return torch.where(c > 0, 2.0 * self.clip / c.clamp(min=1), torch.zeros_like(c))

    def release(
        self,
        x: torch.Tensor,
        labels: torch.Tensor,
        num_classes: int,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The noised class means of clipped ``x`` and the counts. Classes the client lacks come
        back as zeros with count 0, so the receiver can skip them."""
        means, counts = class_means(self.bound(x), labels, num_classes)
        std = (self.noise_multiplier * self.sensitivity(counts)).to(x.dtype)
        noise = torch.normal(0.0, 1.0, size=means.shape, generator=generator).to(means)
        shape = (-1,) + (1,) * (means.dim() - 1)
        present = (counts > 0).view(shape)
        return torch.where(present, means + noise * std.view(shape), 0.0), counts

    def release_sums(
        self,
        x: torch.Tensor,
        labels: torch.Tensor,
        num_classes: int,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """The per-class sums of clipped ``x``, each coordinate with noise of std ``sigma x
        zeta``: the add/remove release (module docstring). Every class gets noise, also one
        the client lacks, so the output's shape and noise reveal nothing of which it holds."""
        sums = class_sums(self.bound(x), labels, num_classes)
        noise = torch.normal(0.0, 1.0, size=sums.shape, generator=generator).to(sums)
        return sums + noise * (self.noise_multiplier * self.clip)
