"""`fedsweep server` on a real PostgreSQL: a throwaway cluster (Debian's initdb and pg_ctl, run
as an unprivileged user when the tests run as root, since PostgreSQL refuses root), the real
MLflow server in front of it, and a real sweep that records its parent and child runs, metrics
and artifacts there, with its Optuna study in the same PostgreSQL."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.sweep_helpers import FEDSWEEP, cli, env, tiny_spec, write_spec

PG_USER = "fedsweep-pg"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_pg_user(cmd: list[str]) -> list[str]:
    """PostgreSQL's tools refuse to run as root: as root, run them as an unprivileged user."""
    if os.geteuid() != 0:
        return cmd
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
            check=True,
        )
    return ["runuser", "-u", PG_USER, "--", *cmd]


@pytest.fixture
def postgres() -> Iterator[str]:
    """A PostgreSQL cluster on a free 127.0.0.1 port; yields ``postgresql://...@host:port``.
    Its folder is a fresh one under the system's temp dir (pytest's are private to root)."""
    bindir = Path(
        subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    home = Path(tempfile.mkdtemp(prefix="fedsweep-pg-"))
    if os.geteuid() == 0:
        _as_pg_user(["true"])  # creates the user
        shutil.chown(home, PG_USER)
    data, port = home / "data", _free_port()
    run = lambda cmd: subprocess.run(_as_pg_user(cmd), check=True, capture_output=True)  # noqa: E731
    run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
    options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1"
    run(
        [
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(home / "log"),
            "-w",
            "start",
        ]
    )
    try:
        for db in ("mlflow", "optuna"):
            run(
                [str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", db]
            )
        yield f"postgresql://postgres@127.0.0.1:{port}"
    finally:
        run([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"])
        shutil.rmtree(home, ignore_errors=True)


def _wait(url: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {timeout} s")


def test_a_sweep_records_into_a_postgresql_backed_tracking_server(
    postgres: str, data_root: Path, tmp_path: Path
) -> None:
    port = _free_port()
    artifacts = tmp_path / "artifacts"
    server = subprocess.Popen(
        [
            FEDSWEEP,
            "server",
            "--backend-store-uri",
            f"{postgres}/mlflow",
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
        _wait(f"{url}/health", server)
        spec = tiny_spec(
            data_root,
            name="pg",
            algorithms=["fedavg"],
            tracking={"uri": url, "experiment": "pg-sweep"},
            storage={"path": "sweeps_out", "optuna": f"{postgres}/optuna"},
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

        study = optuna.load_study(study_name="pg", storage=f"{postgres}/optuna")
        assert len(study.trials) == 2
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
