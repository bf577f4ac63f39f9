"""The sweep's pre-flight checks on its tracking store: the URI is one MLflow reads, and the store
answers. (The storage-shared check runs on a real two-node Ray cluster in
tests/integration/test_storage_shared.py.)"""

from __future__ import annotations

import socket
import time

import pytest

from flcore.errors import ConfigError
from sweeps.preflight import check_tracking_reachable, check_tracking_uri


def _closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("postgres://u@127.0.0.1:5432/mlflow", "write postgresql://"),
        ("postgres+psycopg2://u@h/db", "write postgresql://"),
        ("ftp://example.org/runs", "ftp://"),
        ("postgresql+nosuchdriver://u@h/db", "not installed"),
        ("postgresql://u:secret@h/db", "password"),
    ],
)
def test_bad_tracking_uris_are_named(uri: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_tracking_uri(uri)
    assert err.value.key == "tracking.uri"
    assert says in str(err.value)


@pytest.mark.parametrize(
    "uri",
    [
        "http://127.0.0.1:5000",
        "https://mlflow.example.org",
        "sqlite:////tmp/x/mlflow.db",
        "postgresql://mlflow@db.example.org:5432/mlflow",
        "postgresql+psycopg2://mlflow@db/mlflow",
        "file:///tmp/mlruns",
        "/tmp/mlruns",
    ],
)
def test_good_tracking_uris_pass(uri: str) -> None:
    assert check_tracking_uri(uri) == uri


def test_a_password_is_fine_outside_the_spec() -> None:
    """MLFLOW_TRACKING_URI is not logged with the spec: a password there is the user's choice."""
    uri = "postgresql://u:secret@h/db"
    assert check_tracking_uri(uri, key="MLFLOW_TRACKING_URI", in_spec=False) == uri


def test_a_server_that_does_not_answer_is_named_quickly() -> None:
    port = _closed_port()
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        check_tracking_reachable(f"http://127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in str(err.value) and "does not answer" in str(err.value)
    assert time.perf_counter() - start < 30


def test_a_database_that_refuses_is_named_without_its_password() -> None:
    port = _closed_port()
    with pytest.raises(ConfigError) as err:
        check_tracking_reachable(f"postgresql://u:topsecret@127.0.0.1:{port}/mlflow")
    text = str(err.value)
    assert "cannot connect to the tracking database" in text
    assert "topsecret" not in text and f"127.0.0.1:{port}" in text


def test_a_sqlite_store_only_needs_its_folder(tmp_path) -> None:
    check_tracking_reachable(f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}")
    assert (tmp_path / "new").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="cannot create the sqlite store's folder"):
        check_tracking_reachable(f"sqlite:///{blocker / 'sub' / 'mlflow.db'}")
