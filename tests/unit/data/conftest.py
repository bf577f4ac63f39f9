"""Real Fashion-MNIST, loaded once per test session into a fresh data root."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flcore.data import DatasetSplits, load_dataset
from flcore.data import datasets as datasets_module
from flcore.errors import DataNotFoundError


@pytest.fixture(scope="session")
def fmnist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fedsweep-data")


@pytest.fixture(scope="session")
def fmnist(fmnist_root: Path) -> DatasetSplits:
    """Fashion-MNIST unpacked from Debian's dataset-fashion-mnist into a fresh root."""
    if not datasets_module.DEBIAN_FASHION_MNIST_DIR.is_dir():
        pytest.skip(
            f"needs Debian's dataset-fashion-mnist: {datasets_module.DEBIAN_INSTALL_COMMAND}"
        )
    try:
        return load_dataset("fmnist", fmnist_root)
    except DataNotFoundError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def fmnist_train_labels(fmnist: DatasetSplits) -> np.ndarray:
    return fmnist.train.labels.numpy()


@pytest.fixture(scope="session")
def fmnist_test_labels(fmnist: DatasetSplits) -> np.ndarray:
    return fmnist.test.labels.numpy()
