"""Shared fixtures: one real Fashion-MNIST data root per test session, tiny experiment configs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, one torch thread per worker: three workers on 2 cores with torch's
    default (a thread per core) would oversubscribe them. Subprocesses keep their defaults.

    The benchmark scripts' records of ended runs (benchmarks/_runs.py) go to a temporary folder,
    never into the repository's benchmarks/records/, unless a test names its own."""
    os.environ.setdefault("FEDSWEEP_RECORDS", tempfile.mkdtemp(prefix="fedsweep-records-"))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root shared by the session; Fashion-MNIST is unpacked into it on first use."""
    root = Path(os.environ.get("FEDSWEEP_TEST_DATA_ROOT") or tmp_path_factory.mktemp("data"))
    os.environ["FEDSWEEP_DATA_ROOT"] = str(root)
    return root


@pytest.fixture(scope="session")
def fmnist(data_root: Path):
    """The real Fashion-MNIST splits (60k/10k), loaded once."""
    from flcore.data import load_dataset

    return load_dataset("fmnist", data_root)


@pytest.fixture
def tiny_config(data_root: Path, tmp_path: Path) -> dict[str, Any]:
    """A 2-round FedAvg run on a small real FMNIST subset: 4 clients x 100 samples."""
    return {
        "experiment": "tests",
        "algorithm": "fedavg",
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 4,
        "samples_per_client": 100,
        "test_samples_per_client": 100,
        "rounds": 2,
        "local_epochs": 1,
        "batch_size": 50,
        "lr": 0.05,
        "eval_every": 1,
        "seed": 3,
        "workers": 1,
        "output_dir": str(tmp_path / "runs"),
        "partition": {"name": "dominant", "s": 20},
    }


#: the integration tests that take longest, run first so that they do not end a parallel run
#: (``make test``: ``pytest -n 3 --dist load --maxschedchunk 1``, which hands tests out one at a
#: time in this order) alone
_LONG_FIRST = (
    "test_multihost.py",
    "test_sweep_faults.py",
    "test_sweep.py",
    "test_tracking_outage.py",
    "test_console.py",
    "test_tracking_server.py",
    "test_resume_spec.py",
    "test_attack_cli.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Integration tests first (the longest files first), then the unit and contract tests, which
    fill the other workers meanwhile; the order is the same in every xdist worker."""

    def rank(item: pytest.Item) -> tuple[int, int]:
        if "integration" not in item.path.parts:
            return (2, 0)
        name = item.path.name
        return (0, _LONG_FIRST.index(name)) if name in _LONG_FIRST else (1, 0)

    items.sort(key=rank)  # stable: each file keeps its own order
