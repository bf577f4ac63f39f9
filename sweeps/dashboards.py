"""``fedsweep ui``: the MLflow UI on the project's tracking store, or the Optuna dashboard of a
sweep's study, each served on 127.0.0.1 by a child process that leaves nothing behind.

The server runs in its own process group (so a terminal's Ctrl-C reaches only ``fedsweep``,
which then stops the whole group in order: SIGTERM, a grace period, SIGKILL for whatever is
left, then a wait until no process of the group is alive). The MLflow server is the lean one:
one uvicorn worker, job execution and telemetry off (two processes, about 570 MB, instead of
fifteen).

``ui --optuna`` finds a sweep's Optuna store as the sweep does (:mod:`sweeps.study_store`): from
its spec (the store its spec record names: ``<name>.optuna.db``, ``<name>.optuna.journal`` or a
database URL; the shared ``optuna.db`` for sweeps made before per-sweep stores), or from
``--storage``: a URL, a store file, or a ``storage.path`` folder. optuna-dashboard 0.21 opens a
journal file given as a plain path (any existing file without the sqlite header), which is what
it is given. Stores are only read here, never created.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "HOST",
    "DashboardError",
    "OptunaTarget",
    "group_alive",
    "mlflow_ui_command",
    "optuna_dashboard_command",
    "optuna_target",
    "require_free_port",
    "serve",
    "stop_group",
]

HOST = "127.0.0.1"
DEFAULT_STORAGE_DIR = Path("sweeps_out")  # storage.path's default


class DashboardError(ValueError):
    """A dashboard cannot start: a missing store or study, a busy port, a missing program."""


def _sqlite_file(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def require_free_port(port: int, host: str = HOST) -> None:
    """Raise :class:`DashboardError` unless ``host:port`` can be bound now, as the servers bind
    it (``SO_REUSEADDR``: a port whose last server just died, with connections in TIME_WAIT, is
    free to them; one a server listens on is not)."""
    if not 1 <= port <= 65535:
        raise DashboardError(f"port {port} is outside 1-65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise DashboardError(
                f"port {port} on {host} is in use; choose another with --port"
            ) from None


def mlflow_ui_command(uri: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The lean MLflow server on ``uri`` at 127.0.0.1:``port``: command and environment.

    Raises:
        DashboardError: ``uri`` is a sqlite file that does not exist (MLflow would create it).
    """
    path = _sqlite_file(uri)
    if path is not None and not path.is_file():
        raise DashboardError(
            f"no MLflow store at {path}; run from the folder that holds mlflow.db or set "
            "MLFLOW_TRACKING_URI"
        )
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri]
    cmd += ["--host", HOST, "--port", str(port), "--workers", "1"]
    env = os.environ | {
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    return cmd, env


def tracking_server_command(
    store: str,
    artifacts: str,
    *,
    host: str = HOST,
    port: int = 5000,
    allowed_hosts: str | None = None,
    workers: int = 4,
) -> tuple[list[str], dict[str, str]]:
    """A shared MLflow tracking server: ``store`` (a ``postgresql://`` URL, the cluster setup;
    or a sqlite file) as its backend, artifacts proxied (``--serve-artifacts``) into
    ``artifacts``, so clients upload through the server and need no shared path.

    Raises:
        DashboardError: a PostgreSQL store without ``psycopg2``, or a store URL MLflow does not
            serve.
    """
    scheme = store.split("://", 1)[0].split("+", 1)[0] if "://" in store else ""
    if scheme not in ("postgresql", "sqlite", "mysql", "mssql"):
        raise DashboardError(
            f"--backend-store-uri {store!r}: give a database URL, e.g. "
            "postgresql://USER@HOST:5432/mlflow or sqlite:///PATH/mlflow.db"
        )
    if scheme == "postgresql":
        driver = store.split("://", 1)[0].partition("+")[2] or "psycopg"  # SQLAlchemy 2.1's
        try:
            __import__(driver)
        except ImportError:
            raise DashboardError(
                f"a {store.split('://', 1)[0]}:// store needs the {driver} module: "
                f"pip install {'psycopg2-binary' if driver == 'psycopg2' else 'psycopg[binary]'}"
            ) from None
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store]
    cmd += ["--serve-artifacts", "--artifacts-destination", artifacts]
    cmd += ["--host", host, "--port", str(port), "--workers", str(workers)]
    if allowed_hosts:
        cmd += ["--allowed-hosts", allowed_hosts]
    env = os.environ | {
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    return cmd, env


@dataclass(frozen=True)
class OptunaTarget:
    """An Optuna storage URL and, when known, the study to open (name and id)."""

    storage: str
    study: str | None = None
    study_id: int | None = None

    def url(self, port: int) -> str:
        base = f"http://{HOST}:{port}"
        # a journal numbers its studies from 0
        return (
            f"{base}/dashboard/studies/{self.study_id}" if self.study_id is not None else f"{base}/"
        )


def _file_target(
    file: Path,
    storage: str,
    study: str | None,
    kind: Literal["sqlite", "journal"],
    *,
    only: bool = False,
) -> OptunaTarget:
    """A store file checked read-only: it exists, is an Optuna store, holds ``study`` (with
    ``only`` and no ``study``: its one study, as in a sweep's own store)."""
    from sweeps.study_store import stored_studies

    if not file.is_file():
        raise DashboardError(
            f"no Optuna storage at {file}; a sweep writes it under its storage.path "
            "(give the sweep spec, or --storage with the storage.path folder or a store file)"
        )
    try:
        studies = stored_studies(file, kind=kind)
    except ValueError as err:
        raise DashboardError(str(err)) from None
    if study is not None and study not in studies:
        raise DashboardError(
            f"no study {study!r} in {file}; studies there: {', '.join(sorted(studies)) or '(none)'}"
        )
    if only and study is None and len(studies) == 1:
        study = next(iter(studies))
    return OptunaTarget(storage, study, studies.get(study) if study else None)


def _path_target(file: Path, study: str | None) -> OptunaTarget:
    """A store file given by path: sqlite (by its header) or an Optuna journal."""
    from sweeps.study_store import SQLITE_HEADER

    file = file.expanduser().resolve()
    with file.open("rb") as f:
        sqlite = f.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    if sqlite:
        return _file_target(file, f"sqlite:///{file}", study, "sqlite", only=True)
    return _file_target(file, str(file), study, "journal", only=True)


def _folder_target(root: Path, study: str | None) -> OptunaTarget:
    """The store of one sweep under a ``storage.path`` folder: its own ``<name>.optuna.db`` or
    ``<name>.optuna.journal``, or the ``optuna.db`` that sweeps shared before."""
    from sweeps.study_store import LEGACY_STORE, stored_studies

    root = root.expanduser().resolve()
    if not root.is_dir():
        raise DashboardError(
            f"no Optuna storage at {root}; a sweep writes it under its storage.path "
            "(give the sweep spec, or --storage with the storage.path folder or a store file)"
        )
    own = sorted(root.glob("*.optuna.db")) + sorted(root.glob("*.optuna.journal"))
    stores = own + [root / LEGACY_STORE] * (root / LEGACY_STORE).is_file()
    if study is not None:
        for file in (root / f"{study}.optuna.db", root / f"{study}.optuna.journal"):
            if file.is_file():
                return _path_target(file, study)
        if (root / LEGACY_STORE).is_file():
            return _path_target(root / LEGACY_STORE, study)
        raise DashboardError(f"no study {study!r} under {root}")
    if not stores:
        raise DashboardError(
            f"no Optuna storage under {root}; a sweep writes one there as <name>.optuna.db or "
            "<name>.optuna.journal (give the sweep spec, or --storage with its storage.path)"
        )
    if len(stores) > 1:
        names: list[str] = []
        for file in stores:
            try:
                names += sorted(stored_studies(file))
            except ValueError:
                continue
        raise DashboardError(
            f"the studies of several sweeps are under {root} ({', '.join(names)}): choose one "
            "with --study NAME, or give its sweep spec"
        )
    return _path_target(stores[0], None)


def optuna_target(
    spec: str | Path | None = None, storage: str | None = None, study: str | None = None
) -> OptunaTarget:
    """Which Optuna storage and study to serve.

    A sweep spec gives both (the store its sweep started with, and its ``name``). Else
    ``storage``: a URL (``sqlite:///...``, ``postgresql://...``), a store file (sqlite or an
    Optuna journal), or a ``storage.path`` folder (default ``sweeps_out``) in which the sweep's
    own store is found (``--study``, or the only one there) or the ``optuna.db`` shared by
    sweeps made before per-sweep stores.

    Raises:
        DashboardError: both a spec and a storage, an invalid spec, a missing storage, a file
            that is not an Optuna storage, a study it does not hold, or a folder holding
            several sweeps' stores and no ``study`` to choose.
    """
    if spec is not None and storage is not None:
        raise DashboardError("give a sweep spec or --storage, not both")
    if spec is not None:
        from flcore.errors import FedSweepError
        from sweeps.spec import load_spec
        from sweeps.study_store import study_location
        from sweeps.sweep import SweepPaths

        try:
            loaded = load_spec(spec)
            paths = SweepPaths(loaded)
            location = study_location(loaded, paths, loaded.ray.address)
        except (FedSweepError, OSError) as err:
            raise DashboardError(f"invalid sweep spec {spec}: {err}") from None
        study = study or loaded.name
        if location.file is None:  # a server database: optuna-dashboard reports its own errors
            return OptunaTarget(location.dashboard_storage, study)
        if not location.file.exists() and paths.legacy_optuna_db.is_file():
            # no record and no own store (its state was removed, say): the shared file of
            # sweeps made before per-sweep stores may still hold the study
            return _file_target(
                paths.legacy_optuna_db, f"sqlite:///{paths.legacy_optuna_db}", study, "sqlite"
            )
        kind = "journal" if location.kind == "journal" else "sqlite"
        return _file_target(location.file, location.dashboard_storage, study, kind)
    if storage is None:
        return _folder_target(DEFAULT_STORAGE_DIR, study)
    path = _sqlite_file(storage)
    if path is not None:
        return _file_target(path, storage, study, "sqlite")
    if "://" in storage:  # a server database: optuna-dashboard reports its own errors
        return OptunaTarget(storage, study)
    given = Path(storage).expanduser()
    if given.is_dir():
        return _folder_target(given, study)
    if not given.is_file():
        raise DashboardError(f"no Optuna storage at {given.resolve()}")
    return _path_target(given, study)


def optuna_dashboard_command(storage: str, port: int) -> list[str]:
    """optuna-dashboard on ``storage`` at 127.0.0.1:``port``.

    Raises:
        DashboardError: the optuna-dashboard program is not installed.
    """
    beside = Path(sys.executable).parent / "optuna-dashboard"
    program = str(beside) if beside.is_file() else shutil.which("optuna-dashboard")
    if program is None:
        raise DashboardError("optuna-dashboard is not installed: pip install optuna-dashboard")
    return [program, "--host", HOST, "--port", str(port), storage]


def group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in process group ``pgid``."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: ask the kernel whether the group exists at all
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state not in ("Z", "X"):
            return True
    return False


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Stop ``proc``'s process group: SIGTERM, wait up to ``timeout``, then SIGKILL; return
    when the leader is reaped and no process of the group is alive."""
    pgid = proc.pid  # the child leads its own group (process_group=0)
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _signal_group(pgid, signal.SIGKILL)
        proc.wait()
    while group_alive(pgid):
        if time.monotonic() > deadline:
            _signal_group(pgid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
        time.sleep(0.1)


def _responds(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # an HTTP answer, even an error, means the server is up
    except (urllib.error.URLError, OSError):
        return False


def serve(
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    ready_url: str | None = None,
    on_ready: Callable[[], None] | None = None,
    stop_timeout: float = 10.0,
) -> int:
    """Run a server until it exits or this process gets SIGINT/SIGTERM.

    The server starts in its own process group; on SIGINT or SIGTERM the whole group is stopped
    (:func:`stop_group`) and 0 is returned. ``on_ready`` is called once ``ready_url`` answers.

    Returns:
        0 after a stop by signal, else the server's own exit status.
    """
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        received.append(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    proc = subprocess.Popen(list(cmd), env=env, process_group=0)
    try:
        ready = ready_url is None
        while proc.poll() is None and not received:
            if not ready and ready_url is not None and _responds(ready_url):
                ready = True
                if on_ready is not None:
                    on_ready()
            time.sleep(0.25)
        if received:
            return 0
        return int(proc.returncode)
    finally:
        stop_group(proc, stop_timeout)  # also after an error here, and for orphans of the leader
        for sig, old in previous.items():
            signal.signal(sig, old)
