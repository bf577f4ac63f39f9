"""A non-DP run's epsilon is inf; MLflow's SQL store keeps it as float max. The export (and so
every Pareto front and plot) must read it back as inf."""

from __future__ import annotations

import math
from pathlib import Path

from analysis.runs import runs_frame


def test_infinite_metrics_survive_the_sqlite_store(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("inf")
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "epsilon", math.inf)
    client.log_metric(run.info.run_id, "neg", -math.inf)
    client.log_metric(run.info.run_id, "accuracy", 0.5)
    stored = client.get_run(run.info.run_id).data.metrics
    assert not math.isinf(stored["epsilon"])  # what the store really hands back
    df = runs_frame([client.get_run(run.info.run_id)])
    assert df["epsilon"].iloc[0] == math.inf and df["neg"].iloc[0] == -math.inf
    assert df["accuracy"].iloc[0] == 0.5
