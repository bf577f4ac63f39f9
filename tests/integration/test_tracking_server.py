"""`fedsweep server` on a real PostgreSQL: a throwaway cluster (Debian's initdb and pg_ctl, run
as an unprivileged user when the tests run as root, since PostgreSQL refuses root), the real
MLflow server in front of it, and a real sweep that records its parent and child runs, metrics
and artifacts there, with its Optuna study in the same PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.postgres import postgres, wait_http
from tests.integration.sweep_helpers import (
    FEDSWEEP,
    cli,
    env,
    free_port,
    tiny_spec,
    write_spec,
)


@pytest.fixture
def pg() -> Iterator[str]:
    """A throwaway PostgreSQL on a free 127.0.0.1 port (tests/integration/postgres.py)."""
    with postgres() as url:
        yield url


def test_a_sweep_records_into_a_postgresql_backed_tracking_server(
    pg: str, data_root: Path, tmp_path: Path
) -> None:
    port = free_port()
    artifacts = tmp_path / "artifacts"
    server = subprocess.Popen(
        [
            FEDSWEEP,
            "server",
            "--backend-store-uri",
            f"{pg}/mlflow",
            "--artifacts-destination",
            str(artifacts),
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env=env(),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", server)
        spec = tiny_spec(
            data_root,
            name="pg",
            algorithms=["fedavg"],
            tracking={"uri": url, "experiment": "pg-sweep"},
            storage={"path": "sweeps_out", "optuna": f"{pg}/optuna"},
        )
        spec["base"]["rounds"] = 1
        done = cli(["sweep", str(write_spec(tmp_path, spec)), "--json"], cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads(done.stdout)
        assert [t["status"] for t in summary["trials"]] == ["FINISHED", "FINISHED"], summary

        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=url)
        exp = client.get_experiment_by_name("pg-sweep")
        runs = client.search_runs([exp.experiment_id])
        parents = [r for r in runs if r.data.tags.get("fedsweep.kind") == "sweep"]
        children = [r for r in runs if r.data.tags.get("fedsweep.kind") != "sweep"]
        assert len(parents) == 1 and len(children) == 2
        parent = parents[0].info.run_id
        assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent}
        for c in children:
            assert c.info.status == "FINISHED"
            assert 0 <= c.data.metrics["accuracy"] <= 1
            assert len(client.get_metric_history(c.info.run_id, "accuracy")) == 1
        # artifacts went through the server into its destination, not to a client-side path
        logged = {a.path for a in client.list_artifacts(parent)}
        assert "sweep_spec.json" in logged, logged
        assert list(artifacts.rglob("sweep_spec.json")), "not in the server's destination"
        assert not (tmp_path / "mlruns").exists() and not (tmp_path / "mlartifacts").exists()
        # the Optuna study is in the same PostgreSQL
        import optuna

        study = optuna.load_study(study_name="pg", storage=f"{pg}/optuna")
        assert len(study.trials) == 2
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
