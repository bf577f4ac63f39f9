"""Define-by-run Optuna search spaces, one file per algorithm family.

A space is a function ``space(trial, algorithm) -> None`` that only calls ``trial.suggest_*``
(no computation). Each Optuna parameter is named ``"<algorithm>:<config key>"``, with dotted
keys for nested config values (``"fedavg:optimizer.momentum"``), so the sweep turns a trial's
parameters into ``--set``-style overrides of the base experiment config and conditional spaces
of different algorithms never share a parameter. Every registered algorithm has a space.
"""

from __future__ import annotations

from typing import Any

from search_spaces import distillation as _distillation  # noqa: F401  (registers)
from search_spaces import dp as _dp  # noqa: F401  (registers)
from search_spaces import fedavg as _fedavg  # noqa: F401  (registers)
from search_spaces import hkd as _hkd  # noqa: F401  (registers)
from search_spaces import hyperfl as _hyperfl  # noqa: F401  (registers)
from search_spaces import meta as _meta  # noqa: F401  (registers)
from search_spaces import nested_width as _nested_width  # noqa: F401  (registers)
from search_spaces import pa3dfl as _pa3dfl  # noqa: F401  (registers)
from search_spaces import personal as _personal  # noqa: F401  (registers)
from search_spaces import prototypes as _prototypes  # noqa: F401  (registers)
from search_spaces import pruned as _pruned  # noqa: F401  (registers)
from search_spaces import regularized as _regularized  # noqa: F401  (registers)
from search_spaces.base import SPACES, overrides_for, param_name

__all__ = ["SPACES", "overrides_for", "param_name", "define_by_run"]


class define_by_run:  # noqa: N801  (used like a function; a class so Ray can pickle it)
    """The define-by-run function for OptunaSearch: the algorithm is itself a categorical
    dimension and each algorithm draws from its own conditional space."""

    def __init__(self, algorithms: list[str]) -> None:
        self.algorithms = list(algorithms)

    def __call__(self, trial: Any) -> dict[str, Any] | None:
        if len(self.algorithms) == 1:
            algorithm = self.algorithms[0]
            SPACES.get(algorithm)(trial, algorithm)
            return {"algorithm": algorithm}
        algorithm = trial.suggest_categorical("algorithm", self.algorithms)
        SPACES.get(algorithm)(trial, algorithm)
        return None
