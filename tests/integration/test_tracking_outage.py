"""A tracking server that goes away for 20 s in the middle of a sweep costs no metric.

The sweep logs to a real ``fedsweep server`` (MLflow on sqlite, proxied artifacts). Once the
first round of a trial has reached it, the server's whole process group is SIGKILLed; 20 s later
it is started again on the same store and port. The driver's writes queue up meanwhile
(``sweeps.mlflow_writer``: retries with backoff, MLflow's own HTTP retries under them), the
sweep finishes, and every trial's metric history has every round.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.postgres import wait_http
from tests.integration.sweep_helpers import FEDSWEEP, env, free_port, tiny_spec, write_spec

ROUNDS = 5


def _server(store: str, artifacts: Path, port: int, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            FEDSWEEP,
            "server",
            "--backend-store-uri",
            store,
            "--artifacts-destination",
            str(artifacts),
            "--port",
            str(port),
            "--workers",
            "1",
        ],  # fmt: skip
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=log.open("a"),
        start_new_session=True,
    )


def _children(url: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=url)
    exp = client.get_experiment_by_name("outage")
    if exp is None:
        return []
    runs = client.search_runs([exp.experiment_id])
    return [r for r in runs if r.data.tags.get("fedsweep.kind") != "sweep"]


@pytest.mark.slow  # the fault-injection tier: `make slow` (README, "Tests")
def test_a_tracking_server_down_for_20_s_mid_sweep_loses_no_metric(
    data_root: Path, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    store, artifacts = f"sqlite:///{tmp_path / 'server.db'}", tmp_path / "artifacts"
    log = tmp_path / "server.log"
    server = _server(store, artifacts, port, log)
    driver = None
    try:
        wait_http(f"{url}/health", server)
        spec = tiny_spec(
            data_root,
            name="outage",
            algorithms=["fedavg"],
            tracking={"uri": url, "experiment": "outage"},
        )
        spec["base"].update(rounds=ROUNDS, samples_per_client=300)
        driver = subprocess.Popen(
            [FEDSWEEP, "sweep", str(write_spec(tmp_path, spec)), "--json"],
            cwd=tmp_path,
            env=env(),
            stdout=subprocess.PIPE,
            stderr=(tmp_path / "driver.log").open("w"),
            text=True,
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and driver.poll() is None:
            if any("accuracy" in r.data.metrics for r in _children(url)):
                break
            time.sleep(0.5)
        assert driver.poll() is None, "the sweep ended before the outage"
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=url)
        seen = sum(
            len(client.get_metric_history(r.info.run_id, "accuracy")) for r in _children(url)
        )
        _kill_tree(server)  # the server and its workers (in a session of their own), at once
        time.sleep(20)
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
        server = _server(store, artifacts, port, log)
        wait_http(f"{url}/health", server)
        out, _ = driver.communicate(timeout=600)
        assert driver.returncode == 0, (tmp_path / "driver.log").read_text()[-3000:]
        summary = json.loads(out)
        assert [t["status"] for t in summary["trials"]] == ["FINISHED", "FINISHED"]

        children = _children(url)
        assert len(children) == 2 and {r.info.status for r in children} == {"FINISHED"}
        for run in children:
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "accuracy"))
            assert sorted(set(steps)) == list(range(1, ROUNDS + 1)), steps
            rounds = client.get_metric_history(run.info.run_id, "train_loss")
            assert sorted({m.step for m in rounds}) == list(range(1, ROUNDS + 1))
        assert seen < 2 * ROUNDS  # rounds were still to be written when the server went away
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        _kill_tree(server)


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and every process under it (``fedsweep server`` runs ``mlflow server``
    in a process group of its own, which runs its workers)."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(tree, timeout=30)
    proc.poll()
