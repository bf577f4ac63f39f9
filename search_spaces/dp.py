"""The DP baselines: DP-FedAvg record-level (ISRL-DP, ``dp_fedavg``) and client-level
(``dp_fedavg_client``), PPSGD and CENTAUR, each with the plain-FL utility knobs of
search_spaces/fedavg.py.

| key | range | why |
|---|---|---|
| ``privacy.target_epsilon`` | 0.5 .. 32, log | around HyperFL's epsilon = 4 (appendix D.1) |
| ``privacy.delta`` | 1e-6, 1e-5 | the paper's 1e-5, and a stricter one (< 1/n for 600 records) |
| ``privacy.clip`` (dpsgd) | 0.01 .. 1.0, log | the authors' code clips per sample at 0.04 |
| ``privacy.clip`` (client) | 0.1 .. 10, log | FMNIST CNN update norms after 5 epochs: O(1) |
| ``algorithm_params.alpha`` (ppsgd) | 0 .. 10 | local/global step ratio; 0: no personal part |
| ``algorithm_params.head_epochs`` (centaur) | 1 .. 5 | each head epoch is DP-SGD: costs epsilon |

The noise multiplier follows from the target epsilon by calibration before training (a target
that cannot be met with sigma <= max_noise_multiplier fails the trial's config). The default cap
of 1000 meets every corner of these spaces on the shipped configs (tests/unit/
test_shipped_privacy.py): the hardest, epsilon 0.5 at delta 1e-6 with 5 local epochs (CENTAUR:
and 5 head epochs, 24,000 DP-SGD steps) or client-level DP with every client every round, need
sigma 80-125, a point at the bottom of the front rather than a failed trial.
"""

from __future__ import annotations

from typing import Any

from search_spaces.base import SPACES, param_name
from search_spaces.fedavg import fedavg_space

__all__ = ["dp_fedavg_space", "dp_fedavg_client_space", "ppsgd_space", "centaur_space"]


def _privacy(trial: Any, algorithm: str, mechanism: str, clip: tuple[float, float]) -> None:
    trial.suggest_categorical(param_name(algorithm, "privacy.mechanism"), [mechanism])
    trial.suggest_float(param_name(algorithm, "privacy.target_epsilon"), 0.5, 32.0, log=True)
    trial.suggest_categorical(param_name(algorithm, "privacy.delta"), [1e-6, 1e-5])
    trial.suggest_float(param_name(algorithm, "privacy.clip"), *clip, log=True)


@SPACES.register("dp_fedavg")
def dp_fedavg_space(trial: Any, algorithm: str = "dp_fedavg") -> None:
    """ISRL-DP FedAvg: FedAvg's knobs plus target epsilon, delta, per-sample clip."""
    fedavg_space(trial, algorithm)
    _privacy(trial, algorithm, "dpsgd", (0.01, 1.0))


@SPACES.register("dp_fedavg_client")
def dp_fedavg_client_space(trial: Any, algorithm: str = "dp_fedavg_client") -> None:
    """Client-level DP FedAvg: FedAvg's knobs plus target epsilon, delta, update clip."""
    fedavg_space(trial, algorithm)
    _privacy(trial, algorithm, "client", (0.1, 10.0))


@SPACES.register("ppsgd")
def ppsgd_space(trial: Any, algorithm: str = "ppsgd") -> None:
    """PPSGD: DP-FedAvg's knobs plus the personalization ratio alpha."""
    dp_fedavg_space(trial, algorithm)
    trial.suggest_float(param_name(algorithm, "algorithm_params.alpha"), 0.0, 10.0)


@SPACES.register("centaur")
def centaur_space(trial: Any, algorithm: str = "centaur") -> None:
    """CENTAUR: DP-FedAvg's knobs plus the head epochs per round."""
    dp_fedavg_space(trial, algorithm)
    trial.suggest_int(param_name(algorithm, "algorithm_params.head_epochs"), 1, 5)
