"""Few-shot clients: each holds one fixed N-way K-shot task (LoDMeta's setting).

Yang & Kwok, "Communication-Efficient and Privacy-Preserving Decentralized Meta-Learning": every
client has its own task, drawn from the meta-training classes; unseen clients draw theirs from
the meta-testing classes and join after meta-training (Sec. 5.1, Table 4). Each task is N-way
K-shot with 15 query samples per class.

A client's records, per class of its task, drawn without replacement from that class's records
and disjoint from every other client's:

- ``K`` support records (``client_train``): the inner loop adapts on them (and an unseen client
  adapts on them, Algorithm 3);
- ``query`` records (``client_val``): the meta-gradient's query set, the paper's meta-validation
  data D_vald;
- ``test_query`` records (``client_test``): held out, never trained on. A deviation, stated: the
  paper scores training clients on the query set whose meta-gradient trained the model (its 100
  records a client are 20 per class: 5 support + 15 query); ``accuracy`` here is measured on
  records no step has seen. Unseen clients have support and test records only.

Each client's classes are mapped to local labels ``0..N-1`` by its own random permutation, so two
clients with the same classes (FMNIST has only 5 meta-training classes) still hold different
tasks. ``info.num_classes`` is N.

The pool: a dataset's train split, with meta-training and meta-testing classes chosen by the
config (FMNIST: classes 0-4 and 5-9 by default), or a class-structured few-shot dataset
(flcore.data.metasets: mini-ImageNet, the Meta-Dataset subsets) with its own class split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from flcore.data.datasets import ArrayDataset, DatasetInfo, DatasetSplits
from flcore.data.federated import FederatedData, derive_seed
from flcore.data.partition import Partition
from flcore.errors import ConfigError

__all__ = ["FewShotData", "FewShotSpec", "build_fewshot_data"]


@dataclass(frozen=True)
class FewShotSpec:
    """Args:
    n_way: N, classes per task.
    k_shot: K, support records per class.
    query: query records per class for the meta-gradient (15).
    test_query: held-out records per class that ``accuracy`` is scored on (15).
    train_classes: the meta-training classes (labels of the pool).
    unseen_classes: the meta-testing classes.
    unseen_clients: how many unseen clients.
    """

    n_way: int
    k_shot: int
    query: int
    test_query: int
    train_classes: tuple[int, ...]
    unseen_classes: tuple[int, ...]
    unseen_clients: int

    def __post_init__(self) -> None:
        for key in ("n_way", "k_shot", "query", "test_query"):
            if getattr(self, key) < 1:
                raise ConfigError(f"fewshot.{key}", f"must be >= 1, got {getattr(self, key)}")
        if self.unseen_clients < 0:
            raise ConfigError("fewshot.unseen_clients", f"must be >= 0, got {self.unseen_clients}")
        if set(self.train_classes) & set(self.unseen_classes):
            raise ConfigError(
                "fewshot.unseen_classes",
                "meta-testing classes must not be meta-training classes, shared: "
                f"{sorted(set(self.train_classes) & set(self.unseen_classes))}",
            )
        for key, classes in (
            ("train_classes", self.train_classes),
            ("unseen_classes", self.unseen_classes),
        ):
            if len(set(classes)) != len(classes):
                raise ConfigError(f"fewshot.{key}", f"repeats a class: {list(classes)}")
            if (key == "train_classes" or self.unseen_clients) and len(classes) < self.n_way:
                raise ConfigError(
                    f"fewshot.{key}",
                    f"{len(classes)} classes cannot make a {self.n_way}-way task",
                )


def _draw(
    labels: np.ndarray,
    classes: Sequence[int],
    clients: int,
    n_way: int,
    takes: Sequence[int],
    seed: int,
    who: str,
) -> tuple[list[list[np.ndarray]], list[np.ndarray]]:
    """Per client: its classes' record indices cut into ``takes`` parts, and its label map.

    Each client draws ``n_way`` of ``classes`` and a permutation of them to local labels; each
    class's records are shuffled once and handed out in order, so no record goes to two
    clients."""
    rng = np.random.default_rng(seed)
    queues = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    per = sum(takes)
    parts: list[list[np.ndarray]] = []
    maps: list[np.ndarray] = []
    size = int(labels.max()) + 1 if labels.size else 0
    for _ in range(clients):
        chosen = rng.choice(np.asarray(classes), size=n_way, replace=False)
        local = np.full(size, -1, dtype=np.int64)
        local[chosen] = np.arange(n_way)  # chosen is already in random order: the permutation
        cut: list[list[int]] = [[] for _ in takes]
        for c in chosen:
            q = queues[int(c)]
            if len(q) < per:
                raise ConfigError(
                    "fewshot",
                    f"class {int(c)} has too few records left for {who}: each task takes "
                    f"{per} records a class ({' + '.join(map(str, takes))}); use fewer clients, "
                    "a smaller k_shot or query, or more classes",
                )
            got, queues[int(c)] = q[:per], q[per:]
            start = 0
            for i, t in enumerate(takes):
                cut[i].extend(got[start : start + t])
                start += t
        parts.append([np.asarray(sorted(x), dtype=np.int64) for x in cut])
        maps.append(local)
    return parts, maps


def _relabel(data: ArrayDataset, label_map: np.ndarray) -> ArrayDataset:
    local = torch.from_numpy(label_map)[data.labels]
    return ArrayDataset(data.images, local)


@dataclass(frozen=True, eq=False)
class FewShotData(FederatedData):
    """:class:`FederatedData` whose clients each hold one few-shot task (module docstring):
    ``client_train`` is the support set, ``client_val`` the query set, ``client_test`` the
    held-out query records, all relabelled to ``0..N-1`` by the client's own map."""

    n_way: int = 0
    label_maps: tuple[np.ndarray, ...] = ()
    unseen_support: Partition | None = None
    unseen_test: Partition | None = None
    unseen_maps: tuple[np.ndarray, ...] = ()

    @property
    def info(self) -> DatasetInfo:
        return dataclasses.replace(self.splits.info, num_classes=self.n_way)

    def client_train(self, i: int) -> ArrayDataset:
        return _relabel(super().client_train(i), self.label_maps[i])

    def client_test(self, i: int) -> ArrayDataset:
        return _relabel(super().client_test(i), self.label_maps[i])

    def client_val(self, i: int) -> ArrayDataset | None:
        val = super().client_val(i)
        return None if val is None else _relabel(val, self.label_maps[i])

    @property
    def num_unseen(self) -> int:
        return 0 if self.unseen_support is None else self.unseen_support.num_clients

    def unseen_train(self, j: int) -> ArrayDataset:
        """Unseen client ``j``'s support records (what it adapts on)."""
        assert self.unseen_support is not None
        idx = torch.tensor(self.unseen_support.client_indices[j])
        src = self.splits.train
        data = ArrayDataset(src.images.index_select(0, idx), src.labels.index_select(0, idx))
        return _relabel(data, self.unseen_maps[j])

    def unseen_test_set(self, j: int) -> ArrayDataset:
        """Unseen client ``j``'s test records."""
        assert self.unseen_test is not None
        idx = torch.tensor(self.unseen_test.client_indices[j])
        src = self.splits.train
        data = ArrayDataset(src.images.index_select(0, idx), src.labels.index_select(0, idx))
        return _relabel(data, self.unseen_maps[j])

    def records_per_client(self) -> int:
        """What one client trains on: support + query records (the test records are not)."""
        return int(self.train.sizes.max() + self.val.sizes.max()) if self.val is not None else 0


