"""A dataset split among clients: shared uint8 tensors plus index partitions.

Clients never copy the dataset: :class:`FederatedData` holds the loaded splits once and each
client's view is an ``index_select`` on them. The train partition comes from a registered
partitioner; each client's test set follows its own train label distribution (FedHKD's and
HyperFL's "local test accuracy"), and a class-balanced global test set serves global accuracy.
The three draws use independent seeds derived from the one ``seed``.

With a ``client_split`` (train, val, test fractions), each client's own records are cut by a
seeded permutation into its train, validation and test sets instead (Pa3dFL's 0.8/0.1/0.1 of
600 records per client; FedHKD's 0.75/0.25): the client's test and validation records then come
from the dataset's train split, disjoint from its training records and from other clients'.
Counts are ``round(val x n)`` and ``round(test x n)``, the rest training.

With ``public_samples`` (FedMD's public set), that many training-split records that no client
holds are drawn, seeded, after the clients' draw: the clients' records are the same with or
without a public set, and the public set is disjoint from every client's train, validation and
test records by construction (it is drawn from the complement of their union); a size larger
than what is left is a ConfigError. Every client sees the same public set.
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
    #: per-client validation indices (into the train split); None without a client split
    val: Partition | None = None
    #: where ``test`` indexes: "test" (the test split) or "train" (a client split's own records)
    test_source: str = "test"
    #: the public set's indices into the train split (held by no client), or None
    public: np.ndarray | None = None

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
        """Client ``i``'s local test samples: drawn with its train label distribution, or its
        own held-out records under a client split."""
        source = self.splits.train if self.test_source == "train" else self.splits.test
        return _subset(source, self.test.client_indices[i])

    def client_val(self, i: int) -> ArrayDataset | None:
        """Client ``i``'s validation records (a client split's), or None."""
        if self.val is None or self.val.client_indices[i].size == 0:
            return None
        return _subset(self.splits.train, self.val.client_indices[i])

    def public_set(self) -> ArrayDataset | None:
        """The public set every client sees (FedMD's), or None without one."""
        if self.public is None:
            return None
        return _subset(self.splits.train, self.public)

    def clients_train_set(self) -> ArrayDataset:
        """Every client's training records, client after client (a record two clients hold
        appears twice): what a server querying each client in turn would be told about."""
        return _subset(self.splits.train, np.concatenate(list(self.train.client_indices)))

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


def _split_clients(
    train: Partition, fractions: tuple[float, float, float], seed: int
) -> tuple[Partition, Partition, Partition]:
    rng = np.random.default_rng(seed)
    parts: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]] = ([], [], [])
    for i, idx in enumerate(train.client_indices):
        n = idx.size
        n_val, n_test = round(fractions[1] * n), round(fractions[2] * n)
        n_train = n - n_val - n_test
        if n_train < 1 or (fractions[2] > 0 and n_test < 1):
            raise ConfigError(
                "client_split",
                f"client {i} has {n} records: too few for train {n_train}, test {n_test}",
            )
        perm = idx[rng.permutation(n)]
        parts[0].append(np.sort(perm[:n_train]))
        parts[1].append(np.sort(perm[n_train : n_train + n_val]))
        parts[2].append(np.sort(perm[n_train + n_val :]))
    return Partition(tuple(parts[0])), Partition(tuple(parts[1])), Partition(tuple(parts[2]))


def _public_indices(
    n_train: int, clients: Partition, size: int | None, seed: int
) -> np.ndarray | None:
    """``size`` train-split indices held by no client (seeded, sorted, read-only), or None."""
    if size is None:
        return None
    size = _size("public_samples", size, 0)
    taken = np.zeros(n_train, dtype=bool)
    for idx in clients.client_indices:
        taken[idx] = True
    free = np.flatnonzero(~taken)
    if size > free.size:
        raise ConfigError(
            "public_samples",
            f"{size} public records asked for, but only {free.size} of the {n_train} training "
            "records are left after the clients' draw",
        )
    public = np.sort(np.random.default_rng(seed).choice(free, size=size, replace=False))
    public.setflags(write=False)
    return public


def build_federated_data(
    splits: DatasetSplits,
    *,
    num_clients: int,
    samples_per_client: int | None,
    test_samples_per_client: int | None,
    partition: str,
    partition_params: Mapping[str, Any],
    seed: int,
    client_split: tuple[float, float, float] | None = None,
    global_test_per_class: int | None = None,
    public_samples: int | None = None,
) -> FederatedData:
    """Partition ``splits`` among ``num_clients`` clients.

    ``None`` sizes take the dataset's defaults (:class:`DatasetInfo`). ``client_split`` (train,
    val, test fractions) cuts each client's records into its own three sets; the test-size
    argument is then unused. ``global_test_per_class`` caps the global test set.
    ``public_samples`` draws a public set of that size from the training records no client
    holds (None: none). The ``dominant`` partitioner receives ``groups=info.class_groups``
    unless ``partition_params`` sets them.

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
    public = _public_indices(len(train_labels), train, public_samples, derive_seed(seed, 5))
    if client_split is not None:
        tr, va, te = _split_clients(train, client_split, derive_seed(seed, 4))
        global_test = uniform_test_indices(
            test_labels,
            info.num_classes,
            seed=derive_seed(seed, 2),
            per_class=global_test_per_class,
        )
        global_test.setflags(write=False)
        return FederatedData(
            splits, tr, te, global_test, partition, val=va, test_source="train", public=public
        )
    test = client_test_indices(
        test_labels,
        train.label_counts(train_labels, info.num_classes),
        _size("test_samples_per_client", test_samples_per_client, info.test_samples_per_client),
        seed=derive_seed(seed, 1),
    )
    global_test = uniform_test_indices(
        test_labels, info.num_classes, seed=derive_seed(seed, 2), per_class=global_test_per_class
    )
    global_test.setflags(write=False)
    return FederatedData(splits, train, test, global_test, partition, public=public)
