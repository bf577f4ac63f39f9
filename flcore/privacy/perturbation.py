"""Parameter perturbation, as LoDMeta uses it (Algorithm 2, line 12; Theorem 4.5).

At each step of the random walk the active client clips its meta-gradient to L2 norm
``M_meta`` (the bound the paper's analysis assumes: its sensitivity is then ``2 M_meta``
under replacement of the client's data), folds it into its momentum, and adds Gaussian noise to
what it passes on. The paper writes the noise as variance

    sigma^2 = 8 M_meta^2 ln(1.25/delta) / epsilon^2,

which is the classic Gaussian mechanism at sensitivity ``2 M_meta``: a noise multiplier of
``sqrt(2 ln(1.25/delta)) / epsilon`` (valid for epsilon < 1, one release). Here the mechanism
takes that multiplier ``z`` and adds std ``z x 2 M_meta``; every release of a client is
composed by that client's accountant (``q = 1`` per release) rather than summed.

Theorem 4.5's network-DP epsilon', an amplification-by-decentralization bound for an observer
that is another client, is given by :func:`network_dp_epsilon` as a separate figure; it is
never what ``epsilon`` reports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from flcore.errors import ConfigError
from flcore.privacy.accounting import check_delta, check_epsilon
from flcore.privacy.mechanisms import (
    MECHANISMS,
    check_noise_and_clip,
    classic_gaussian_multiplier,
)

__all__ = ["ParameterPerturbation", "network_dp_epsilon"]


def _norm(tensors: Mapping[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(t.double().pow(2).sum() for t in tensors.values())))


@MECHANISMS.register("perturbation")
@dataclass(frozen=True)
class ParameterPerturbation:
    """Clip an update to ``clip`` (M_meta) and add ``N(0, (2 z M_meta)^2)`` per coordinate.

    Args:
        noise_multiplier: z, the noise std in units of the sensitivity ``2 M_meta``.
        clip: M_meta, the L2 bound of the clipped update.
    """

    noise_multiplier: float
    clip: float

    def __post_init__(self) -> None:
        check_noise_and_clip(self.noise_multiplier, self.clip)

    @classmethod
    def from_epsilon(cls, epsilon: float, delta: float, clip: float) -> ParameterPerturbation:
        """The paper's per-release setting: ``sigma^2 = 8 M^2 ln(1.25/delta) / epsilon^2``."""
        return cls(classic_gaussian_multiplier(epsilon, delta), clip)

    @property
    def std(self) -> float:
        """The noise std per coordinate: ``2 z M_meta``."""
        return 2.0 * self.noise_multiplier * self.clip

    def clip_update(self, update: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``update`` scaled to L2 norm at most ``clip`` (over all its tensors together)."""
        scale = min(1.0, self.clip / (_norm(update) + 1e-12))
        return {k: v * scale for k, v in update.items()}

    def perturb(
        self, update: Mapping[str, torch.Tensor], generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """``update`` plus the Gaussian perturbation (``update`` must already be clipped, or be
        a fixed combination of clipped updates such as LoDMeta's momentum)."""
        return {
            k: v + torch.normal(0.0, self.std, size=v.shape, generator=generator).to(v.dtype)
            for k, v in update.items()
        }


def network_dp_epsilon(
    epsilon: float, delta: float, *, steps: int, num_clients: int, delta_hat: float
) -> float:
    """LoDMeta's Theorem 4.5: the (epsilon', delta + delta_hat) network-DP of ``steps`` walk
    steps over ``num_clients`` clients when each release uses the per-release (epsilon, delta)
    noise of :meth:`ParameterPerturbation.from_epsilon`:

        epsilon' = sqrt(2 q ln(1/delta)) epsilon / sqrt(ln(1.25/delta)),
        q = max(2 N_u, 2 ln(1/delta)),  N_u = T/n + sqrt(3 T ln(1/delta_hat) / n).

    Stated for epsilon < 1 and delta < 1/2 (checked). It bounds what another client learns,
    not what the walk's every observer does: report it beside, never instead of, the
    accountant's epsilon.
    """
    check_epsilon(epsilon)
    check_delta(delta)
    check_delta(delta_hat, "delta_hat")
    if epsilon >= 1:
        raise ConfigError("epsilon", f"Theorem 4.5 needs epsilon < 1, got {epsilon}")
    if delta >= 0.5:
        raise ConfigError("delta", f"Theorem 4.5 needs delta < 1/2, got {delta}")
    if steps < 1 or num_clients < 1:
        raise ConfigError("steps", "steps and num_clients must be >= 1")
    n_u = steps / num_clients + math.sqrt(3.0 * steps * math.log(1.0 / delta_hat) / num_clients)
    q = max(2.0 * n_u, 2.0 * math.log(1.0 / delta))
    return math.sqrt(2.0 * q * math.log(1.0 / delta)) * epsilon / math.sqrt(math.log(1.25 / delta))
