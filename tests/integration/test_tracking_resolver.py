"""One resolver for the tracking store and experiment: every reading command given the sweep's
spec (``--spec``) reads the store and experiment the sweep writes to, from any folder.

The store is a real sqlite MLflow store at the spec's ``tracking.uri``, holding a sweep-shaped
run made with MLflow's own client; the commands are the real CLI, run in this process (the
console script's own start-up is covered by the other CLI tests)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from tests.integration.sweep_helpers import cli_in_process as cli
from tests.integration.sweep_helpers import tiny_spec, write_spec


def _store(uri: str, experiment: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run = client.create_run(client.create_experiment(experiment))
    rid = run.info.run_id
    client.log_param(rid, "algorithm", "fedavg")
    client.log_metric(rid, "accuracy", 0.75)
    client.log_metric(rid, "bytes_up", 1000.0)
    client.set_terminated(rid)
    return rid


def test_readers_given_the_spec_read_what_the_sweep_writes(data_root: Path, tmp_path: Path):
    sweep_dir, elsewhere = tmp_path / "sweep", tmp_path / "elsewhere"
    sweep_dir.mkdir()
    elsewhere.mkdir()
    uri = f"sqlite:///{tmp_path / 'stores' / 'sweep.db'}"
    (tmp_path / "stores").mkdir()
    spec = write_spec(
        sweep_dir,
        tiny_spec(data_root, tracking={"uri": uri, "experiment": "resolver-exp"}),
    )
    rid = _store(uri, "resolver-exp")

    from sweeps.spec import load_spec
    from sweeps.sweep import plan

    planned = plan(load_spec(spec))  # what `fedsweep sweep --dry-run` prints
    assert (planned["tracking_uri"], planned["experiment"]) == (uri, "resolver-exp")

    args = ["query", "metrics.accuracy > 0", "--spec", str(spec), "--format", "csv"]
    query = cli(args, elsewhere)
    assert query.returncode == 0, query.stderr
    assert rid in query.stdout and "1 run(s) match" in query.stderr

    out = elsewhere / "runs.parquet"
    export = cli(["export", "--spec", str(spec), "--out", str(out)], elsewhere)
    assert export.returncode == 0, export.stderr
    assert pd.read_parquet(out)["run_id"].tolist() == [rid]

    # without the spec a reader looks in its own folder, finds no store and says so (exit 2,
    # no empty database left behind)
    lost = cli(["query", "metrics.accuracy > 0", "-e", "resolver-exp"], elsewhere)
    assert lost.returncode == 2 and "no MLflow store" in " ".join(lost.stderr.split())
    assert not (elsewhere / "mlflow.db").exists()

    # a bad spec is named, before any store is read
    bad = cli(["query", "x", "--spec", str(elsewhere / "missing.yaml")], elsewhere)
    assert bad.returncode == 2 and "invalid sweep spec" in " ".join(bad.stderr.split())
