"""Pa3dFL: the paper's own grids (Wang et al., arXiv 2405.20589, Sec. 6.1 and Appendix D.3).

| key | grid | paper |
|---|---|---|
| ``lr`` | {0.005, 0.01, 0.05, 0.1} | the step-size grid of every method (decay 0.998 per round) |
| ``algorithm_params.embed_dim`` | {16, 64} | Tables 5-7's embedding sizes |
| ``algorithm_params.hidden_dim`` | {64, 128} | Tables 5-7's hidden sizes |
| ``algorithm_params.encoder_depth`` | {2, 3, 4} | Tables 5-7's encoder depths |
| ``algorithm_params.reg_lambda`` | {0.1, 0.01, 0.001} | Eq. 32's lambda |
| ``algorithm_params.hn_lr`` | {1.0, 0.1, 0.01, 0.001} | the hypernetwork's step (Eq. 8) |

The paper's optima pair embedding and hidden sizes as (64, 64) or (16, 128). An Optuna
categorical holds only scalars and one trial parameter sets one config key, so the two sizes are
drawn independently here: the space holds the paper's two pairs and also (16, 64) and (64, 128).
Table 7 (FMNIST): Ideal lr 0.1, lambda 0.01, hn_lr 0.1, [64, 64, 3]; Hetero lr 0.1, lambda
0.001, hn_lr 1.0, [64, 64, 4] (the algorithm's defaults are Ideal's).
"""

from __future__ import annotations

from typing import Any

from search_spaces.base import SPACES, param_name

__all__ = ["pa3dfl_space"]


@SPACES.register("pa3dfl")
def pa3dfl_space(trial: Any, algorithm: str = "pa3dfl") -> None:
    """Pa3dFL: step size, hypernetwork shape and step, Eq. 32's lambda, on the paper's grids."""
    trial.suggest_categorical(param_name(algorithm, "lr"), [0.005, 0.01, 0.05, 0.1])
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.embed_dim"), [16, 64])
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.hidden_dim"), [64, 128])
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.encoder_depth"), [2, 3, 4])
    trial.suggest_categorical(
        param_name(algorithm, "algorithm_params.reg_lambda"), [0.1, 0.01, 0.001]
    )
    trial.suggest_categorical(
        param_name(algorithm, "algorithm_params.hn_lr"), [1.0, 0.1, 0.01, 0.001]
    )
