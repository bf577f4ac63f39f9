"""The pieces of ``fedsweep ui``: ports, commands, the Optuna target, stopping process groups."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from sweeps.dashboards import (
    DashboardError,
    group_alive,
    mlflow_ui_command,
    optuna_target,
    require_free_port,
    serve,
    stop_group,
)


def test_a_busy_port_is_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(DashboardError, match=f"port {port} on 127.0.0.1 is in use"):
            require_free_port(port)
    require_free_port(port)  # free again
    with pytest.raises(DashboardError, match="outside"):
        require_free_port(70000)


def test_mlflow_server_is_lean_and_never_creates_a_store(tmp_path: Path) -> None:
    with pytest.raises(DashboardError, match="no MLflow store"):
        mlflow_ui_command(f"sqlite:///{tmp_path / 'missing.db'}", 5000)
    (tmp_path / "m.db").touch()

    cmd, env = mlflow_ui_command(f"sqlite:///{tmp_path / 'm.db'}", 5123)

    assert not (tmp_path / "missing.db").exists()
    assert cmd[:4] == [sys.executable, "-m", "mlflow", "server"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "5123"
    assert cmd[cmd.index("--workers") + 1] == "1"
    assert env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert env["MLFLOW_DISABLE_TELEMETRY"] == "true"


@pytest.fixture
def study(tmp_path: Path) -> Path:
    """A real Optuna study ``demo`` in ``tmp/out/optuna.db``, and a sweep spec pointing there."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    db = tmp_path / "out" / "optuna.db"
    db.parent.mkdir()
    s = optuna.create_study(study_name="demo", storage=f"sqlite:///{db}", direction="maximize")
    s.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    spec = {
        "name": "demo",
        "base": {"dataset": "fmnist", "data_root": str(tmp_path)},
        "algorithms": ["fedavg"],
        "objectives": {"accuracy": "max"},
        "storage": {"path": str(tmp_path / "out")},
    }
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec))
    return db


def test_optuna_target_from_a_spec_or_a_storage(study: Path, tmp_path: Path) -> None:
    from_spec = optuna_target(spec=tmp_path / "sweep.yaml")
    from_storage = optuna_target(storage=f"sqlite:///{study}")

    assert from_spec.storage == f"sqlite:///{study}" and from_spec.study == "demo"
    assert from_spec.url(8080) == f"http://127.0.0.1:8080/dashboard/studies/{from_spec.study_id}"
    assert from_storage.study is None and from_storage.url(9) == "http://127.0.0.1:9/"


def test_optuna_target_errors_name_the_problem(study: Path, tmp_path: Path) -> None:
    (tmp_path / "plain.db").write_bytes(b"")
    cases = [
        ({"spec": tmp_path / "sweep.yaml", "storage": "sqlite:///x"}, "not both"),
        ({"spec": tmp_path / "nope.yaml"}, "invalid sweep spec"),
        ({"storage": f"sqlite:///{tmp_path / 'none.db'}"}, "no Optuna storage at"),
        ({"storage": f"sqlite:///{tmp_path / 'plain.db'}"}, "is not an Optuna storage"),
        ({"storage": f"sqlite:///{study}", "study": "other"}, "no study 'other'.*demo"),
    ]
    for kwargs, needle in cases:
        with pytest.raises(DashboardError, match=needle):
            optuna_target(**kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "none.db").exists()
    assert (tmp_path / "plain.db").read_bytes() == b""  # read-only: no tables created


def _children(pid: int) -> list[int]:
    psutil = pytest.importorskip("psutil")
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def _alive(pids: list[int]) -> list[int]:
    psutil = pytest.importorskip("psutil")
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _wait_for_children(pid: int, n: int) -> list[int]:
    for _ in range(100):
        kids = _children(pid)
        if len(kids) >= n:
            return kids
        time.sleep(0.05)
    raise AssertionError(f"process {pid} did not start {n} children")


def test_stop_group_ends_the_leader_and_its_children() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], process_group=0)
    kids = _wait_for_children(proc.pid, 2)

    stop_group(proc, timeout=5)

    assert proc.returncode is not None and not group_alive(proc.pid)
    assert _alive(kids + [proc.pid]) == []


def test_a_group_ignoring_sigterm_is_killed_after_the_grace_period() -> None:
    proc = subprocess.Popen(["sh", "-c", "trap '' TERM; sleep 60 & wait"], process_group=0)
    kids = _wait_for_children(proc.pid, 1)
    time.sleep(0.2)  # let the shell install its trap

    start = time.monotonic()
    stop_group(proc, timeout=0.5)

    assert 0.4 < time.monotonic() - start < 10
    assert _alive(kids + [proc.pid]) == [] and not group_alive(proc.pid)


