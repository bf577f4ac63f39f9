"""FedHKD's regularisation baselines: FedProx, MOON and FedAlign.

FedHKD (Chen & Vikalo, ICLR 2023, App. A.2) trains every method with Adam at lr 1e-3 and fixes
each baseline's coefficient; these spaces are small categorical grids with those values in the
centre:

| key | values | why |
|---|---|---|
| ``lr`` | 5e-4, 1e-3, 2e-3 | Adam's 1e-3 (FedHKD's protocol), a factor 2 either side |
| ``algorithm_params.mu`` (FedProx) | 0.1, 0.5, 1.0 | proximal weight (FedHKD: 0.5) |
| ``algorithm_params.mu`` (MOON) | 0.5, 1.0, 2.0 | contrastive weight (FedHKD: 1) |
| ``algorithm_params.tau`` (MOON) | 0.1, 0.5, 1.0 | temperature (FedHKD: 0.5; MOON's grid) |
| ``algorithm_params.mu`` (FedAlign) | 0.2, 0.45, 0.9 | balancing weight (FedHKD: 0.45) |
| ``algorithm_params.width`` (FedAlign) | 0.125, 0.25, 0.5 | sub-network width (FedHKD: 0.25) |

The optimizer, batch size (64), local epochs (5) and the lr schedule are FedHKD's protocol for
all methods, so they are not searched.
"""

from __future__ import annotations

from typing import Any

from search_spaces.base import SPACES, param_name

__all__ = ["fedprox_space", "moon_space", "fedalign_space"]

LRS = [5e-4, 1e-3, 2e-3]


@SPACES.register("fedprox")
def fedprox_space(trial: Any, algorithm: str = "fedprox") -> None:
    """FedProx: learning rate and the proximal weight mu."""
    trial.suggest_categorical(param_name(algorithm, "lr"), LRS)
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.mu"), [0.1, 0.5, 1.0])


@SPACES.register("moon")
def moon_space(trial: Any, algorithm: str = "moon") -> None:
    """MOON: learning rate, the contrastive weight mu and the temperature tau."""
    trial.suggest_categorical(param_name(algorithm, "lr"), LRS)
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.mu"), [0.5, 1.0, 2.0])
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.tau"), [0.1, 0.5, 1.0])


@SPACES.register("fedalign")
def fedalign_space(trial: Any, algorithm: str = "fedalign") -> None:
    """FedAlign: learning rate, the balancing weight mu and the sub-network width."""
    trial.suggest_categorical(param_name(algorithm, "lr"), LRS)
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.mu"), [0.2, 0.45, 0.9])
    trial.suggest_categorical(param_name(algorithm, "algorithm_params.width"), [0.125, 0.25, 0.5])
