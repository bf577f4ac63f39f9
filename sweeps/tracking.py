"""MLflow tracking for one experiment: params, per-round metrics in batches, summary, tags.

The store defaults to the sqlite file ``mlflow.db`` in the working directory unless
``MLFLOW_TRACKING_URI`` is set (resolved, and opened, by :mod:`analysis.store`, re-exported
here); the experiment name comes from the config's ``experiment``, else
``MLFLOW_EXPERIMENT_NAME``, else ``fedsweep``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from analysis.store import mlflow_client, resolve_tracking_uri, sqlite_path, tracking_uri
from flcore.callbacks import Callback, RoundResult

__all__ = [
    "MLflowCallback",
    "experiment_id",
    "experiment_name",
    "mlflow_client",
    "resolve_tracking_uri",
    "sqlite_path",
    "tracking_uri",
]

DEFAULT_EXPERIMENT = "fedsweep"


def experiment_name(configured: str | None, default: str = DEFAULT_EXPERIMENT) -> str:
    """The configured experiment, else ``MLFLOW_EXPERIMENT_NAME``, else ``default``."""
    return configured or os.environ.get("MLFLOW_EXPERIMENT_NAME") or default


def experiment_id(client: Any, name: str) -> str:
    """The id of experiment ``name``, created if missing; another process creating it at the
    same moment is not an error."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    try:
        return str(client.create_experiment(name))
    except MlflowException:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def _param_value(value: Any) -> str:
    text = "null" if value is None else str(value)
    return text[:6000]  # MLflow's param value limit


def _finite(values: Mapping[str, float | None]) -> dict[str, float]:
    out = {}
    for k, v in values.items():
        if v is None or isinstance(v, str | bool):  # reasons and labels are tags, not metrics
            continue
        v = float(v)
        # MLflow stores nan/inf; keep inf (a non-DP epsilon is inf) but drop nan (not measured).
        if not math.isnan(v):
            out[k] = v
    return out


class MLflowCallback(Callback):
    """Logs one run. Create it after the config validated, so a rejected config writes nothing.

    Args:
        experiment: MLflow experiment name.
        params: flattened params (``optimizer.momentum`` ...).
        tags: extra tags (provenance).
        run_name: display name.
        parent_run_id: nests this run under a sweep's parent run.
        uri: tracking URI (default :func:`tracking_uri`).
    """

    def __init__(
        self,
        *,
        experiment: str,
        params: Mapping[str, Any],
        tags: Mapping[str, str] | None = None,
        run_name: str | None = None,
        parent_run_id: str | None = None,
        uri: str | None = None,
    ) -> None:
        from mlflow.entities import Param, RunTag

        self.client = mlflow_client(uri)
        exp_id = experiment_id(self.client, experiment)
        all_tags = dict(tags or {})
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        self.run = self.client.create_run(exp_id, run_name=run_name, tags=all_tags)
        self.run_id: str = self.run.info.run_id
        items = [Param(k, _param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i : i + 100])
        self._RunTag = RunTag

    def on_round_end(self, result: RoundResult) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(k, v, now, result.round)
            for k, v in _finite(result.metrics).items()
            if k != "round"
        ]
        self.client.log_batch(self.run_id, metrics=metrics)

    def on_run_end(self, summary: dict[str, float | None]) -> None:
        self.log_summary(summary)

    def log_summary(self, summary: Mapping[str, float | None], step: int | None = None) -> None:
        """Final metrics under their plain names (``accuracy``, ``bytes_up`` ...)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        step = int(summary.get("rounds") or 0) if step is None else step
        metrics = [Metric(k, v, now, step) for k, v in _finite(summary).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[self._RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def finish(self, status: str = "FINISHED") -> None:
        """Close the run (``FINISHED``, ``FAILED`` or ``KILLED``)."""
        self.client.set_terminated(self.run_id, status=status)
