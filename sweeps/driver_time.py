"""Seconds the sweep driver spends in its own work on Tune's event loop, by kind: ``mlflow``
(the tracking callback's hooks, enqueueing included) and ``optuna`` (the searcher's ask, report
and tell). One process-wide tally, reset by each sweep and reported in its summary
(``driver_seconds``): the share of the sweep's wall time the driver keeps Tune waiting."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["driver_time", "tally", "reset", "mark", "timeline"]

_TALLY: dict[str, float] = {}
_TIMELINE: list[dict[str, float]] = []
F = TypeVar("F", bound=Callable[..., Any])


def driver_time(kind: str) -> Callable[[F], F]:
    """Add the wrapped call's seconds to ``kind``'s tally."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _TALLY[kind] = _TALLY.get(kind, 0.0) + time.perf_counter() - start

        return timed  # type: ignore[return-value]

    return wrap


def tally() -> dict[str, float]:
    return dict(_TALLY)


def mark() -> None:
    """Note the tally as a trial ends: how the driver's cost grows with finished trials."""
    _TIMELINE.append({"t": time.perf_counter(), "finished": float(len(_TIMELINE) + 1), **_TALLY})


def timeline() -> list[dict[str, float]]:
    return [dict(row) for row in _TIMELINE]


def reset() -> None:
    _TALLY.clear()
    _TIMELINE.clear()
