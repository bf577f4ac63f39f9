"""Runs as one tidy DataFrame, read from MLflow or from an exported Parquet file.

This module is the edge where analysis meets the tracking store: everything else in
``analysis/`` is a pure function of the frames it returns. One row per run; the columns are
those of :func:`analysis.runs.runs_frame` (``run_id``, ``status``, ``algorithm``, ``dataset``,
``sweep``, ``failure_reason``, ``dp_guarantee``, ``dp_relation``, ``client_sampling``,
``trial_status``, ``stopped_early``, ``rounds_completed``, every metric's final value under its
plain name, the config as ``params.<key>``) plus ``experiment`` and ``experiment_id``, the run's
kind (``kind``: ``sweep`` for a sweep's parent run) and the provenance tags under
``tags.<key>``. A run tagged ``dp_guarantee`` ``shared-only`` or ``none`` reads
``epsilon = inf`` (:mod:`analysis.guarantees`).

Failed, pruned, killed and early-stopped runs stay in the frame with their status: the Pareto
functions leave them out and count them (:mod:`analysis.validity`). Sweep parent runs and lost
trials are left out unless asked for. A Parquet file exported before these rules existed is
read as it is; :func:`analysis.pareto.pareto_front` applies them to it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = [
    "LoadError",
    "PROVENANCE_TAGS",
    "load_histories",
    "load_parquet",
    "load_run_ids",
    "load_runs",
    "open_store",
]

#: tags copied into the frame as ``tags.<key>`` (where each result came from)
PROVENANCE_TAGS = (
    "fedsweep.version",
    "fedsweep.git_commit",
    "torch.version",
    "dataset.sha256",
    "leak_lpips_reason",
    "leak_reason",
    "leak_identified_by",
    "attack",
    "attack.labels",
)
_SWEEP_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_FIRST = ["run_id", "experiment", "experiment_id", "status", "algorithm", "dataset", "sweep"]


class LoadError(ValueError):
    """Input a loader cannot use: an unknown experiment, a malformed filter, a missing store
    or file. The message names the problem."""


def open_store(uri: str | None = None) -> Any:
    """An MlflowClient on ``uri`` (default: the project's store), refusing to create a store.

    MLflow creates an empty sqlite database when it opens a path that does not exist; a typo in
    a path must not leave a new file behind, so a missing sqlite file is an error here.

    Raises:
        LoadError: the sqlite file of ``uri`` does not exist.
    """
    from analysis.store import mlflow_client, sqlite_path, tracking_uri

    uri = uri or tracking_uri()
    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise LoadError(
            f"no MLflow store at {path} (tracking URI {uri}); run from the folder that holds "
            "mlflow.db or set MLFLOW_TRACKING_URI"
        )
    return mlflow_client(uri, initialize=False)


def _experiments(client: Any, names: Sequence[str]) -> list[Any]:
    if not names:
        raise LoadError("name at least one experiment")
    found, unknown = [], []
    for name in dict.fromkeys(names):
        exp = client.get_experiment_by_name(name)
        (found if exp is not None else unknown).append(exp or name)
    if unknown:
        known = sorted(e.name for e in client.search_experiments())
        raise LoadError(
            f"unknown MLflow experiment(s) {', '.join(map(repr, unknown))} at "
            f"{client.tracking_uri}; known: {', '.join(known) or '(none)'}"
        )
    return found


def _search(client: Any, experiment_ids: list[str], filter_string: str) -> list[Any]:
    from mlflow.exceptions import MlflowException

    runs: list[Any] = []
    token = None
    while True:
        try:
            page = client.search_runs(
                experiment_ids, filter_string, max_results=1000, page_token=token
            )
        except MlflowException as err:
            raise LoadError(f"malformed filter {filter_string!r}: {err.message}") from None
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def load_runs(
    experiments: str | Sequence[str],
    *,
    filter_string: str = "",
    sweep: str | None = None,
    uri: str | None = None,
    include_parents: bool = False,
) -> pd.DataFrame:
    """The runs of one or several MLflow experiments as one frame, one row per run.

    Args:
        experiments: experiment name(s).
        filter_string: MLflow search syntax, e.g.
            ``"metrics.accuracy > 0.8 and params.algorithm = 'hyperfl'"``.
        sweep: keep only the runs of this sweep (tag ``fedsweep.sweep``).
        uri: tracking URI; default ``$MLFLOW_TRACKING_URI`` or ``./mlflow.db``.
        include_parents: keep sweep parent runs (``kind == "sweep"``), e.g. for their spec.

    Raises:
        LoadError: a missing store, an unknown experiment, a malformed filter or sweep name.
    """
    from analysis.runs import runs_frame

    names = [experiments] if isinstance(experiments, str) else list(experiments)
    if sweep is not None and not _SWEEP_NAME.match(sweep):
        raise LoadError(f"sweep name {sweep!r} may hold only letters, digits, '_', '.', '-'")
    client = open_store(uri)
    exps = _experiments(client, names)
    # MLflow's grammar is a conjunction without parentheses, so "and" joins filters safely.
    filters = [filter_string.strip()]
    if sweep is not None:
        filters.append(f"tags.`fedsweep.sweep` = '{sweep}'")
    runs = _search(client, [e.experiment_id for e in exps], " and ".join(f for f in filters if f))
    runs = [
        r
        for r in runs
        if r.data.tags.get("fedsweep.lost_trial") != "true"
        and (include_parents or r.data.tags.get("fedsweep.kind") != "sweep")
    ]
    df = runs_frame(runs)
    if not len(df):
        return pd.DataFrame(columns=_FIRST)
    by_id = {e.experiment_id: e.name for e in exps}
    df["experiment_id"] = [r.info.experiment_id for r in runs]
    df["experiment"] = df["experiment_id"].map(by_id)
    df["kind"] = [r.data.tags.get("fedsweep.kind", "run") for r in runs]
    for tag in PROVENANCE_TAGS:
        df[f"tags.{tag}"] = [r.data.tags.get(tag) for r in runs]
    return df[[c for c in _FIRST if c in df] + [c for c in df if c not in _FIRST]]


def load_run_ids(run_ids: Sequence[str], *, uri: str | None = None) -> pd.DataFrame:
    """Chosen runs by id, as :func:`load_runs` frames them (without the provenance columns).

    Raises:
        LoadError: a missing store, or an id that is not a run there.
    """
    from mlflow.exceptions import MlflowException

    from analysis.runs import runs_frame

    client = open_store(uri)
    runs = []
    for run_id in dict.fromkeys(run_ids):
        try:
            runs.append(client.get_run(run_id))
        except MlflowException:
            raise LoadError(f"no run {run_id!r} in {client.tracking_uri}") from None
    df = runs_frame(runs)
    if len(df):
        df["experiment_id"] = [r.info.experiment_id for r in runs]
    return df


def load_parquet(path: str | Path) -> pd.DataFrame:
    """Runs exported by ``fedsweep export`` (or written by :func:`load_runs` callers).

    Raises:
        LoadError: the file is missing, not Parquet, or has no ``run_id`` column.
    """
    path = Path(path)
    if not path.is_file():
        raise LoadError(f"no Parquet file at {path}")
    try:
        df = pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several types for a file that is not Parquet
        raise LoadError(f"cannot read {path} as Parquet: {err}") from None
    if "run_id" not in df.columns:
        raise LoadError(f"{path} has no run_id column: it is not a table of runs")
    return df


def load_histories(
    run_ids: Iterable[str], metrics: Sequence[str], *, uri: str | None = None
) -> pd.DataFrame:
    """Round-by-round values: one row per (run, metric, step), columns ``run_id``, ``metric``,
    ``step``, ``value`` (the last value logged at a step). A metric a run never logged gives
    no rows."""
    from analysis.runs import unsanitize  # MLflow's SQL store keeps inf as float max

    client = open_store(uri)
    rows = []
    for run_id in run_ids:
        for metric in metrics:
            for m in client.get_metric_history(run_id, metric):
                rows.append((run_id, metric, int(m.step), unsanitize(float(m.value))))
    frame = pd.DataFrame(rows, columns=["run_id", "metric", "step", "value"])
    # The final summary is logged again at the last round's step: keep one value per step.
    frame = frame.drop_duplicates(["run_id", "metric", "step"], keep="last")
    return frame.sort_values(["run_id", "metric", "step"], kind="mergesort", ignore_index=True)
