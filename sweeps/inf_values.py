"""The finite stand-ins Optuna is told for an infinite objective (issue 23 §1.3).

Runs without DP (and shared-only runs) report ``epsilon = inf``. Multi-objective TPE breaks ties
with a hypervolume whose reference point an inf would push to inf, so the searcher
(:mod:`sweeps.search`) tells a finite stand-in instead, fixed before the first tell (a told
value cannot be revised): an objective's ``inf_value``, or for ``epsilon`` by default
:data:`EPSILON_INF_FACTOR` times the largest target epsilon the sweep's search spaces or base
config can reach. MLflow and every front keep the true inf. Ray-free, so ``--dry-run`` can show
the stand-ins without starting anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["EPSILON_INF_FACTOR", "EPSILON_INF_FALLBACK", "resolve_inf_values"]

#: epsilon's default stand-in for inf: this many times the largest reachable target epsilon
EPSILON_INF_FACTOR = 10.0
#: epsilon's stand-in when no target epsilon is in the spaces or the base config
EPSILON_INF_FALLBACK = 1000.0


class _SpaceBounds:
    """Stands in for an Optuna trial to read a define-by-run space's float/int ranges."""

    def __init__(self) -> None:
        self.bounds: dict[str, tuple[float, float]] = {}

    def suggest_float(self, name: str, low: float, high: float, **_: Any) -> float:
        self.bounds[name] = (low, high)
        return low

    def suggest_int(self, name: str, low: int, high: int, **_: Any) -> int:
        self.bounds[name] = (low, high)
        return low

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        numbers = [c for c in choices if isinstance(c, int | float) and not isinstance(c, bool)]
        if numbers:
            self.bounds[name] = (min(numbers), max(numbers))
        return choices[0]


def _largest_target_epsilon(spec: Any) -> float | None:
    """The largest ``privacy.target_epsilon`` the sweep's spaces or its base config can set."""
    from search_spaces import SPACES

    found = []
    privacy = getattr(spec.base, "privacy", None)
    if privacy is not None and privacy.target_epsilon is not None:
        found.append(float(privacy.target_epsilon))
    for algorithm in spec.algorithms:
        recorder = _SpaceBounds()
        SPACES.get(algorithm)(recorder, algorithm)
        found += [
            float(high)
            for name, (_, high) in recorder.bounds.items()
            if name.endswith("privacy.target_epsilon")
        ]
    return max(found) if found else None


def resolve_inf_values(spec: Any) -> dict[str, float | None]:
    """Each objective's stand-in for inf: its ``inf_value``; for ``epsilon``, by default
    :data:`EPSILON_INF_FACTOR` x the largest reachable target epsilon (else
    :data:`EPSILON_INF_FALLBACK`); None for any other objective (inf is then a FAIL)."""
    out: dict[str, float | None] = {}
    for obj in spec.objectives:
        value = getattr(obj, "inf_value", None)
        if value is None and obj.name == "epsilon":
            largest = _largest_target_epsilon(spec)
            value = EPSILON_INF_FALLBACK if largest is None else EPSILON_INF_FACTOR * largest
        out[obj.name] = None if value is None else float(value)
    return out
