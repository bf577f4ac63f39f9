"""Resolved privacy settings, as the algorithms receive them (noise multiplier already known),
and the neighbouring relation each mechanism's epsilon is stated under."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from flcore.privacy.accounting import RELATIONS

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
    client_sampling: how client-level DP samples the clients of a round: ``poisson`` (each
        with probability ``client_fraction``, add/remove) or ``fixed`` (``m`` of them without
        replacement, replace-one). Ignored by the other mechanisms.
    protect: ``model`` (the mechanism protects what it protects) or ``knowledge+model``
        (FedHKD: DP-SGD on local training and the class statistics released as noised
        sums, all composed into each client's accountant under add/remove).
    """

    mechanism: Mechanism
    noise_multiplier: float
    clip: float
    delta: float
    accountant: str = "rdp"
    target_epsilon: float | None = None
    client_sampling: str = "poisson"
    protect: str = "model"
    #: delta >= 1 / (the units one party protects: records a client trains on, or clients for
    #: client-level DP): such a delta permits releasing one outright, so the run has no
    #: meaningful guarantee (``dp_guarantee: weak-delta``, epsilon inf on the fronts)
    weak_delta: bool = False

    @property
    def relation(self) -> str:
        """``add-remove`` or ``replace-one``: the neighbouring relation of this run's epsilon.

        DP-SGD's Poisson record sampling is accounted add/remove; client-level DP follows its
        sampling scheme; the Gaussian mechanism on class means (FedHKD) and LoDMeta's
        perturbation bound their sensitivity under replacement of one record / one client's
        data (``2 zeta / N_j``, ``2 M_meta``), so their epsilon is replace-one.
        """
        if self.mechanism == "dpsgd":
            return "add-remove"
        if self.mechanism == "client":
            return RELATIONS[self.client_sampling]
        return "replace-one"
