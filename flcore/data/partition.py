"""Partitioners: pure, deterministic functions of a label vector and a seed.

Each registered partitioner has the signature::

    (labels, *, num_clients, samples_per_client, num_classes, seed, **params) -> Partition

draws all randomness from ``np.random.default_rng(seed)`` and rejects bad parameters with a
:class:`ConfigError` keyed ``partition.<name>``. They return indices into ``labels``; nothing here
touches images, so every law of a partition can be checked on label vectors alone.

Samples are handed out by a per-class cursor over a once-shuffled list of that class's indices
(:class:`_ClassPool`): successive requests get fresh samples until the class runs out, after
which the cursor wraps and samples are reused, as the HyperFL authors' code does. Instead of
tracking reuse in each partitioner, :class:`Partition` counts it from the result: ``reused`` is
the number of index slots beyond the number of distinct indices handed out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

import numpy as np

from flcore.errors import ConfigError
from flcore.registry import Registry

__all__ = [
    "PARTITIONERS",
    "Partition",
    "Partitioner",
    "client_test_indices",
    "largest_remainder",
    "uniform_test_indices",
]


@dataclass(frozen=True, eq=False)
class Partition:
    """One index array (int64, read-only) per client, and how many index slots repeat.

    ``reused`` counts the slots that repeat an index already given to another client or earlier
    to the same client; it is 0 exactly when all clients' indices are distinct and disjoint.
    """

    client_indices: tuple[np.ndarray, ...]
    reused: int = field(init=False)

    def __post_init__(self) -> None:
        arrays = tuple(np.array(a, dtype=np.int64).reshape(-1) for a in self.client_indices)
        for a in arrays:
            a.setflags(write=False)  # frozen means frozen: a client cannot edit another's view
        object.__setattr__(self, "client_indices", arrays)
        slots = sum(a.size for a in arrays)
        distinct = np.unique(np.concatenate(arrays)).size if slots else 0
        object.__setattr__(self, "reused", int(slots - distinct))

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def sizes(self) -> np.ndarray:
        """Number of samples of each client."""
        return np.array([a.size for a in self.client_indices], dtype=np.int64)

    def label_counts(self, labels: np.ndarray, num_classes: int) -> np.ndarray:
        """Per-client class histogram, shape [clients x classes]."""
        labels = np.asarray(labels)
        counts = np.zeros((self.num_clients, num_classes), dtype=np.int64)
        for i, a in enumerate(self.client_indices):
            counts[i] = np.bincount(labels[a], minlength=num_classes)
        return counts


Partitioner = Callable[..., Partition]
PARTITIONERS: Registry[Partitioner] = Registry("partitioner")


# --- validation ---------------------------------------------------------------------------------


def _int(key: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ConfigError(key, f"must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(key, f"must be {bound}, got {value}")
    return int(value)


def _real(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ConfigError(key, f"must be a finite number, got {value!r}")
    return float(value)


def _common(
    labels: np.ndarray,
    num_clients: object,
    samples_per_client: object,
    num_classes: object,
    seed: object,
) -> tuple[np.ndarray, int, int | None, int]:
    """Validate the arguments every partitioner shares; returns them typed."""
    _int("seed", seed, 0)
    k = _int("num_classes", num_classes, 1)
    labels = np.asarray(labels)
    if labels.ndim != 1 or (labels.size and not np.issubdtype(labels.dtype, np.integer)):
        raise ValueError("labels must be a 1-D integer array")
    if labels.size and (labels.min() < 0 or labels.max() >= k):
        raise ValueError(f"labels must lie in [0, {k}), got [{labels.min()}, {labels.max()}]")
    n = None if samples_per_client is None else _int("samples_per_client", samples_per_client, 1)
    return labels.astype(np.int64, copy=False), _int("num_clients", num_clients, 1), n, k


def _no_extra(name: str, extra: dict[str, Any], known: Sequence[str]) -> None:
    if extra:
        key = sorted(extra)[0]
        raise ConfigError(
            f"partition.{key}",
            f"unknown parameter of {name!r}; known: {', '.join(known) or '(none)'}",
        )


# --- the shared sampling machinery --------------------------------------------------------------


class _ClassPool:
    """Per-class shuffled indices with a wrapping cursor: fresh samples first, then reuse."""

    def __init__(self, labels: np.ndarray, num_classes: int, rng: np.random.Generator) -> None:
        order = np.argsort(labels, kind="stable")
        bounds = np.searchsorted(labels[order], np.arange(num_classes + 1))
        self.pools = [rng.permutation(order[bounds[c] : bounds[c + 1]]) for c in range(num_classes)]
        self.cursor = [0] * num_classes

    def supply(self) -> np.ndarray:
        return np.array([p.size for p in self.pools], dtype=np.int64)

    def take(self, c: int, count: int) -> np.ndarray:
        pool = self.pools[c]
        if count == 0:
            return pool[:0]
        if pool.size == 0:
            raise ValueError(f"class {c} has no samples to draw {count} from")
        pos = self.cursor[c] + np.arange(count)
        self.cursor[c] = int((self.cursor[c] + count) % pool.size)
        return pool[pos % pool.size]

    def draw(self, counts: np.ndarray) -> np.ndarray:
        """One client's indices: ``counts[c]`` samples of each class c, in class order."""
        return np.concatenate([self.take(c, int(m)) for c, m in enumerate(counts)])


def largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integers proportional to ``weights`` that sum exactly to ``total`` (Hamilton's method).

    Ties in the fractional parts go to the lower index, so the result is deterministic.
    """
    w = np.asarray(weights, dtype=np.float64)
    if total == 0:
        return np.zeros(w.size, dtype=np.int64)
    if w.sum() <= 0:
        raise ValueError("weights must have a positive sum")
    quota = w / w.sum() * total
    counts = np.floor(quota).astype(np.int64)
    short = total - int(counts.sum())
    order = np.argsort(-(quota - counts), kind="stable")
    counts[order[:short]] += 1
    return counts


def _spread(total: int, slots: int) -> np.ndarray:
    """``total`` split over ``slots`` equally, the remainder going to the last slots."""
    counts = np.full(slots, total // slots, dtype=np.int64)
    counts[slots - total % slots :] += 1  # an empty slice when the split is exact
    return counts


# --- partitioners -------------------------------------------------------------------------------


@PARTITIONERS.register("iid")
def iid(
    labels: np.ndarray,
    *,
    num_clients: int,
    samples_per_client: int | None,
    num_classes: int,
    seed: int,
    **params: Any,
) -> Partition:
    """A random permutation cut into equal, disjoint chunks.

    ``samples_per_client=None`` gives each client ``len(labels) // num_clients`` samples.
    """
    _no_extra("iid", params, ())
    labels, clients, n, _ = _common(labels, num_clients, samples_per_client, num_classes, seed)
    n = labels.size // clients if n is None else n
    if n * clients > labels.size or n == 0:
        raise ConfigError(
            "samples_per_client",
            f"{clients} clients x {n} samples need "
            f"{clients * n} distinct samples, only {labels.size} exist",
        )
    perm = np.random.default_rng(seed).permutation(labels.size)
    return Partition(tuple(perm[i * n : (i + 1) * n] for i in range(clients)))


@PARTITIONERS.register("dirichlet")
def dirichlet(
    labels: np.ndarray,
    *,
    num_clients: int,
    samples_per_client: int | None,
    num_classes: int,
    seed: int,
    beta: float | None = None,
    min_samples: int = 1,
    **params: Any,
) -> Partition:
    """Label skew drawn from a symmetric Dirichlet with concentration ``beta``.

    Two modes:

    * ``samples_per_client=None`` (Hsu et al. 2019; Yurochkin et al. 2019, as used by FedHKD's
      references): all samples are split; for each class, its indices are shared among the
      clients by proportions drawn from Dir(beta * 1). Client sizes differ. The draw is repeated
      (at most 1000 times) until every client holds at least ``min_samples`` samples.
    * ``samples_per_client=n`` (FedHKD's equal-size clients): each client draws its own class
      proportions from Dir(beta * 1) over the classes present in ``labels``, rounds ``n * p`` to
      integers summing to ``n`` (largest remainder), and takes them from the per-class cursors:
      distinct within a client, disjoint across clients until a class runs out, then reused.
    """
    _no_extra("dirichlet", params, ("beta", "min_samples"))
    labels, clients, n, k = _common(labels, num_clients, samples_per_client, num_classes, seed)
    if beta is None:
        raise ConfigError("partition.beta", "required by the dirichlet partitioner")
    b = _real("partition.beta", beta)
    if b <= 0:
        raise ConfigError("partition.beta", f"must be > 0, got {beta}")
    floor = _int("partition.min_samples", min_samples, 0)
    rng = np.random.default_rng(seed)
    pool = _ClassPool(labels, k, rng)
    supply = pool.supply()
    if n is not None:
        present = supply > 0
        parts = []
        for _ in range(clients):
            p = np.zeros(k)
            p[present] = rng.dirichlet(np.full(int(present.sum()), b))
            parts.append(pool.draw(largest_remainder(p, n)))
        return Partition(tuple(parts))
    if floor * clients > labels.size:
        raise ConfigError(
            "partition.min_samples",
            f"{clients} clients x {floor} exceeds the {labels.size} samples",
        )
    for _ in range(1000):
        chunks: list[list[np.ndarray]] = [[] for _ in range(clients)]
        for c in range(k):
            p = rng.dirichlet(np.full(clients, b))
            cuts = (np.cumsum(p)[:-1] * supply[c]).astype(np.int64)
            for i, part in enumerate(np.split(pool.pools[c], cuts)):
                chunks[i].append(part)
        parts = [np.sort(np.concatenate(ch)) for ch in chunks]
        if min(p.size for p in parts) >= floor:
            return Partition(tuple(parts))
    raise ConfigError(
        "partition.beta",
        f"1000 draws with beta={b} all left a client with "
        f"fewer than {floor} samples; raise beta or lower num_clients",
    )


@PARTITIONERS.register("pathological")
def pathological(
    labels: np.ndarray,
    *,
    num_clients: int,
    samples_per_client: int | None,
    num_classes: int,
    seed: int,
    k: int | None = None,
    **params: Any,
) -> Partition:
    """Each client holds exactly ``k`` classes in equal shards (McMahan et al. 2017, "shards").

    McMahan et al. sort by label, cut into ``clients * k`` shards and deal them at random, which
    can hand a client two shards of one class. We keep the idea and guarantee ``k`` distinct
    classes: over a random cyclic order of the classes, client slot ``j`` holds the ``k``
    consecutive classes starting at position ``j * k`` (so each class is held by
    ``floor`` or ``ceil`` of ``clients * k / classes`` clients), and the slots are dealt to
    clients in random order. Each held class contributes one shard of equal size: ``n // k``
    (the first ``n % k`` shards one more) when ``samples_per_client=n``, else the largest size
    every class can supply without reuse, ``min_c floor(count_c / holders_c)``.
    With ``n`` set, a class asked for more samples than it holds wraps its cursor (``reused``).
    """
    _no_extra("pathological", params, ("k",))
    labels, clients, n, classes = _common(
        labels, num_clients, samples_per_client, num_classes, seed
    )
    if k is None:
        raise ConfigError("partition.k", "required by the pathological partitioner")
    k = _int("partition.k", k, 1, classes)
    rng = np.random.default_rng(seed)
    pool = _ClassPool(labels, classes, rng)
    ring = rng.permutation(classes)
    slots = [ring[(j * k + np.arange(k)) % classes] for j in range(clients)]
    held = [slots[j] for j in rng.permutation(clients)]
    if n is None:
        holders = np.bincount(np.concatenate(held), minlength=classes)
        supply = pool.supply()
        shard = int(min(supply[c] // holders[c] for c in range(classes) if holders[c]))
        if shard == 0:
            raise ConfigError("partition.k", "some held class has fewer samples than holders")
        sizes = np.full(k, shard, dtype=np.int64)
    else:
        sizes = np.full(k, n // k, dtype=np.int64)
        sizes[: n % k] += 1
        if sizes.min() == 0:
            raise ConfigError("partition.k", f"k={k} exceeds samples_per_client={n}")
    parts = [
        np.concatenate([pool.take(int(c), int(m)) for c, m in zip(cs, sizes, strict=True)])
        for cs in held
    ]
    return Partition(tuple(parts))


def _validate_groups(groups: object, num_classes: int) -> tuple[tuple[int, ...], ...]:
    key = "partition.groups"
    if groups is None:
        raise ConfigError(key, "required by the dominant partitioner (DatasetInfo.class_groups)")
    if isinstance(groups, str | bytes) or not isinstance(groups, Sequence) or not groups:
        raise ConfigError(key, "must be a non-empty sequence of class tuples")
    out = []
    for g in groups:
        if isinstance(g, str | bytes) or not isinstance(g, Sequence) or not g:
            raise ConfigError(key, f"each group must be a non-empty sequence, got {g!r}")
        members = tuple(_int(key, c, 0, num_classes - 1) for c in g)
        if len(set(members)) != len(members):
            raise ConfigError(key, f"group {members} repeats a class")
        out.append(members)
    return tuple(out)


@PARTITIONERS.register("dominant")
def dominant(
    labels: np.ndarray,
    *,
    num_clients: int,
    samples_per_client: int | None,
    num_classes: int,
    seed: int,
    s: float = 20,
    groups: Sequence[Sequence[int]] | None = None,
    **params: Any,
) -> Partition:
    """HyperFL's dominant-class partition (Guo et al., AAAI 2025, App. D.1).

    Every client has exactly ``n`` samples: ``round(s/100 * n)`` (half up) spread equally over
    all classes (the remainder to the last classes) and the rest spread equally over the
    dominant classes of its group (the remainder to the group's last classes); client ``i``
    belongs to group ``i % len(groups)``. Samples come from the per-class cursors, so they are
    distinct within a client and disjoint across clients until a class runs out, then reused.
    ``samples_per_client=None`` means ``len(labels) // num_clients``.
    """
    _no_extra("dominant", params, ("s", "groups"))
    labels, clients, n, k = _common(labels, num_clients, samples_per_client, num_classes, seed)
    share = _real("partition.s", s)
    if not 0 <= share <= 100:
        raise ConfigError("partition.s", f"must be in [0, 100], got {s}")
    group_list = _validate_groups(groups, k)
    n = labels.size // clients if n is None else n
    uniform = math.floor(share * n / 100 + 0.5)
    base = _spread(uniform, k)
    pool = _ClassPool(labels, k, np.random.default_rng(seed))
    parts = []
    for i in range(clients):
        group = group_list[i % len(group_list)]
        counts = base.copy()
        counts[list(group)] += _spread(n - uniform, len(group))
        parts.append(pool.draw(counts))
    return Partition(tuple(parts))


# --- test sets ----------------------------------------------------------------------------------


def client_test_indices(
    test_labels: np.ndarray, train_counts: np.ndarray, samples_per_client: int, seed: int
) -> Partition:
    """Per-client test sets that follow each client's train label distribution.

    Client ``i`` gets ``samples_per_client`` test samples whose class counts are
    ``train_counts[i]`` scaled to that size by largest-remainder rounding; samples come from
    per-class cursors (distinct within a client, disjoint across clients until a class runs
    out, then reused and counted in ``reused``).
    """
    counts = np.asarray(train_counts)
    if counts.ndim != 2:
        raise ValueError("train_counts must be a [clients x classes] array")
    n = _int("test_samples_per_client", samples_per_client, 1)
    labels, _, _, k = _common(test_labels, 1, None, counts.shape[1], seed)
    pool = _ClassPool(labels, k, np.random.default_rng(seed))
    return Partition(tuple(pool.draw(largest_remainder(row, n)) for row in counts))


def uniform_test_indices(
    test_labels: np.ndarray, num_classes: int, seed: int, per_class: int | None = None
) -> np.ndarray:
    """A class-balanced global test set: ``min_c count_c`` samples of every class (at most
    ``per_class``), sorted.

    On an already balanced split (Fashion-MNIST, CIFAR) and without ``per_class`` this is the
    whole split.
    """
    labels, _, _, k = _common(test_labels, 1, None, num_classes, seed)
    counts = np.bincount(labels, minlength=k)
    m = int(counts.min())
    if m == 0:
        raise ValueError(f"class {int(counts.argmin())} has no test samples")
    if per_class is not None:
        m = min(m, per_class)
    rng = np.random.default_rng(seed)
    chosen = [
        idx if idx.size == m else rng.choice(idx, size=m, replace=False)
        for idx in (np.flatnonzero(labels == c) for c in range(k))
    ]
    return np.sort(np.concatenate(chosen)).astype(np.int64)
