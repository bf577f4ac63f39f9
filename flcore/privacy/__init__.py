"""Differential privacy: mechanisms as hooks and wrappers any algorithm can use (one file each,
found through :data:`MECHANISMS`), and accounting through Opacus / dp-accounting (no RDP math of
our own)."""

from __future__ import annotations

from flcore.privacy.accounting import Accountant, calibrate_noise, compute_epsilon
from flcore.privacy.client_level import ClientLevelDP
from flcore.privacy.dpsgd import DPSGD, clip_per_sample, per_sample_gradients
from flcore.privacy.gaussian import GaussianMechanism
from flcore.privacy.isrl import PerClientAccounting
from flcore.privacy.mechanisms import MECHANISMS, classic_gaussian_multiplier
from flcore.privacy.perturbation import ParameterPerturbation, network_dp_epsilon
from flcore.privacy.settings import PrivacySettings

__all__ = [
    "MECHANISMS",
    "Accountant",
    "ClientLevelDP",
    "DPSGD",
    "GaussianMechanism",
    "ParameterPerturbation",
    "PerClientAccounting",
    "PrivacySettings",
    "calibrate_noise",
    "classic_gaussian_multiplier",
    "clip_per_sample",
    "compute_epsilon",
    "network_dp_epsilon",
    "per_sample_gradients",
]
