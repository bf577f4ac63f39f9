"""Datasets (real, loaded once as uint8 tensors), partitioners, and their federated view."""

from __future__ import annotations

from flcore.data.datasets import (
    DATASET_INFO,
    DATASETS,
    ArrayDataset,
    DatasetInfo,
    DatasetSplits,
    conv_layout,
    dataset_info,
    default_data_root,
    denormalize,
    load_dataset,
    normalize,
)
from flcore.data.federated import FederatedData, build_federated_data, derive_seed
from flcore.data.partition import (
    PARTITIONERS,
    Partition,
    Partitioner,
    client_test_indices,
    largest_remainder,
    uniform_test_indices,
)

__all__ = [
    "DATASETS",
    "DATASET_INFO",
    "PARTITIONERS",
    "ArrayDataset",
    "DatasetInfo",
    "DatasetSplits",
    "FederatedData",
    "Partition",
    "Partitioner",
    "build_federated_data",
    "client_test_indices",
    "dataset_info",
    "default_data_root",
    "conv_layout",
    "denormalize",
    "derive_seed",
    "largest_remainder",
    "load_dataset",
    "normalize",
    "uniform_test_indices",
]
