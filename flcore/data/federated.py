"""A dataset split among clients: shared uint8 tensors plus index partitions.

Clients never copy the dataset: :class:`FederatedData` holds the loaded splits once and each
client's view is an ``index_select`` on them. The train partition comes from a registered
partitioner; each client's test set follows its own train label distribution (FedHKD's and
HyperFL's "local test accuracy"), and a class-balanced global test set serves global accuracy.
The three draws use independent seeds derived from the one ``seed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flcore.data.datasets import ArrayDataset, DatasetInfo, DatasetSplits
from flcore.data.partition import (
    PARTITIONERS,
    Partition,
    client_test_indices,
    uniform_test_indices,
)
from flcore.errors import ConfigError

__all__ = ["FederatedData", "build_federated_data", "derive_seed"]


def derive_seed(seed: int, stream: int) -> int:
    """An independent seed for sub-stream ``stream`` of ``seed`` (NumPy SeedSequence mixing).

    ``seed + 1`` would make one run's test stream equal to the next seed's train stream.
    """
    return int(np.random.SeedSequence([seed, stream]).generate_state(1, np.uint64)[0])


def _subset(data: ArrayDataset, indices: np.ndarray) -> ArrayDataset:
    index = torch.tensor(indices, dtype=torch.int64)
    return ArrayDataset(data.images.index_select(0, index), data.labels.index_select(0, index))


@dataclass(frozen=True, eq=False)
class FederatedData:
    """The loaded splits and, per client, which train and test samples it holds."""

    splits: DatasetSplits
    train: Partition
    test: Partition
    global_test: np.ndarray
    partition_name: str

    @property
    def info(self) -> DatasetInfo:
        return self.splits.info

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    def client_train(self, i: int) -> ArrayDataset:
        """Client ``i``'s training samples (a copy gathered from the shared tensors)."""
        return _subset(self.splits.train, self.train.client_indices[i])

    def client_test(self, i: int) -> ArrayDataset:
        """Client ``i``'s local test samples, drawn with its train label distribution."""
        return _subset(self.splits.test, self.test.client_indices[i])

    def global_test_set(self) -> ArrayDataset:
        """The class-balanced global test set."""
        return _subset(self.splits.test, self.global_test)

    @property
    def overlap(self) -> dict[str, int]:
        """How many index slots repeat a sample already handed out, per split."""
        return {"train_reused": self.train.reused, "test_reused": self.test.reused}


def _size(key: str, value: int | None, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(key, f"must be a positive integer, got {value!r}")
    return int(value)


def build_federated_data(
    splits: DatasetSplits,
    *,
    num_clients: int,
    samples_per_client: int | None,
    test_samples_per_client: int | None,
    partition: str,
    partition_params: Mapping[str, Any],
    seed: int,
) -> FederatedData:
    """Partition ``splits`` among ``num_clients`` clients.

    ``None`` sizes take the dataset's defaults (:class:`DatasetInfo`). The ``dominant``
    partitioner receives ``groups=info.class_groups`` unless ``partition_params`` sets them.

    Raises:
        UnknownNameError: ``partition`` is not a registered partitioner.
        ConfigError: a size or partition parameter is invalid.
    """
    info = splits.info
    partitioner = PARTITIONERS.get(partition)
    params = dict(partition_params)
    if partition == "dominant":
        params.setdefault("groups", info.class_groups)
    train_labels = splits.train.labels.numpy()
    test_labels = splits.test.labels.numpy()
    train = partitioner(
        train_labels,
        num_clients=num_clients,
        samples_per_client=_size("samples_per_client", samples_per_client, info.samples_per_client),
        num_classes=info.num_classes,
        seed=seed,
        **params,
    )
    test = client_test_indices(
        test_labels,
        train.label_counts(train_labels, info.num_classes),
        _size("test_samples_per_client", test_samples_per_client, info.test_samples_per_client),
        seed=derive_seed(seed, 1),
    )
    global_test = uniform_test_indices(test_labels, info.num_classes, seed=derive_seed(seed, 2))
    global_test.setflags(write=False)
    return FederatedData(splits, train, test, global_test, partition)