def build_fewshot_data(
    splits: DatasetSplits, spec: FewShotSpec, *, num_clients: int, seed: int
) -> FewShotData:
    """``num_clients`` training clients and ``spec.unseen_clients`` unseen clients, each with
    its own task drawn from ``splits.train`` (module docstring).

    Raises:
        ConfigError: a class outside the dataset, or too few records for the clients' tasks.
    """
    labels = splits.train.labels.numpy()
    present = set(np.unique(labels).tolist())
    for key, classes in (
        ("train_classes", spec.train_classes),
        ("unseen_classes", spec.unseen_classes),
    ):
        missing = sorted(set(classes) - present)
        if missing:
            raise ConfigError(f"fewshot.{key}", f"classes {missing} are not in the dataset")
    takes = (spec.k_shot, spec.query, spec.test_query)
    parts, maps = _draw(
        labels,
        spec.train_classes,
        num_clients,
        spec.n_way,
        takes,
        derive_seed(seed, 11),
        "the training clients",
    )
    u_parts, u_maps = _draw(
        labels,
        spec.unseen_classes,
        spec.unseen_clients,
        spec.n_way,
        (spec.k_shot, spec.test_query),
        derive_seed(seed, 12),
        "the unseen clients",
    )
    empty = np.zeros(0, dtype=np.int64)
    empty.setflags(write=False)
    return FewShotData(
        splits,
        Partition(tuple(p[0] for p in parts)),
        Partition(tuple(p[2] for p in parts)),
        empty,
        "fewshot",
        val=Partition(tuple(p[1] for p in parts)),
        test_source="train",
        n_way=spec.n_way,
        label_maps=tuple(maps),
        unseen_support=Partition(tuple(p[0] for p in u_parts)),
        unseen_test=Partition(tuple(p[1] for p in u_parts)),
        unseen_maps=tuple(u_maps),
    )
