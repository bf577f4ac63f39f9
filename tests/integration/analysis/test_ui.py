"""``fedsweep ui`` serves the MLflow REST API (and ``--optuna`` the Optuna dashboard) on
127.0.0.1, and after SIGINT leaves no process behind."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sweeps.cli import app
from tests.integration.analysis.store import Store
from tests.integration.sweep_helpers import FEDSWEEP, env

psutil = pytest.importorskip("psutil")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str, deadline: float, proc: subprocess.Popen[str]) -> Any:
    """GET ``url`` until it answers (the server is starting) or ``deadline`` passes."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, ConnectionError):
            if proc.poll() is not None:
                raise AssertionError(f"fedsweep ui exited early: {proc.stderr.read()}") from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def descendants(pid: int) -> list[Any]:
    return psutil.Process(pid).children(recursive=True)


def listening(procs: list[Any], port: int) -> set[str]:
    """The addresses the processes listen on at ``port``."""
    addresses = set()
    for p in procs:
        try:
            for c in p.net_connections(kind="tcp"):
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port:
                    addresses.add(c.laddr.ip)
        except psutil.NoSuchProcess:
            pass
    return addresses


def still_alive(procs: list[Any]) -> list[Any]:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def stop_with_sigint(proc: subprocess.Popen[str], children: list[Any]) -> tuple[str, list[int]]:
    """SIGINT, then (stderr, the children still alive once fedsweep ui has exited)."""
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        err = "fedsweep ui did not stop within 60 s of SIGINT"
    alive = still_alive(children)
    for p in alive:  # a failed test must not leave a server behind
        p.kill()
    if proc.poll() is None:
        proc.kill()
        proc.communicate()
    return err, [p.pid for p in alive]


def start(args: list[str], cwd: Path, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [FEDSWEEP, "ui", *args],
        cwd=cwd,
        env=env(**extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_mlflow_ui_serves_the_rest_api_and_stops_on_sigint(store: Store, tmp_path: Path) -> None:
    port = free_port()
    proc = start(["--port", str(port)], tmp_path, MLFLOW_TRACKING_URI=store.uri)
    children: list[Any] = []
    try:
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=50"
        doc = get_json(url, time.monotonic() + 180, proc)
        children = descendants(proc.pid)
        addresses = listening(children, port)
    finally:
        err, alive = stop_with_sigint(proc, children)

    assert {e["name"] for e in doc["experiments"]} >= {"fl-runs", "fl-sweep"}
    assert addresses == {"127.0.0.1"}
    assert len(children) == 2  # the lean server: mlflow's launcher and one uvicorn worker
    assert proc.returncode == 0, err
    assert "stopped" in err
    assert alive == []
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)
    assert not (tmp_path / "mlflow.db").exists()  # it served the given store, created none


def test_optuna_dashboard_serves_a_study_and_stops_on_sigint(tmp_path: Path) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="demo", storage=storage, directions=["maximize"] * 2)
    study.optimize(lambda t: (t.suggest_float("x", 0, 1), t.suggest_float("y", 0, 1)), 3)
    port = free_port()
    proc = start(
        ["--optuna", "--storage", storage, "--study", "demo", "--port", str(port)], tmp_path
    )
    children: list[Any] = []
    try:
        doc = get_json(f"http://127.0.0.1:{port}/api/studies", time.monotonic() + 120, proc)
        children = descendants(proc.pid)
        addresses = listening(children, port)
    finally:
        err, alive = stop_with_sigint(proc, children)

    assert [s["study_name"] for s in doc["study_summaries"]] == ["demo"]
    assert addresses == {"127.0.0.1"} and children
    assert proc.returncode == 0, err
    assert f"/dashboard/studies/{study._study_id}" in " ".join(err.split())
    assert alive == []


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--study", "x"], "go with --optuna"),
        (["--optuna", "--storage", "sqlite:///nowhere/optuna.db"], "no Optuna storage at"),
    ],
)
def test_ui_bad_input_exits_2(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(app, ["ui", *args])

    assert result.exit_code == 2 and needle in " ".join(result.stderr.split())


def test_ui_refuses_a_busy_port_and_a_missing_store(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        busy = sock.getsockname()[1]
        taken = CliRunner().invoke(app, ["ui", "--port", str(busy)])
    absent = CliRunner().invoke(
        app, ["ui", "--port", str(free_port())], env={"MLFLOW_TRACKING_URI": f"sqlite:///{missing}"}
    )

    assert taken.exit_code == 2 and "is in use" in taken.stderr
    assert absent.exit_code == 2 and "no MLflow store" in absent.stderr
    assert not missing.exists()
