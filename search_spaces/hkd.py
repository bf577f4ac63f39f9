"""FedHKD and FedHKD*: the privacy knob (the knowledge noise sigma) and the distillation weights.

FedHKD's paper (Chen & Vikalo, ICLR 2023, Appendix A.1) fixes lambda = gamma = 0.05, T = 0.5,
nu = 0.25, sigma = 7 and Adam at lr 1e-3; these grids put those values in the middle:

| key | values | why |
|---|---|---|
| ``lr`` | 3e-4, 1e-3, 3e-3 | Adam's step around the paper's 1e-3 |
| ``algorithm_params.sigma`` | 0, 2, 7, 20 | knowledge noise: none, the paper's 7, 20 |
| ``algorithm_params.lam`` | 0.01, 0.05, 0.2 | the soft-prediction term around 0.05 |
| ``algorithm_params.gamma`` (FedHKD) | 0.01, 0.05, 0.2 | the representation term around 0.05 |
| ``algorithm_params.nu`` | 0.1, 0.25 | sharing threshold (0.25: little passes at beta 5) |

sigma is the privacy axis of a front, but a FedHKD run's ``epsilon`` is inf whatever sigma is
(its model and soft predictions are released without noise): sigma moves only
``epsilon_knowledge`` and the measured leakage (``knowledge_inversion``).

``fedhkd_dp`` (FedHKD under ``privacy.protect: knowledge+model``, a finite ``epsilon``) adds
DP-SGD's knobs and keeps sigma > 0 (the knowledge must be noised). The knowledge releases are
composed into the run's epsilon, so sigma and the target are chosen so that every pair can be met
over the configs' 50 rounds: the paper's sigma 7 alone spends epsilon 9.12 at delta 1e-5 (9.97 at
1e-6), sigma 14 spends 4.06 (4.49), 20 spends 2.71 (3.02), 40 spends 1.26 (1.42); DP-SGD is
calibrated for the rest (tests/unit/test_shipped_privacy.py builds each corner):

| key | values | why |
|---|---|---|
| ``algorithm_params.sigma`` | 14, 20, 40 | knowledge noise (3 releases a round: sigma / sqrt 3) |
| ``privacy.target_epsilon`` | 5 .. 32, log | the whole run's, knowledge releases counted |
| ``privacy.delta`` | 1e-6, 1e-5 | as the DP baselines (search_spaces/dp.py) |
| ``privacy.clip`` | 0.1 .. 10, log | per-sample clip of CE + the representation term |
"""

from __future__ import annotations

from typing import Any

from search_spaces.base import SPACES, param_name

__all__ = [
    "DP_DELTAS",
    "DP_SIGMAS",
    "DP_TARGETS",
    "fedhkd_dp_space",
    "fedhkd_space",
    "fedhkd_star_space",
]

#: fedhkd_dp's knowledge noises, target-epsilon range and deltas: every pair is reachable
DP_SIGMAS = (14.0, 20.0, 40.0)
DP_TARGETS = (5.0, 32.0)
DP_DELTAS = (1e-6, 1e-5)


def _common(trial: Any, algorithm: str, sigmas: tuple[float, ...] = (0.0, 2.0, 7.0, 20.0)) -> None:
    trial.suggest_categorical(param_name(algorithm, "lr"), [3e-4, 1e-3, 3e-3])
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.sigma"), list(sigmas))
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.lam"), [0.01, 0.05, 0.2])
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.nu"), [0.1, 0.25])


@SPACES.register("fedhkd")
def fedhkd_space(trial: Any, algorithm: str = "fedhkd") -> None:
    """FedHKD: lr, knowledge noise, both distillation weights, the sharing threshold."""
    _common(trial, algorithm)
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.gamma"), [0.01, 0.05, 0.2])


@SPACES.register("fedhkd_star")
def fedhkd_star_space(trial: Any, algorithm: str = "fedhkd_star") -> None:
    """FedHKD*: as FedHKD with gamma fixed at 0."""
    _common(trial, algorithm)


@SPACES.register("fedhkd_dp")
def fedhkd_dp_space(trial: Any, algorithm: str = "fedhkd_dp") -> None:
    """FedHKD with its knowledge and model protected: FedHKD's knobs (sigma > 0) plus the
    run's target epsilon, delta and per-sample clip."""
    _common(trial, algorithm, DP_SIGMAS)
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.gamma"), [0.01, 0.05, 0.2])
    trial.suggest_categorical(param_name(algorithm, "privacy.mechanism"), ["dpsgd"])
    trial.suggest_categorical(param_name(algorithm, "privacy.protect"), ["knowledge+model"])
    trial.suggest_float(param_name(algorithm, "privacy.target_epsilon"), *DP_TARGETS, log=True)
    trial.suggest_categorical(param_name(algorithm, "privacy.delta"), list(DP_DELTAS))
    trial.suggest_float(param_name(algorithm, "privacy.clip"), 0.1, 10.0, log=True)
