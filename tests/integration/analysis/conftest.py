"""One real MLflow store per session for the analysis tests (see store.py)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

from tests.integration.analysis.store import Store, build_store


@pytest.fixture(scope="session")
def store(data_root: Path, fmnist: Any, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """Built once per test run (about a minute), shared by the xdist workers;
    ``FEDSWEEP_TEST_ANALYSIS_STORE=DIR`` keeps it in DIR and reuses it in later sessions (for
    working on these tests; tests only read it)."""
    keep = os.environ.get("FEDSWEEP_TEST_ANALYSIS_STORE")
    if keep:
        root = Path(keep)
        reused = Store.reuse(root)
        if reused is not None:
            return reused
        root.mkdir(parents=True, exist_ok=True)
        return build_store(root, data_root, fmnist)
    # Under pytest-xdist every worker is a session of its own: the first to get here builds the
    # store in the run's shared temp folder (under a lock), the others wait and reuse it.
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    root = shared / "analysis-store"
    root.mkdir(parents=True, exist_ok=True)
    with (shared / "analysis-store.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        reused = Store.reuse(root)
        return reused if reused is not None else build_store(root, data_root, fmnist)


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests keep what a person should look at (screenshots): $FEDSWEEP_TEST_ARTIFACTS,
    else test-artifacts/ at the repository root (ignored by git)."""
    root = Path(__file__).resolve().parents[3]
    path = Path(os.environ.get("FEDSWEEP_TEST_ARTIFACTS") or root / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path
