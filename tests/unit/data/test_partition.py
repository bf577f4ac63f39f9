"""Laws of the partitioners, on real Fashion-MNIST labels and on small label vectors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flcore.data import (
    DATASET_INFO,
    PARTITIONERS,
    Partition,
    client_test_indices,
    largest_remainder,
    uniform_test_indices,
)
from flcore.errors import ConfigError

GROUPS = DATASET_INFO["fmnist"].class_groups


def split(
    name: str,
    labels: np.ndarray,
    clients: int,
    n: int | None,
    seed: int = 0,
    num_classes: int = 10,
    **params: Any,
) -> Partition:
    if name == "dominant":
        params.setdefault("groups", GROUPS)
    return PARTITIONERS.get(name)(
        labels,
        num_clients=clients,
        samples_per_client=n,
        num_classes=num_classes,
        seed=seed,
        **params,
    )


def balanced_labels(per_class: int, num_classes: int) -> np.ndarray:
    """A label vector with ``per_class`` samples of each class, interleaved."""
    return np.tile(np.arange(num_classes), per_class)


def all_distinct(partition: Partition) -> bool:
    joined = np.concatenate(partition.client_indices)
    return np.unique(joined).size == joined.size


PARAMS: dict[str, dict[str, Any]] = {
    "iid": {},
    "dirichlet": {"beta": 0.5},
    "pathological": {"k": 2},
    "dominant": {"s": 20},
}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_real_fmnist_at_20_clients_x_600_sizes_and_no_shared_sample(
    name: str, fmnist_train_labels: np.ndarray
) -> None:
    partition = split(name, fmnist_train_labels, 20, 600, **PARAMS[name])

    assert partition.sizes.tolist() == [600] * 20
    assert partition.reused == 0 and all_distinct(partition)
    assert all(a.dtype == np.int64 for a in partition.client_indices)


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_same_seed_same_split_other_seed_other_split(
    name: str, fmnist_train_labels: np.ndarray
) -> None:
    a = split(name, fmnist_train_labels, 20, 600, seed=3, **PARAMS[name])
    b = split(name, fmnist_train_labels, 20, 600, seed=3, **PARAMS[name])
    c = split(name, fmnist_train_labels, 20, 600, seed=4, **PARAMS[name])

    assert all(
        np.array_equal(x, y) for x, y in zip(a.client_indices, b.client_indices, strict=True)
    )
    assert not all(
        np.array_equal(x, y) for x, y in zip(a.client_indices, c.client_indices, strict=True)
    )


def test_partitioners_leave_the_global_rng_alone(fmnist_train_labels: np.ndarray) -> None:
    np.random.seed(0)
    expected = np.random.random()
    np.random.seed(0)
    for name, params in PARAMS.items():
        split(name, fmnist_train_labels, 20, 600, **params)
    assert np.random.random() == expected


def test_dominant_counts_are_exact_on_fmnist(fmnist_train_labels: np.ndarray) -> None:
    partition = split("dominant", fmnist_train_labels, 20, 600, s=20)
    counts = partition.label_counts(fmnist_train_labels, 10)

    for i, row in enumerate(counts):
        group = GROUPS[i % 5]
        # 120 samples spread over all ten classes, 480 over the three dominant ones.
        expected = np.full(10, 12)
        expected[list(group)] += 160
        assert row.tolist() == expected.tolist()


def test_dominant_remainders_go_to_the_last_classes() -> None:
    emnist_groups = DATASET_INFO["emnist"].class_groups
    labels = balanced_labels(100, 62)

    counts = split("dominant", labels, 3, 1000, num_classes=62, groups=emnist_groups, s=20)
    rows = counts.label_counts(labels, 62)

    uniform = np.array([3] * 48 + [4] * 14)  # 200 over 62 classes
    digits = uniform.copy()
    digits[:10] += 80
    upper = uniform.copy()
    upper[10:36] += [30] * 6 + [31] * 20  # 800 over 26 classes
    assert rows[0].tolist() == digits.tolist()
    assert rows[1].tolist() == upper.tolist()
    assert rows.sum(axis=1).tolist() == [1000] * 3


def test_dominant_at_100_clients_reuses_and_counts_it(fmnist_train_labels: np.ndarray) -> None:
    partition = split("dominant", fmnist_train_labels, 100, 600, s=20)

    # Even classes are dominant in two groups: 40 x 160 + 100 x 12 = 7600 asked of 6000 each.
    assert partition.reused == 5 * 1600
    assert all(np.unique(a).size == a.size for a in partition.client_indices)
    assert partition.sizes.tolist() == [600] * 100


def test_pathological_gives_exactly_k_classes(fmnist_train_labels: np.ndarray) -> None:
    for k in (1, 2, 3, 10):
        partition = split("pathological", fmnist_train_labels, 30, 600, k=k)
        counts = partition.label_counts(fmnist_train_labels, 10)
        assert ((counts > 0).sum(axis=1) == k).all()
        assert partition.sizes.tolist() == [600] * 30


def test_pathological_without_size_is_mcmahans_shards(fmnist_train_labels: np.ndarray) -> None:
    partition = split("pathological", fmnist_train_labels, 100, None, k=2)
    counts = partition.label_counts(fmnist_train_labels, 10)

    assert partition.sizes.tolist() == [600] * 100 and partition.reused == 0
    assert set(counts[counts > 0].tolist()) == {300}


def _max_share(partition: Partition, labels: np.ndarray) -> float:
    counts = partition.label_counts(labels, 10)
    return float((counts.max(axis=1) / counts.sum(axis=1)).mean())


def test_dirichlet_small_beta_skews_large_beta_evens(fmnist_train_labels: np.ndarray) -> None:
    skewed = split("dirichlet", fmnist_train_labels, 20, 600, beta=0.05)
    even = split("dirichlet", fmnist_train_labels, 20, 600, beta=1000.0)

    assert _max_share(skewed, fmnist_train_labels) > 0.7
    assert _max_share(even, fmnist_train_labels) < 0.15


def test_dirichlet_without_size_splits_every_sample_once(fmnist_train_labels: np.ndarray) -> None:
    partition = split("dirichlet", fmnist_train_labels, 50, None, beta=0.3, min_samples=10)

    joined = np.sort(np.concatenate(partition.client_indices))
    assert np.array_equal(joined, np.arange(fmnist_train_labels.size))
    assert partition.sizes.min() >= 10 and partition.reused == 0


@pytest.mark.parametrize(
    ("name", "params", "key"),
    [
        ("dirichlet", {}, "partition.beta"),
        ("dirichlet", {"beta": 0}, "partition.beta"),
        ("dirichlet", {"beta": -1.0}, "partition.beta"),
        ("dirichlet", {"beta": "big"}, "partition.beta"),
        ("dirichlet", {"beta": float("nan")}, "partition.beta"),
        ("pathological", {}, "partition.k"),
        ("pathological", {"k": 0}, "partition.k"),
        ("pathological", {"k": 11}, "partition.k"),
        ("pathological", {"k": 2.0}, "partition.k"),
        ("dominant", {"s": -1}, "partition.s"),
        ("dominant", {"s": 100.5}, "partition.s"),
        ("dominant", {"groups": None}, "partition.groups"),
        ("dominant", {"groups": ((0, 10),)}, "partition.groups"),
        ("dominant", {"groups": ((1, 1),)}, "partition.groups"),
        ("iid", {"beta": 0.5}, "partition.beta"),
        ("dominant", {"alpha": 1}, "partition.alpha"),
    ],
)
def test_invalid_params_raise_config_error_naming_the_key(
    name: str, params: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError) as info:
        split(name, balanced_labels(100, 10), 5, 50, **params)
    assert info.value.key == key and key in str(info.value)


def test_invalid_sizes_raise_config_error() -> None:
    labels = balanced_labels(10, 10)
    with pytest.raises(ConfigError) as short:
        split("iid", labels, 11, 10)
    with pytest.raises(ConfigError) as zero:
        split("iid", labels, 0, 10)
    assert (short.value.key, zero.value.key) == ("samples_per_client", "num_clients")


@settings(max_examples=60, deadline=None)
@given(
    clients=st.integers(1, 40),
    n=st.integers(1, 60),
    per_class=st.integers(1, 80),
    seed=st.integers(0, 2**32 - 1),
)
def test_iid_law_sizes_and_disjointness(clients: int, n: int, per_class: int, seed: int) -> None:
    labels = balanced_labels(per_class, 10)
    if clients * n > labels.size:
        with pytest.raises(ConfigError):
            split("iid", labels, clients, n, seed=seed)
        return
    partition = split("iid", labels, clients, n, seed=seed)
    assert partition.sizes.tolist() == [n] * clients
    assert partition.reused == 0 and all_distinct(partition)


@settings(max_examples=60, deadline=None)
@given(
    clients=st.integers(1, 40),
    n=st.integers(1, 300),
    s=st.integers(0, 100),
    per_class=st.integers(30, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_dominant_law(clients: int, n: int, s: int, per_class: int, seed: int) -> None:
    labels = balanced_labels(per_class, 10)
    partition = split("dominant", labels, clients, n, s=s, seed=seed)
    counts = partition.label_counts(labels, 10)

    uniform = int(np.floor(s * n / 100 + 0.5))
    assert partition.sizes.tolist() == [n] * clients
    for i, row in enumerate(counts):
        others = np.delete(row, GROUPS[i % 5])
        # Classes outside the group only get the uniform share: uniform // 10 or one more.
        assert set(others.tolist()) <= {uniform // 10, uniform // 10 + 1}
        # A client never holds a sample twice while each class can supply its demand.
        if row.max() <= per_class:
            idx = partition.client_indices[i]
            assert np.unique(idx).size == idx.size
    demand = counts.sum(axis=0)
    assert partition.reused == int(np.maximum(demand - per_class, 0).sum())


@settings(max_examples=40, deadline=None)
@given(
    clients=st.integers(1, 30),
    k=st.integers(1, 10),
    n=st.integers(10, 100),
    seed=st.integers(0, 2**32 - 1),
)
def test_pathological_law(clients: int, k: int, n: int, seed: int) -> None:
    labels = balanced_labels(200, 10)
    partition = split("pathological", labels, clients, n, k=k, seed=seed)
    counts = partition.label_counts(labels, 10)

    assert partition.sizes.tolist() == [n] * clients
    assert ((counts > 0).sum(axis=1) == k).all()
    holders = (counts > 0).sum(axis=0)
    assert holders.max() - holders.min() <= 1  # classes are spread evenly over clients


def test_largest_remainder_is_exact_and_proportional() -> None:
    assert largest_remainder(np.array([0.5, 0.3, 0.2]), 7).tolist() == [4, 2, 1]
    assert largest_remainder(np.array([1, 1, 1]), 10).tolist() == [4, 3, 3]  # ties: lowest first
    assert largest_remainder(np.array([172, 12, 12]), 0).tolist() == [0, 0, 0]


def test_client_test_sets_follow_each_clients_train_labels(
    fmnist_train_labels: np.ndarray, fmnist_test_labels: np.ndarray
) -> None:
    train = split("dominant", fmnist_train_labels, 20, 600, s=20)
    train_counts = train.label_counts(fmnist_train_labels, 10)

    same = client_test_indices(fmnist_test_labels, train_counts, 600, seed=1)
    half = client_test_indices(fmnist_test_labels, train_counts, 300, seed=1)

    assert np.array_equal(same.label_counts(fmnist_test_labels, 10), train_counts)
    assert np.array_equal(half.label_counts(fmnist_test_labels, 10) * 2, train_counts)
    assert all(np.unique(a).size == a.size for a in same.client_indices)
    # Even classes are asked for 8 x 172 + 12 x 12 = 1520 of their 1000 test samples.
    assert same.reused == 5 * 520
    assert half.reused == 0 and all_distinct(half)


def test_uniform_test_indices_are_balanced(fmnist_test_labels: np.ndarray) -> None:
    assert np.array_equal(uniform_test_indices(fmnist_test_labels, 10, seed=0), np.arange(10000))

    skewed = np.concatenate([np.repeat(np.arange(5), 40), np.repeat(np.arange(5, 10), 7)])
    chosen = uniform_test_indices(skewed, 10, seed=5)
    assert np.bincount(skewed[chosen], minlength=10).tolist() == [7] * 10
    assert np.all(np.diff(chosen) > 0)
    assert np.array_equal(chosen, uniform_test_indices(skewed, 10, seed=5))


def test_partition_is_read_only_and_counts_reuse() -> None:
    partition = Partition((np.array([0, 1, 2]), np.array([2, 3]), np.array([3, 3])))

    assert partition.reused == 3
    with pytest.raises(ValueError):
        partition.client_indices[0][0] = 5
