"""Real-data loaders: the Fashion-MNIST search order, errors, EMNIST orientation, normalization."""

from __future__ import annotations

import struct
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch

from flcore.data import (
    DATASET_INFO,
    DATASETS,
    DatasetSplits,
    dataset_info,
    denormalize,
    load_dataset,
    normalize,
)
from flcore.data import datasets as datasets_module
from flcore.errors import DataNotFoundError, UnknownNameError

# sha256 of the four unzipped Fashion-MNIST idx files, concatenated (train images, train labels,
# test images, test labels): `cat ... | sha256sum` gives the same.
FMNIST_SHA256 = "14410854cf7a289477dcfc7df3f8ec24741e281cdcc425ede0d9a748ca630214"


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Make torchvision's download step fail at once, as it does without DNS."""
    calls: list[object] = []

    def refuse(open_split: object) -> None:
        calls.append(open_split)
        raise URLError("network disabled by the test")

    monkeypatch.setattr(datasets_module, "_download_pair", refuse)
    return calls


def test_fmnist_loads_from_the_debian_folder(fmnist: DatasetSplits) -> None:
    train, test = fmnist.train, fmnist.test

    assert "Debian" in fmnist.source
    assert (len(train), len(test)) == (60000, 10000)
    assert train.images.dtype == torch.uint8 and train.images.shape == (60000, 1, 28, 28)
    assert test.images.shape == (10000, 1, 28, 28)
    assert train.labels.dtype == torch.int64
    assert torch.equal(train.labels.bincount(), torch.full((10,), 6000))
    assert torch.equal(test.labels.bincount(), torch.full((10,), 1000))
    assert fmnist.checksum == FMNIST_SHA256
    assert fmnist.info is DATASET_INFO["fmnist"]


def test_a_second_load_finds_fmnist_at_the_root(fmnist: DatasetSplits, fmnist_root: Path) -> None:
    datasets_module.clear_dataset_cache()
    again = load_dataset("fmnist", fmnist_root)

    assert "(data root)" in again.source and "Debian" not in again.source
    assert again.checksum == fmnist.checksum
    assert torch.equal(again.train.images, fmnist.train.images)
    assert torch.equal(again.test.labels, fmnist.test.labels)


def test_fmnist_nowhere_names_all_three_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: list[object]
) -> None:
    empty = tmp_path / "debian"
    empty.mkdir()
    monkeypatch.setattr(datasets_module, "DEBIAN_FASHION_MNIST_DIR", empty)
    root = tmp_path / "fresh-root"

    with pytest.raises(DataNotFoundError) as info:
        load_dataset("fmnist", root)

    message = str(info.value)
    assert f"1. the data root {root}" in message
    assert f"2. Debian's package dataset-fashion-mnist at {empty}" in message
    assert "sudo apt-get update && sudo apt-get install -y dataset-fashion-mnist" in message
    assert "3. torchvision's download" in message and "network disabled" in message
    assert len(no_network) == 1
    assert root.is_dir()


def test_a_partial_debian_folder_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: list[object]
) -> None:
    partial = tmp_path / "debian"
    partial.mkdir()
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        (partial / name).write_bytes((datasets_module.DEBIAN_FASHION_MNIST_DIR / name).read_bytes())
    monkeypatch.setattr(datasets_module, "DEBIAN_FASHION_MNIST_DIR", partial)

    with pytest.raises(DataNotFoundError, match="missing t10k-images-idx3-ubyte.gz"):
        load_dataset("fmnist", tmp_path / "root")


@pytest.mark.parametrize("name", ["emnist", "cifar10", "cifar100", "svhn", "cinic10"])
def test_missing_dataset_error_names_dataset_root_and_remedy(
    name: str, tmp_path: Path, no_network: list[object]
) -> None:
    with pytest.raises(DataNotFoundError) as info:
        load_dataset(name, tmp_path)

    message = str(info.value)
    assert repr(name) in message and str(tmp_path) in message
    assert "FEDSWEEP_DATA_ROOT" in message


