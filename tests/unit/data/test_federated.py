"""The federated view: partitions wired to the shared tensors with derived seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flcore.data import DatasetSplits, FederatedData, build_federated_data, derive_seed
from flcore.errors import ConfigError, UnknownNameError


def test_dominant_federation_on_fmnist(fmnist: DatasetSplits) -> None:
    data = build_federated_data(
        fmnist,
        num_clients=20,
        samples_per_client=None,
        test_samples_per_client=None,
        partition="dominant",
        partition_params={},
        seed=0,
    )

    first = data.client_train(0)
    assert data.num_clients == 20 and data.info.name == "fmnist"
    assert len(first) == 600 and len(data.client_test(0)) == 600  # DatasetInfo defaults
    index = torch.tensor(data.train.client_indices[0])
    assert torch.equal(first.images, fmnist.train.images[index])
    assert first.labels.bincount(minlength=10).tolist() == [172, 172, 172] + [12] * 7
    assert data.client_test(0).labels.bincount(minlength=10).tolist() == [172] * 3 + [12] * 7
    assert data.overlap == {"train_reused": 0, "test_reused": 2600}
    assert len(data.global_test_set()) == 10000
    assert data.partition_name == "dominant"


def test_sizes_params_and_seed_are_honoured(fmnist: DatasetSplits) -> None:
    def build(seed: int) -> FederatedData:
        return build_federated_data(
            fmnist,
            num_clients=10,
            samples_per_client=200,
            test_samples_per_client=50,
            partition="dirichlet",
            partition_params={"beta": 0.5},
            seed=seed,
        )

    a, b, c = build(7), build(7), build(8)
    assert a.train.sizes.tolist() == [200] * 10 and a.test.sizes.tolist() == [50] * 10
    assert all(
        np.array_equal(x, y)
        for x, y in zip(a.test.client_indices, b.test.client_indices, strict=True)
    )
    assert not np.array_equal(a.train.client_indices[0], c.train.client_indices[0])


def test_derived_seeds_differ_from_neighbouring_seeds() -> None:
    seeds = {derive_seed(s, stream) for s in range(50) for stream in (1, 2)}
    assert len(seeds) == 100 and not seeds & set(range(50))


def test_bad_arguments_are_rejected(fmnist: DatasetSplits) -> None:
    common = {"samples_per_client": None, "test_samples_per_client": None, "seed": 0}
    with pytest.raises(UnknownNameError, match="dominant"):
        build_federated_data(
            fmnist, num_clients=5, partition="shards", partition_params={}, **common
        )
    with pytest.raises(ConfigError) as info:
        build_federated_data(fmnist, num_clients=0, partition="iid", partition_params={}, **common)
    assert info.value.key == "num_clients"
    with pytest.raises(ConfigError) as info:
        build_federated_data(
            fmnist,
            num_clients=5,
            samples_per_client=100,
            test_samples_per_client=0,
            partition="iid",
            partition_params={},
            seed=0,
        )
    assert info.value.key == "test_samples_per_client"
