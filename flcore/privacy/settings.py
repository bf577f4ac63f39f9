"""Resolved privacy settings, as the algorithms receive them (noise multiplier already known)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["PrivacySettings", "Mechanism"]

Mechanism = Literal["dpsgd", "client", "gaussian", "perturbation"]


@dataclass(frozen=True)
class PrivacySettings:
    """Args:
    mechanism: ``dpsgd`` (record-level, at each client: ISRL-DP) or ``client`` (client-level
        DP: update clipping at the client, Gaussian noise on the sum at the server).
    noise_multiplier: sigma.
    clip: the L2 clipping norm (per sample for dpsgd, per client update for client).
    delta: the delta epsilon is reported at.
    accountant: ``rdp``, ``prv`` or ``pld``.
    target_epsilon: the target sigma was calibrated for, if any (for the record).
    """

    mechanism: Mechanism
    noise_multiplier: float
    clip: float
    delta: float
    accountant: str = "rdp"
    target_epsilon: float | None = None
