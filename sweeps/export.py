"""A sweep's runs written as one Parquet table (the table is :func:`analysis.runs.runs_frame`'s:
one row per run, its columns documented there)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.runs import runs_frame

__all__ = ["export_sweep"]


def export_sweep(
    uri: str,
    experiment: str,
    *,
    out: str | Path | None = None,
    parent_run_id: str | None = None,
    filter_string: str = "",
) -> pd.DataFrame:
    """The runs of ``experiment`` (a sweep's children when ``parent_run_id`` is given; sweep
    parent runs and runs of trials lost to a killed driver are never rows), optionally written
    to Parquet at ``out``.

    Raises:
        ValueError: the experiment does not exist.
    """
    from sweeps.tracking import mlflow_client

    client = mlflow_client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ValueError(
            f"unknown MLflow experiment {experiment!r} at {uri}; known: "
            f"{', '.join(names) or '(none)'}"
        )
    filters = [f for f in (filter_string,) if f]
    if parent_run_id:
        filters.append(f"tags.mlflow.parentRunId = '{parent_run_id}'")
    runs, token = [], None
    while True:
        page = client.search_runs(
            [exp.experiment_id], " and ".join(filters), max_results=1000, page_token=token
        )
        runs.extend(
            r
            for r in page
            if r.data.tags.get("fedsweep.kind") != "sweep"
            and r.data.tags.get("fedsweep.lost_trial") != "true"
        )
        token = page.token
        if not token:
            break
    df = runs_frame(runs)
    if out is not None and len(df):
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_parquet(path, index=False, engine="pyarrow")
    return df
