"""The registry of privacy mechanisms, and the classic Gaussian-mechanism calibration.

Each mechanism is one file in flcore/privacy and registers itself here:

- ``dpsgd`` (dpsgd.py): per-sample clipping plus Gaussian noise in local training (record-level);
- ``client`` (client_level.py): client-update clipping plus server noise (client-level);
- ``gaussian`` (gaussian.py): the Gaussian mechanism on a bounded statistic (FedHKD);
- ``perturbation`` (perturbation.py): clipped-update perturbation (LoDMeta).

A mechanism is applied by an algorithm as a hook or a wrapper (never a copy of the algorithm),
and every release it makes is composed by an :class:`~flcore.privacy.accounting.Accountant`.
"""

from __future__ import annotations

import math

from flcore.errors import ConfigError
from flcore.privacy.accounting import check_delta, check_epsilon
from flcore.registry import Registry

__all__ = ["MECHANISMS", "check_noise_and_clip", "classic_gaussian_multiplier"]

MECHANISMS: Registry[type] = Registry("privacy mechanism")


def check_noise_and_clip(noise_multiplier: float, clip: float) -> None:
    """The checks every mechanism makes of its two knobs, with the config keys they come from."""
    if noise_multiplier < 0 or math.isnan(noise_multiplier):
        raise ConfigError("privacy.noise_multiplier", f"must be >= 0, got {noise_multiplier}")
    if not clip > 0:
        raise ConfigError("privacy.clip", f"must be > 0, got {clip}")


def classic_gaussian_multiplier(epsilon: float, delta: float) -> float:
    """``sqrt(2 ln(1.25/delta)) / epsilon``: the classic Gaussian mechanism's noise, in units of
    the L2 sensitivity, for ONE (epsilon, delta)-DP release (Dwork & Roth 2014, Theorem A.1).

    The theorem holds only for ``epsilon < 1``; outside it this raises. A release repeated every
    round is not ``rounds x epsilon``: compose the releases with an accountant instead.
    """
    check_epsilon(epsilon)
    check_delta(delta)
    if epsilon >= 1:
        raise ConfigError(
            "epsilon",
            f"the classic Gaussian mechanism bound holds only for epsilon < 1, got {epsilon}; "
            "give a noise multiplier and let the accountant report epsilon",
        )
    return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
