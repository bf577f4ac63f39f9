"""The width-slicing family: HeteroFL, FjORD, FedRolex (Pa3dFL's capacity-aware baselines).

Pa3dFL (Wang et al., Appendix D, Table 7) tunes only the learning rate of these baselines, over
the grid {0.005, 0.01, 0.05, 0.1}, and picks 0.05 / 0.1 (HeteroFL) and 0.1 (FjORD, FedRolex);
the grid is searched here as a categorical, so a sweep can reproduce the paper's choice.

| key | range | why |
|---|---|---|
| ``lr`` | {0.005, 0.01, 0.05, 0.1} | Pa3dFL's grid (Table 7) |
| ``algorithm_params.distill_alpha`` (FjORD) | 0.0 .. 1.0 | distillation weight; 0: OD alone |
| ``algorithm_params.distill_temperature`` (FjORD) | 1 .. 4, log | usual distillation temperatures |

HeteroFL and FedRolex have no algorithm parameter. None of them has a privacy knob (no DP
mechanism: epsilon is inf).
"""

from __future__ import annotations

from typing import Any

from search_spaces.base import SPACES, param_name

__all__ = ["fedrolex_space", "fjord_space", "heterofl_space", "PA3DFL_LR_GRID"]

#: Pa3dFL's learning-rate grid (Appendix D, Table 7)
PA3DFL_LR_GRID = (0.005, 0.01, 0.05, 0.1)


def _lr(trial: Any, algorithm: str) -> None:
    trial.suggest_categorical(param_name(algorithm, "lr"), list(PA3DFL_LR_GRID))


@SPACES.register("heterofl")
def heterofl_space(trial: Any, algorithm: str = "heterofl") -> None:
    """HeteroFL: the learning rate on Pa3dFL's grid."""
    _lr(trial, algorithm)


@SPACES.register("fjord")
def fjord_space(trial: Any, algorithm: str = "fjord") -> None:
    """FjORD: the learning rate on Pa3dFL's grid, the self-distillation weight and temperature."""
    _lr(trial, algorithm)
    trial.suggest_float(param_name(algorithm, "algorithm_params.distill_alpha"), 0.0, 1.0)
    trial.suggest_float(
        param_name(algorithm, "algorithm_params.distill_temperature"), 1.0, 4.0, log=True
    )


@SPACES.register("fedrolex")
def fedrolex_space(trial: Any, algorithm: str = "fedrolex") -> None:
    """FedRolex: the learning rate on Pa3dFL's grid."""
    _lr(trial, algorithm)