def test_serve_returns_the_servers_status_and_stops_on_sigterm() -> None:
    assert serve([sys.executable, "-c", "raise SystemExit(3)"]) == 3

    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    before = signal.getsignal(signal.SIGTERM)
    start = time.monotonic()
    code = serve(["sleep", "60"])

    assert code == 0 and time.monotonic() - start < 20
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def _sweep(tmp_path: Path, name: str, **over: object) -> Path:
    """A sweep spec ``<name>.yaml`` storing under ``tmp/out``, and its study (2 trials) in the
    store a new sweep of that spec gets."""
    import optuna

    from sweeps.spec import load_spec
    from sweeps.sweep import SweepPaths, study_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    raw = {
        "name": name,
        "base": {"dataset": "fmnist", "data_root": str(tmp_path)},
        "algorithms": ["fedavg"],
        "objectives": {"accuracy": "max"},
        "storage": {"path": str(tmp_path / "out")},
    } | over
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    spec = load_spec(path)
    storage = study_storage(spec, SweepPaths(spec), None)
    s = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    s.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    return path


def test_optuna_target_finds_a_sweeps_own_sqlite_or_journal(tmp_path: Path) -> None:
    local = optuna_target(spec=_sweep(tmp_path, "here"))
    cluster = optuna_target(spec=_sweep(tmp_path, "there", ray={"address": "auto"}))

    out = tmp_path / "out"
    assert local.storage == f"sqlite:///{out / 'here.optuna.db'}" and local.study == "here"
    assert cluster.storage == str(out / "there.optuna.journal") and cluster.study == "there"
    # a journal numbers its studies from 0: the page is still the study's
    assert cluster.study_id == 0
    assert cluster.url(8080) == "http://127.0.0.1:8080/dashboard/studies/0"


def test_optuna_target_from_a_storage_folder(tmp_path: Path) -> None:
    _sweep(tmp_path, "one", ray={"address": "auto"})
    out = tmp_path / "out"

    alone = optuna_target(storage=str(out))
    _sweep(tmp_path, "two")
    chosen = optuna_target(storage=str(out), study="two")
    journal_file = optuna_target(storage=str(out / "one.optuna.journal"))

    assert alone.storage == str(out / "one.optuna.journal") and alone.study == "one"
    assert chosen.storage == f"sqlite:///{out / 'two.optuna.db'}" and chosen.study == "two"
    assert journal_file == alone
    with pytest.raises(DashboardError, match=r"several sweeps are under .*\(two, one\).*--study"):
        optuna_target(storage=str(out))
    with pytest.raises(DashboardError, match="no study 'three' under"):
        optuna_target(storage=str(out), study="three")


def test_optuna_target_finds_the_shared_store_of_older_sweeps(
    study: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sweeps made before per-sweep stores kept every study in ``storage.path/optuna.db``."""
    import sweeps.dashboards

    (study.parent / "demo.fedsweep.json").write_text("{}")  # the old sweep's state, no record
    monkeypatch.setattr(sweeps.dashboards, "DEFAULT_STORAGE_DIR", study.parent)

    folder = optuna_target(storage=str(study.parent), study="demo")
    default = optuna_target()
    from_spec = optuna_target(spec=tmp_path / "sweep.yaml")

    assert folder.storage == from_spec.storage == default.storage == f"sqlite:///{study}"
    assert folder.study_id == from_spec.study_id == default.study_id is not None
    assert sorted(p.name for p in study.parent.iterdir()) == ["demo.fedsweep.json", "optuna.db"]


def test_optuna_dashboard_opens_a_journal_file(tmp_path: Path) -> None:
    """optuna-dashboard (0.21) serves a journal file given as a plain path."""
    import json
    import urllib.request

    from sweeps.dashboards import optuna_dashboard_command

    target = optuna_target(spec=_sweep(tmp_path, "j", ray={"address": "auto"}))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        optuna_dashboard_command(target.storage, port),
        process_group=0,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, doc = time.monotonic() + 60, None
        while doc is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=2) as r:
                    doc = json.load(r)
            except OSError:
                time.sleep(0.25)
    finally:
        stop_group(proc, timeout=5)

    assert doc is not None, "optuna-dashboard did not answer"
    [summary] = doc["study_summaries"]
    assert summary["study_name"] == "j" and summary["study_id"] == target.study_id
