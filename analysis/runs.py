"""MLflow runs -> one tidy table (one row per run): the table every front, query and report reads.

Here, not in ``sweeps``, so that both the readers (``analysis.load``) and the sweep driver's
export (``sweeps.export``) use it without ``analysis`` importing ``sweeps``.

Columns: ``run_id``, ``run_name``, ``status`` (MLflow's), ``algorithm``, ``dataset``,
``trial_id``, ``sweep``, ``failure_reason``, ``parent_run_id``, ``dp_guarantee`` (what the
run's epsilon guarantees), ``dp_relation`` (``add-remove`` or ``replace-one``),
``client_sampling`` (``poisson`` or ``fixed``), ``trial_status`` (a sweep trial's outcome, tag
``status``: FINISHED, FAILED or PRUNED), ``stopped_early`` (bool), ``rounds_completed`` (int),
``optuna_trial`` (the Optuna trial number), ``start_time``, ``end_time``, ``duration_s``, the
final value of every metric under its plain name (``accuracy``, ``epsilon`` ...), and the config
as ``params.<key>`` columns (``params.lr``, ``params.optimizer.momentum``). A tag a run does not
carry is null in its row.

``epsilon`` is the run's guarantee: a run tagged ``dp_guarantee`` ``shared-only`` or ``none``
reads ``inf``, and a finite epsilon such a run logged before flcore reported ``inf`` itself moves
to ``epsilon_shared`` (:func:`analysis.guarantees.apply_guarantees`).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import pandas as pd

from analysis.guarantees import apply_guarantees

__all__ = ["runs_frame", "unsanitize"]

_TAGS = {
    "algorithm": "algorithm",
    "dataset": "dataset",
    "fedsweep.trial_id": "trial_id",
    "fedsweep.sweep": "sweep",
    "failure_reason": "failure_reason",
    "mlflow.parentRunId": "parent_run_id",
    "dp_guarantee": "dp_guarantee",
    "dp_relation": "dp_relation",
    "client_sampling": "client_sampling",
    "status": "trial_status",
    "stopped_early": "stopped_early",
    "rounds_completed": "rounds_completed",
    "fedsweep.optuna_trial": "optuna_trial",
}
#: tags read as booleans and integers; an unreadable value is null, never guessed
_BOOL_TAGS = frozenset({"stopped_early"})
_INT_TAGS = frozenset({"rounds_completed", "optuna_trial"})


def _tag_value(column: str, value: str | None) -> Any:
    if value is None:
        return None
    if column in _BOOL_TAGS:
        return {"true": True, "false": False}.get(value.strip().lower())
    if column in _INT_TAGS:
        try:
            return int(value)
        except ValueError:
            return None
    return value


def _coerce(value: str) -> Any:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return {"True": True, "False": False, "None": None, "null": None}.get(value, value)


def unsanitize(value: float) -> float:
    """MLflow's SQL store saves +-inf as +-sys.float_info.max; a non-DP run's epsilon is inf,
    so map those back (no real metric reaches 1.8e308)."""
    if value >= sys.float_info.max:
        return math.inf
    if value <= -sys.float_info.max:
        return -math.inf
    return value


def runs_frame(runs: list[Any]) -> pd.DataFrame:
    """One row per MLflow run (``mlflow.entities.Run``)."""
    rows = []
    for run in runs:
        info, data = run.info, run.data
        row: dict[str, Any] = {
            "run_id": info.run_id,
            "run_name": info.run_name,
            "status": info.status,
            "start_time": pd.to_datetime(info.start_time, unit="ms", utc=True),
            "end_time": pd.to_datetime(info.end_time, unit="ms", utc=True)
            if info.end_time
            else pd.NaT,
        }
        row["duration_s"] = (
            (info.end_time - info.start_time) / 1000.0 if info.end_time else float("nan")
        )
        for tag, col in _TAGS.items():
            row[col] = _tag_value(col, data.tags.get(tag))
        if row["algorithm"] is None:
            row["algorithm"] = data.params.get("algorithm")
        if row["dataset"] is None:
            row["dataset"] = data.params.get("dataset")
        row.update({k: unsanitize(float(v)) for k, v in data.metrics.items()})
        row.update(
            {
                f"params.{k}": _coerce(v)
                for k, v in data.params.items()
                if k != "trial.search_params"
            }
        )
        if "trial.search_params" in data.params:
            row["search_params"] = data.params["trial.search_params"]
        rows.append(row)
    return apply_guarantees(pd.DataFrame(rows))
