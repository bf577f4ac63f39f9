"""Shared fixtures: one real Fashion-MNIST data root per test session, tiny experiment configs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


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
