"""One real MLflow store per session for the analysis tests (see store.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.integration.analysis.store import Store, build_store


@pytest.fixture(scope="session")
def store(data_root: Path, fmnist: Any, tmp_path_factory: pytest.TempPathFactory) -> Store:
    """Built once per session (about a minute); ``FEDSWEEP_TEST_ANALYSIS_STORE=DIR`` keeps it in
    DIR and reuses it in later sessions (for working on these tests; tests only read it)."""
    keep = os.environ.get("FEDSWEEP_TEST_ANALYSIS_STORE")
    if keep:
        root = Path(keep)
        reused = Store.reuse(root)
        if reused is not None:
            return reused
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("analysis-store")
    return build_store(root, data_root, fmnist)


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Where tests keep what a person should look at (screenshots): $FEDSWEEP_TEST_ARTIFACTS,
    else test-artifacts/ at the repository root (ignored by git)."""
    root = Path(__file__).resolve().parents[3]
    path = Path(os.environ.get("FEDSWEEP_TEST_ARTIFACTS") or root / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path
