"""A reused Ray actor (``reuse_actors``, the sweep default) runs its next trial exactly as a
fresh process would: ``reset_config`` rebuilds the engines and empties every per-trial state."""

from __future__ import annotations

import math
from typing import Any

from flcore.config import validate_config


def _steps(t: Any) -> list[dict[str, Any]]:
    reports: list[dict[str, Any]] = []
    while not (reports and reports[-1]["done"]):
        reports.append(t.step())
        assert len(reports) <= 5, "the trial did not end"
    return reports


def _measured(report: dict[str, Any]) -> dict[str, Any]:
    """A report without its clocks (they differ between any two runs)."""
    return {k: v for k, v in report.items() if "seconds" not in k}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def eq(x: Any, y: Any) -> bool:
        both_nan = isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)
        return both_nan or x == y

    return a.keys() == b.keys() and all(eq(a[k], b[k]) for k in a)


def test_a_reused_actor_runs_the_next_trial_as_a_fresh_one(
    tiny_config: dict[str, Any], trial_steps: Any
) -> None:
    setup = {
        "base": validate_config(tiny_config | {"rounds": 1}).model_dump(mode="json"),
        "seeds": [3],
        "rounds_per_step": 1,
        "objectives": ["accuracy"],
        "fills": {},
    }
    first = {"algorithm": "fedavg", "fedavg:lr": 0.2}
    second = {"algorithm": "local", "local:lr": 0.05}
    reused, _ = trial_steps(first, max_steps=5, **setup)
    old_engines = reused.engines
    assert reused.reset_config(second) is True
    assert reused.engines[0] is not old_engines[0]
    assert reused.exp_config.algorithm == "local" and reused.exp_config.lr == 0.05
    assert reused._reports == [] and reused._latest == [{}]
    assert 0 < reused._startup_s < 60  # the reset's build time, not the process's age
    again = _steps(reused)
    _, fresh = trial_steps(second, max_steps=5, **setup)
    assert len(again) == len(fresh) == 1 and again[0]["done"]
    for a, b in zip(again, fresh, strict=True):
        assert _same(_measured(a), _measured(b)), (a, b)
