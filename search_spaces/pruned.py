"""The capacity-aware personalised-pruning family: TailorFL and pFedGate (Pa3dFL's Table 1
baselines with personalised submodels).

Pa3dFL (Wang et al., Appendix D) tunes every method's learning rate on the grid
{0.005, 0.01, 0.05, 0.1} (decayed by 0.998 per round) and each method's own knobs:

| algorithm | key | values |
|---|---|---|
| both | ``lr`` | 0.005, 0.01, 0.05, 0.1 |
| tailorfl | ``algorithm_params.reg`` | 0.05, 0.1, 0.5 |
| tailorfl | ``algorithm_params.tune`` | 0.05, 0.2 |
| pfedgate | ``algorithm_params.gating_lr`` | 0.005, 0.01, 0.05, 0.1 |

``lr`` is Pa3dFL's grid (Table 7, FMNIST: 0.1; TailorFL Hetero 0.01). ``reg`` is the L1
coefficient of TailorFL's importance layer: Pa3dFL's {0.1, 0.5} plus the 0.05 of its Tables 5
and 7; ``tune`` the weight of similar clients in its filter selection, the two values Tables 5-7
use. ``gating_lr`` is pFedGate's gating-layer rate on Pa3dFL's grid (Table 7, FMNIST: 0.1
Ideal, 0.05 Hetero). pFedGate's block count stays at Pa3dFL's B = 5 (not searched).
Neither has a privacy knob.
"""

from __future__ import annotations

from typing import Any

from search_spaces.base import SPACES, param_name

__all__ = ["tailorfl_space", "pfedgate_space"]

#: Pa3dFL's learning-rate grid (Appendix D)
LR_GRID = [0.005, 0.01, 0.05, 0.1]


@SPACES.register("tailorfl")
def tailorfl_space(trial: Any, algorithm: str = "tailorfl") -> None:
    """TailorFL: learning rate, importance regulariser, similarity weight of the selection."""
    trial.suggest_categorical(param_name(algorithm, "lr"), LR_GRID)
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.reg"), [0.05, 0.1, 0.5])
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.tune"), [0.05, 0.2])


@SPACES.register("pfedgate")
def pfedgate_space(trial: Any, algorithm: str = "pfedgate") -> None:
    """pFedGate: learning rate of the model and of the gating layer."""
    trial.suggest_categorical(param_name(algorithm, "lr"), LR_GRID)
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.gating_lr"), LR_GRID)
