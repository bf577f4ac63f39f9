"""Pa3dFL's Table 1 baselines: FLANC, Ditto and LG-FedAvg.

Pa3dFL (Wang et al., Appendix D.3) tunes every method's learning rate on one grid and each
method's own coefficient on another; these spaces are those grids (categorical, as the paper
searched them), with its FMNIST optima (Table 7) inside:

| key | values | why |
|---|---|---|
| ``lr`` | 0.005, 0.01, 0.05, 0.1 | the paper's grid (Table 7: FLANC, LG-FedAvg 0.1; Ditto 0.05) |
| ``algorithm_params.lam`` (FLANC) | 0.01, 0.1, 1.0 | orthogonality weight (Table 7: 1.0) |
| ``algorithm_params.lam`` (Ditto) | 0.01, 0.1, 1.0 | proximal weight (Table 7: 1.0) |

Local epochs (5), batch size (50) and the lr decay (0.998) are fixed by the paper for all
methods, so they are not searched.
"""

from __future__ import annotations

from typing import Any

from search_spaces.base import SPACES, param_name

__all__ = ["flanc_space", "ditto_space", "lg_fedavg_space"]

LRS = [0.005, 0.01, 0.05, 0.1]
LAMBDAS = [0.01, 0.1, 1.0]


@SPACES.register("flanc")
def flanc_space(trial: Any, algorithm: str = "flanc") -> None:
    """FLANC: learning rate and the orthogonality regulariser's lambda."""
    trial.suggest_categorical(param_name(algorithm, "lr"), LRS)
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.lam"), LAMBDAS)


@SPACES.register("ditto")
def ditto_space(trial: Any, algorithm: str = "ditto") -> None:
    """Ditto: learning rate and the personal objective's lambda."""
    trial.suggest_categorical(param_name(algorithm, "lr"), LRS)
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.lam"), LAMBDAS)


@SPACES.register("lg_fedavg")
def lg_fedavg_space(trial: Any, algorithm: str = "lg_fedavg") -> None:
    """LG-FedAvg: learning rate."""
    trial.suggest_categorical(param_name(algorithm, "lr"), LRS)
