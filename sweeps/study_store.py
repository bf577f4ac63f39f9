"""Where a sweep's Optuna study lives, how it is opened, and which studies a store holds.

Each sweep has its own store under ``storage.path``, chosen by ``storage.optuna``:

- ``sqlite``: ``<storage.path>/<name>.optuna.db`` (Optuna's RDBStorage). The default when
  fedsweep starts Ray itself.
- ``journal``: ``<storage.path>/<name>.optuna.journal`` (Optuna's JournalStorage on a
  JournalFileBackend, with its default symlink lock). The default on a cluster address
  (``--address`` or ``ray.address``): the cluster guide puts ``storage.path`` on NFS, where
  sqlite's ``fcntl`` locks are unreliable and the file can be corrupted (optuna#815); the
  journal backend is Optuna's store for NFS.
- an RDB URL (``postgresql://``, ``mysql://``, ``sqlite:///``): a database that may hold many
  studies, the sweep's named after it.

Decisions:

- The store is chosen once, when the sweep starts, and kept in its spec record
  (:mod:`sweeps.spec_record`); a resume (or ``fedsweep ui --optuna``) reads it from there, so a
  sweep started locally and resumed with ``--address`` keeps its sqlite study rather than
  starting an empty journal.
- A sweep made before per-sweep stores (it has state but no record) kept its study in the file
  ``<storage.path>/optuna.db`` shared by every sweep there: that "legacy" store is used for it.
- Reading which studies a file holds never creates or changes anything (dashboards, dry runs).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from flcore.errors import ConfigError
from sweeps.fast_sqlite import fast_commits
from sweeps.spec_record import read_record

if TYPE_CHECKING:
    from sweeps.spec import SweepSpec
    from sweeps.sweep import SweepPaths

__all__ = [
    "LEGACY_STORE",
    "StudyLocation",
    "default_choice",
    "holds_study",
    "open_storage",
    "stored_studies",
    "study_location",
]

LEGACY_STORE = "optuna.db"  # before per-sweep stores: one sqlite file for every sweep
SQLITE_HEADER = b"SQLite format 3\x00"


@dataclass(frozen=True)
class StudyLocation:
    """An Optuna store: ``kind`` and ``target`` (a ``sqlite:///`` URL for sqlite, legacy and
    sqlite RDB URLs; the file's path for a journal; the URL for a database server)."""

    kind: Literal["sqlite", "journal", "rdb", "legacy"]
    target: str

    @property
    def file(self) -> Path | None:
        """The store's file, or None for a database server."""
        if self.kind == "journal":
            return Path(self.target)
        if self.target.startswith("sqlite:///"):
            return Path(self.target[len("sqlite:///") :])
        return None

    @property
    def dashboard_storage(self) -> str:
        """What optuna-dashboard (0.21) takes: a URL, or a journal file's path (it reads any
        existing file without the sqlite header as a journal)."""
        return self.target

    def describe(self) -> str:
        return {
            "sqlite": f"sqlite (one file per sweep): {self.target}",
            "journal": f"journal file (one per sweep): {self.target}",
            "legacy": f"sqlite shared by the sweeps made before per-sweep stores: {self.target}",
            "rdb": f"database: {self.target}",
        }[self.kind]


def default_choice(spec: SweepSpec, address: str | None) -> str:
    """``storage.optuna``, else ``journal`` on a cluster address, else ``sqlite``."""
    if spec.storage.optuna is not None:
        return spec.storage.optuna
    return "journal" if (address or spec.ray.address) else "sqlite"


def _location(choice: str, paths: SweepPaths) -> StudyLocation:
    if choice == "sqlite":
        return StudyLocation("sqlite", f"sqlite:///{paths.optuna_db}")
    if choice == "journal":
        return StudyLocation("journal", str(paths.optuna_journal))
    if choice == "legacy":
        return StudyLocation("legacy", f"sqlite:///{paths.legacy_optuna_db}")
    return StudyLocation("rdb", choice)


def study_location(
    spec: SweepSpec, paths: SweepPaths, address: str | None, *, fresh: bool = False
) -> StudyLocation:
    """Where the study of ``spec``'s sweep is: the store its spec record names, else (a sweep
    made before records) the legacy shared file; with ``fresh`` or for a sweep not started yet,
    where a new one would put it. Creates nothing.
    """
    if not fresh:
        record = read_record(paths.spec_record)
        if record is not None:
            return _location(record.optuna, paths)
        if paths.made:
            return _location("legacy", paths)
    return _location(default_choice(spec, address), paths)


def holds_study(location: StudyLocation, name: str) -> bool:
    """Whether the store holds a study ``name`` (files are only read; a database server is
    connected to, which creates Optuna's tables there if missing)."""
    file = location.file
    if file is not None:
        if not file.is_file():
            return False
        try:
            return name in stored_studies(file)
        except ValueError:
            return False
    try:
        return name in {s.study_name for s in open_storage(location).get_all_studies()}
    except Exception as err:  # SQLAlchemy's errors (unreachable server, refused login, ...)
        raise ConfigError("storage.optuna", f"cannot open {location.target}: {err}") from None


def open_storage(location: StudyLocation) -> Any:
    """The ``optuna.storages.BaseStorage`` for ``location`` (creating its file if need be)."""
    import optuna

    file = location.file
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
    if location.kind == "journal":
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(str(file)))
    if file is not None:  # a driver waits for sqlite's lock rather than failing at once
        fast_commits(file)  # the driver's asks and tells on Tune's loop (sweeps.fast_sqlite)
        return optuna.storages.RDBStorage(
            location.target, engine_kwargs={"connect_args": {"timeout": 60}}
        )
    if location.target.startswith("postgresql"):
        # a commit returns before the server's WAL flush: a server crash may lose the last
        # transactions, never corrupt (the driver's asks and tells on Tune's loop: BENCHMARKS)
        return optuna.storages.RDBStorage(
            location.target,
            engine_kwargs={"connect_args": {"options": "-c synchronous_commit=off"}},
        )
    return optuna.storages.RDBStorage(location.target)


def stored_studies(
    file: Path, *, kind: Literal["sqlite", "journal"] | None = None
) -> dict[str, int]:
    """Study names and ids in an Optuna sqlite or journal file (``kind``, else told by the
    sqlite header), read without changing it.

    Raises:
        ValueError: the file is not an Optuna store of that kind.
    """
    if kind is None:
        with file.open("rb") as f:
            kind = "sqlite" if f.read(len(SQLITE_HEADER)) == SQLITE_HEADER else "journal"
    if kind == "sqlite":
        try:
            with sqlite3.connect(f"file:{file}?mode=ro", uri=True) as conn:
                rows = conn.execute("SELECT study_name, study_id FROM studies").fetchall()
        except sqlite3.Error as err:
            raise ValueError(f"{file} is not an Optuna storage: {err}") from None
        return {str(name): int(i) for name, i in rows}
    return _journal_studies(file)


def _journal_studies(file: Path) -> dict[str, int]:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    if file.stat().st_size == 0:
        return {}
    try:
        # JournalFileBackend opens the (existing) file for appending only to create a missing
        # one, and replaying takes no lock: nothing is written.
        storage = optuna.storages.JournalStorage(JournalFileBackend(str(file)))
        return {s.study_name: s._study_id for s in storage.get_all_studies()}
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{file} is not an Optuna storage: {err}") from None
