"""One Optuna store per sweep: sqlite locally, a journal file on a cluster, or a database URL;
the store a sweep started with wherever it resumes; the shared file of older sweeps."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import optuna
import pytest

from sweeps.spec import SweepSpec, validate_spec
from sweeps.spec_record import resolved_spec, write_record
from sweeps.study_store import stored_studies, study_location
from sweeps.sweep import SweepPaths, plan, study_storage


@pytest.fixture(autouse=True)
def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _spec(tmp_path: Path, name: str = "s", **over: Any) -> SweepSpec:
    raw = {
        "name": name,
        "base": {"rounds": 2},
        "algorithms": ["fedavg"],
        "objectives": {"accuracy": "max"},
        "storage": {"path": str(tmp_path / "out")},
    }
    return validate_spec(raw | over)


def _study(storage: Any, name: str = "s", trials: int = 2) -> optuna.Study:
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=trials)
    return study


def test_locally_each_sweep_has_its_own_sqlite_file(tmp_path: Path) -> None:
    a, b = _spec(tmp_path, "a"), _spec(tmp_path, "b")

    _study(study_storage(a, SweepPaths(a), None), "a")
    _study(study_storage(b, SweepPaths(b), None), "b", trials=1)

    out = tmp_path / "out"
    # (sqlite's write-ahead log and its index lie beside an open store: not stores)
    stores = sorted(p.name for p in out.iterdir() if not p.name.endswith(("-wal", "-shm")))
    assert stores == ["a.optuna.db", "b.optuna.db"]
    assert stored_studies(out / "a.optuna.db") == {"a": 1}
    assert not (out / "optuna.db").exists()


def test_on_a_cluster_address_the_study_is_a_journal_file(tmp_path: Path) -> None:
    on_cli = _spec(tmp_path)
    in_spec = _spec(tmp_path, "t", ray={"address": "10.0.0.1:6379"})

    storage = study_storage(on_cli, SweepPaths(on_cli), "auto")
    _study(storage)
    journal = tmp_path / "out" / "s.optuna.journal"
    size = journal.stat().st_size

    assert isinstance(storage, optuna.storages.JournalStorage)
    assert study_location(in_spec, SweepPaths(in_spec), None).kind == "journal"
    assert stored_studies(journal) == {"s": 0}
    assert journal.stat().st_size == size and not Path(f"{journal}.lock").exists()  # only read
    # Tune pickles the searcher, storage included, and unpickles it on resume
    again = pickle.loads(pickle.dumps(storage))
    assert len(optuna.load_study(study_name="s", storage=again).trials) == 2


def test_storage_optuna_chooses_explicitly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'team.db'}"
    journal = _spec(tmp_path, storage={"path": str(tmp_path / "out"), "optuna": "journal"})
    rdb = _spec(tmp_path, storage={"path": str(tmp_path / "out"), "optuna": url})
    local = _spec(tmp_path, storage={"path": str(tmp_path / "out"), "optuna": "sqlite"})

    assert study_location(journal, SweepPaths(journal), None).kind == "journal"
    assert study_location(local, SweepPaths(local), "auto").kind == "sqlite"
    storage = study_storage(rdb, SweepPaths(rdb), "auto")
    _study(storage)
    assert isinstance(storage, optuna.storages.RDBStorage)
    assert stored_studies(tmp_path / "team.db") == {"s": 1}


def _made(spec: SweepSpec, optuna_store: str | None) -> SweepPaths:
    """A started sweep: its state file, and its record unless it predates records."""
    paths = SweepPaths(spec)
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.state.write_text(json.dumps({"parent_run_id": "0" * 32, "trials": {}}))
    if optuna_store is not None:
        tree = resolved_spec(spec, tracking_uri="sqlite:////x/mlflow.db", experiment="e")
        write_record(paths.spec_record, tree, optuna_store)
    return paths


def test_a_resume_keeps_the_store_the_sweep_started_with(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    paths = _made(spec, "sqlite")  # started locally
    _study(study_storage(spec, paths, None))

    on_cluster = study_storage(spec, paths, "auto")  # resumed with --address

    assert isinstance(on_cluster, optuna.storages.RDBStorage)
    assert len(optuna.load_study(study_name="s", storage=on_cluster).trials) == 2
    assert not paths.optuna_journal.exists()


def test_a_sweep_made_before_per_sweep_stores_resumes_from_the_shared_file(
    tmp_path: Path,
) -> None:
    spec = _spec(tmp_path)
    paths = _made(spec, None)
    _study(f"sqlite:///{paths.legacy_optuna_db}")
    _study(f"sqlite:///{paths.legacy_optuna_db}", "another-sweep", trials=1)

    storage = study_storage(spec, paths, None)

    assert len(optuna.load_study(study_name="s", storage=storage).trials) == 2
    assert "optuna.db" in plan(spec)["optuna_storage"] and not paths.optuna_db.exists()


def test_the_dry_run_names_the_store_and_creates_nothing(tmp_path: Path) -> None:
    spec = _spec(tmp_path)

    local, cluster = plan(spec), plan(spec, address="auto")

    assert local["optuna_storage"].endswith(f"{tmp_path / 'out' / 's.optuna.db'}")
    assert cluster["optuna_storage"].endswith(f"{tmp_path / 'out' / 's.optuna.journal'}")
    assert list(tmp_path.iterdir()) == []


def test_local_filesystem_reads_the_mount_that_holds_the_file() -> None:
    from sweeps.fast_sqlite import local_filesystem

    mounts = [
        "/dev/vda / ext4 rw 0 0",
        "server:/export /mnt/shared nfs4 rw 0 0",
        "sshfs#me@host: /mnt/fuse fuse.sshfs rw 0 0",
        "tmpfs /mnt/my\\040disk tmpfs rw 0 0",
    ]
    assert local_filesystem(Path("/home/me/s.db"), mounts)
    assert not local_filesystem(Path("/mnt/shared/sweeps/s.db"), mounts)
    assert not local_filesystem(Path("/mnt/fuse/s.db"), mounts)
    assert local_filesystem(Path("/mnt/my disk/s.db"), mounts)
    assert not local_filesystem(Path("/x/s.db"), [])  # cannot tell: not local


def test_a_local_sqlite_study_store_commits_to_a_write_ahead_log(tmp_path: Path) -> None:
    """Asks and tells on Tune's loop commit without waiting for the disk (BENCHMARKS.md):
    the file is in WAL mode, each connection at synchronous NORMAL, and still a study."""
    import sqlite3

    import optuna

    from sweeps.study_store import StudyLocation, open_storage

    location = StudyLocation("sqlite", f"sqlite:///{tmp_path / 's.optuna.db'}")
    storage = open_storage(location)
    study = optuna.create_study(storage=storage, study_name="s", directions=["maximize"])
    trial = study.ask()
    trial.suggest_float("lr", 1e-3, 1.0, log=True)
    study.tell(trial, 0.5)
    with storage.engine.connect() as conn:
        sync = conn.exec_driver_sql("PRAGMA synchronous").scalar()
    assert sync == 1  # NORMAL
    mode = sqlite3.connect(tmp_path / "s.optuna.db").execute("PRAGMA journal_mode").fetchone()
    assert mode[0] == "wal"
    reopened = optuna.load_study(study_name="s", storage=open_storage(location))
    assert [t.value for t in reopened.trials] == [0.5]


def test_the_drivers_mlflow_store_commits_to_a_write_ahead_log(tmp_path: Path) -> None:
    """The same for the driver's MLflow sqlite store: registered before the client opens it,
    every connection of this process to that file (and only to it) runs at NORMAL."""
    import sqlite3

    from sqlalchemy import create_engine

    from analysis.store import mlflow_client
    from sweeps.fast_sqlite import fast_commits

    db = tmp_path / "mlflow.db"
    assert fast_commits(db)
    client = mlflow_client(f"sqlite:///{db}")
    client.create_experiment("e")
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    ours, other = create_engine(f"sqlite:///{db}"), create_engine(f"sqlite:///{tmp_path / 'o.db'}")
    with ours.connect() as a, other.connect() as b:
        assert a.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        assert b.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL, sqlite's default
    assert client.get_experiment_by_name("e") is not None  # the store works
