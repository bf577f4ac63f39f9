"""Differential privacy: mechanisms as hooks and wrappers any algorithm can use, and accounting
through Opacus / dp-accounting (no RDP math of our own)."""

from __future__ import annotations

from flcore.privacy.accounting import Accountant, calibrate_noise, compute_epsilon
from flcore.privacy.client_level import ClientLevelDP
from flcore.privacy.dpsgd import DPSGD, clip_per_sample, per_sample_gradients
from flcore.privacy.isrl import PerClientAccounting
from flcore.privacy.settings import PrivacySettings

__all__ = [
    "Accountant",
    "ClientLevelDP",
    "DPSGD",
    "PerClientAccounting",
    "PrivacySettings",
    "calibrate_noise",
    "clip_per_sample",
    "compute_epsilon",
    "per_sample_gradients",
]
