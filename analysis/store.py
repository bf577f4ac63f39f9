"""Where runs are stored: the tracking URI, resolved one way for every command, and opening the
MLflow store on it.

Here, not in ``sweeps``, so that the readers (``analysis.load``) and the sweep driver
(``sweeps.tracking`` re-exports these) share them without ``analysis`` importing ``sweeps``.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["mlflow_client", "resolve_tracking_uri", "sqlite_path", "tracking_uri"]


def resolve_tracking_uri(uri: str | None = None) -> str:
    """The tracking URI, resolved one way for every command (``sweep``, ``run``, ``export``,
    ``pareto``, ``query``, ``report``, ``ui``): ``uri`` (a sweep spec's ``tracking.uri``), else
    ``MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlflow.db``. A relative sqlite path (or a
    bare path) is made absolute here, once: Ray's workers change directory, and a command run
    from elsewhere must still find the store."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{Path(uri[len('sqlite:///') :]).resolve()}"
    if "://" not in uri:
        return str(Path(uri).resolve())
    return uri


def tracking_uri() -> str:
    """:func:`resolve_tracking_uri` with nothing configured: the environment's, else the sqlite
    store in the working directory."""
    return resolve_tracking_uri(None)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` tracking URI, else None."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :])
    return None


@contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes, also if we die
        yield


def mlflow_client(uri: str | None = None, *, initialize: bool = True) -> Any:
    """An MlflowClient on the project's store (telemetry and artifact progress bars off).

    MLflow builds a new sqlite store's schema on first use with a chain of migrations, and two
    processes doing that at once on one new file fail (measured: 17 of 20 openings by 4
    concurrent processes). So the first use of a sqlite store here happens under an exclusive
    lock on ``<db>.lock`` beside it; once built, the schema is only read. ``initialize=False``
    skips that (a reader of an existing store, which must not create files).
    """
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    # a tqdm bar for every artifact read (a report reads one per attacked run) says nothing the
    # commands do not say; set the variable to true to have them back
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.tracking import MlflowClient

    uri = uri or tracking_uri()
    path = sqlite_path(uri)
    if not initialize or path is None:
        return MlflowClient(tracking_uri=uri)
    with _exclusive(path.with_name(path.name + ".lock")):
        return MlflowClient(tracking_uri=uri)  # builds the schema, one process at a time