def test_unknown_dataset_lists_known_names(tmp_path: Path) -> None:
    for call in (lambda: load_dataset("mnist", tmp_path), lambda: dataset_info("mnist")):
        with pytest.raises(UnknownNameError) as info:
            call()
        assert all(name in str(info.value) for name in DATASET_INFO)


def test_every_registered_loader_has_consistent_info() -> None:
    assert DATASETS.names() == sorted(DATASET_INFO)
    for name, info in DATASET_INFO.items():
        assert info.name == name and dataset_info(name) is info
        assert len(info.mean) == len(info.std) == info.in_channels
        assert all(0 <= c < info.num_classes for group in info.class_groups for c in group)
        assert info.model == ("cnn_fmnist" if info.in_channels == 1 else "cnn_cifar")
    assert DATASET_INFO["fmnist"].class_groups[-1] == (8, 9, 0)
    assert [len(g) for g in DATASET_INFO["emnist"].class_groups] == [10, 26, 26]


def _write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


def test_emnist_loader_turns_the_stored_transpose_upright(
    fmnist: DatasetSplits, tmp_path: Path
) -> None:
    # EMNIST-format files made from real Fashion-MNIST images, stored transposed as NIST does.
    raw = tmp_path / "EMNIST" / "raw"
    raw.mkdir(parents=True)
    subsets = {"train": fmnist.train, "test": fmnist.test}
    for split, data in subsets.items():
        _write_idx(
            raw / f"emnist-byclass-{split}-images-idx3-ubyte",
            data.images[:300, 0].transpose(1, 2).numpy(),
        )
        _write_idx(raw / f"emnist-byclass-{split}-labels-idx1-ubyte", data.labels[:300].numpy())

    emnist = load_dataset("emnist", tmp_path)

    assert torch.equal(emnist.train.images, fmnist.train.images[:300])
    assert torch.equal(emnist.test.images, fmnist.test.images[:300])
    assert torch.equal(emnist.train.labels, fmnist.train.labels[:300])
    assert emnist.info.num_classes == 62 and "(data root)" in emnist.source


def test_normalize_matches_the_formula_and_round_trips(fmnist: DatasetSplits) -> None:
    images = fmnist.test.images[:256]
    info = fmnist.info

    x = normalize(images, info)
    back = denormalize(x, info)

    expected = (images.float() / 255 - 0.1307) / 0.3081
    assert x.dtype == torch.float32 and torch.allclose(x, expected, atol=1e-5)
    assert torch.allclose(back * 255, images.float(), atol=1e-3)
    assert float(back.min()) >= 0.0 and float(back.max()) <= 1.0
    assert torch.equal(images, fmnist.test.images[:256])  # the uint8 source is untouched


def test_normalize_refuses_floats_and_wrong_channels(fmnist: DatasetSplits) -> None:
    images = fmnist.test.images[:4]

    with pytest.raises(TypeError, match="uint8"):
        normalize(images.float(), fmnist.info)
    with pytest.raises(ValueError, match="channel"):
        normalize(images, DATASET_INFO["cifar10"])


def test_unpacking_into_one_root_at_once_never_collides(tmp_path: Path) -> None:
    """Parallel trials (or two runs started together) unpack Debian's files into the same empty
    root at the same moment: every one must finish with the real files, none lose a race."""
    import threading

    if not datasets_module.DEBIAN_FASHION_MNIST_DIR.is_dir():
        pytest.skip(
            f"needs Debian's dataset-fashion-mnist: {datasets_module.DEBIAN_INSTALL_COMMAND}"
        )
    start, errors = threading.Barrier(6), []

    def unpack() -> None:
        start.wait()
        try:
            datasets_module._unpack_debian(tmp_path)
        except Exception as exc:  # noqa: BLE001 - the test reports whatever a racer hit
            errors.append(exc)

    threads = [threading.Thread(target=unpack) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    raw = tmp_path / "FashionMNIST" / "raw"
    assert not list(raw.glob("*.partial"))
    datasets_module.clear_dataset_cache()
    assert load_dataset("fmnist", tmp_path).checksum == FMNIST_SHA256
