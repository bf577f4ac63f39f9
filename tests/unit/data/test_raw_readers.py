"""The CIFAR-10/100 and SVHN readers, on small files written in exactly the published formats.

The only synthetic data in the suite: these tests check file-format parsing (shapes, pixel
layout, label mapping, split assignment, errors), so the pixels' content does not matter.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import scipy.io
import torch

from flcore.data import DATASET_INFO, load_dataset
from flcore.data import datasets as datasets_module
from flcore.errors import DataNotFoundError

CIFAR10 = "cifar-10-batches-py"
CIFAR100 = "cifar-100-python"


@pytest.fixture(autouse=True)
def downloads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Record torchvision download attempts and fail them, as they fail without a network."""
    calls: list[object] = []

    def refuse(open_split: object) -> None:
        calls.append(open_split)
        raise URLError("network disabled by the test")

    monkeypatch.setattr(datasets_module, "_download_pair", refuse)
    return calls


def _pixels(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 3072), dtype=np.uint8)


def _write_batch(path: Path, entries: dict[bytes, object]) -> None:
    """A pickle like the published ones: protocol 2, bytes keys, numpy.core globals."""
    raw = pickle.dumps(entries, protocol=2)
    # The published batches were pickled under numpy 1 (numpy.core); newline-terminated GLOBAL
    # opcodes make the rename safe in protocol 2.
    path.write_bytes(raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))


def _write_cifar10(root: Path, skip: str = "") -> dict[str, tuple[np.ndarray, list[int]]]:
    folder = root / CIFAR10
    folder.mkdir(parents=True)
    written = {}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for seed, name in enumerate(names):
        n = 6 if name == "test_batch" else 4
        data, labels = _pixels(n, seed), [(seed * 4 + k) % 10 for k in range(n)]
        written[name] = (data, labels)
        if name != skip:
            entries = {b"batch_label": name.encode(), b"labels": labels, b"data": data}
            _write_batch(folder / name, entries | {b"filenames": [b"x.png"] * n})
    return written


def test_cifar10_reads_the_five_training_batches_in_order_and_the_test_batch(
    tmp_path: Path, downloads: list[object]
) -> None:
    written = _write_cifar10(tmp_path)

    cifar = load_dataset("cifar10", tmp_path)

    train_names = [f"data_batch_{i}" for i in range(1, 6)]
    train_rows = np.concatenate([written[n][0] for n in train_names])
    train_labels = sum((written[n][1] for n in train_names), [])
    assert cifar.train.images.dtype == torch.uint8 and cifar.train.images.shape == (20, 3, 32, 32)
    assert cifar.test.images.shape == (6, 3, 32, 32)
    assert cifar.train.labels.dtype == torch.int64
    assert cifar.train.labels.tolist() == train_labels
    assert cifar.test.labels.tolist() == written["test_batch"][1]
    assert torch.equal(cifar.train.images.reshape(20, -1), torch.from_numpy(train_rows))
    assert torch.equal(cifar.test.images.reshape(6, -1), torch.from_numpy(written["test_batch"][0]))
    files = [tmp_path / CIFAR10 / n for n in [*train_names, "test_batch"]]
    assert cifar.checksum == hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    assert cifar.info is DATASET_INFO["cifar10"] and "(data root)" in cifar.source
    assert downloads == []


def test_a_cifar_row_is_the_red_then_green_then_blue_plane(tmp_path: Path) -> None:
    written = _write_cifar10(tmp_path)
    row = np.zeros(3072, dtype=np.uint8)
    row[0 * 1024 + 2 * 32 + 5] = 200  # red, image row 2, column 5
    row[1 * 1024 + 31 * 32 + 0] = 100  # green, row 31, column 0
    row[2 * 1024 + 0 * 32 + 31] = 50  # blue, row 0, column 31
    data, labels = written["data_batch_1"]
    data[0] = row
    _write_batch(tmp_path / CIFAR10 / "data_batch_1", {b"data": data, b"labels": labels})

    image = load_dataset("cifar10", tmp_path).train.images[0]

    assert (int(image[0, 2, 5]), int(image[1, 31, 0]), int(image[2, 0, 31])) == (200, 100, 50)
    assert int(image.sum()) == 350


def test_cifar100_reads_the_fine_labels(tmp_path: Path) -> None:
    folder = tmp_path / CIFAR100
    folder.mkdir()
    fine = {"train": list(range(60, 100)), "test": [99, 0, 42]}
    for seed, (name, labels) in enumerate(fine.items()):
        entries = {b"data": _pixels(len(labels), seed), b"fine_labels": labels}
        _write_batch(folder / name, entries | {b"coarse_labels": [k // 5 for k in labels]})

    cifar = load_dataset("cifar100", tmp_path)

    assert cifar.train.labels.tolist() == fine["train"]
    assert cifar.test.labels.tolist() == fine["test"]
    assert cifar.train.images.shape == (40, 3, 32, 32) and cifar.info.num_classes == 100


def _write_svhn(path: Path, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``*_32x32.mat``: X is H x W x C x N uint8, y is N x 1 with 10 for the digit 0."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)
    y = (np.arange(n) % 10 + 1).reshape(n, 1).astype(np.uint8)
    scipy.io.savemat(str(path), {"X": x, "y": y})
    return x, y


def test_svhn_maps_label_10_to_0_and_puts_channels_first(
    tmp_path: Path, downloads: list[object]
) -> None:
    x_train, y_train = _write_svhn(tmp_path / "train_32x32.mat", 25, seed=0)
    _write_svhn(tmp_path / "test_32x32.mat", 12, seed=1)

    svhn = load_dataset("svhn", tmp_path)

    assert svhn.train.images.dtype == torch.uint8 and svhn.train.images.shape == (25, 3, 32, 32)
    assert svhn.test.images.shape == (12, 3, 32, 32)
    assert svhn.train.labels.tolist() == [k % 10 for k in range(1, 26)]
    assert int(y_train[9, 0]) == 10 and int(svhn.train.labels[9]) == 0
    # X[row, column, channel, image] is images[image, channel, row, column]
    assert int(svhn.train.images[7, 2, 3, 30]) == int(x_train[3, 30, 2, 7])
    assert torch.equal(svhn.train.images, torch.from_numpy(x_train).permute(3, 2, 0, 1))
    assert "(data root)" in svhn.source and downloads == []


@pytest.mark.parametrize(
    ("name", "missing", "folder"),
    [
        ("cifar10", "data_batch_3", CIFAR10),
        ("cifar100", "test", CIFAR100),
        ("svhn", "test_32x32.mat", ""),
    ],
)
def test_a_partial_copy_names_the_missing_file_and_is_not_downloaded_over(
    name: str, missing: str, folder: str, tmp_path: Path, downloads: list[object]
) -> None:
    if name == "cifar10":
        _write_cifar10(tmp_path, skip=missing)
    elif name == "cifar100":
        (tmp_path / CIFAR100).mkdir()
        _write_batch(
            tmp_path / CIFAR100 / "train", {b"data": _pixels(2, 0), b"fine_labels": [1, 2]}
        )
    else:
        _write_svhn(tmp_path / "train_32x32.mat", 3, seed=0)

    with pytest.raises(DataNotFoundError) as info:
        load_dataset(name, tmp_path)

    message = str(info.value)
    assert repr(name) in message and f"missing {missing} in {tmp_path / folder};" in message
    assert "nothing is downloaded" in message and "FEDSWEEP_DATA_ROOT" in message
    assert downloads == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "cifar10",
            "data_batch_1, data_batch_2, data_batch_3, data_batch_4, data_batch_5, "
            f"test_batch in {{root}}/{CIFAR10} (cifar-10-python.tar.gz",
        ),
        ("cifar100", f"train, test in {{root}}/{CIFAR100} (cifar-100-python.tar.gz"),
        ("svhn", "train_32x32.mat, test_32x32.mat in {root} (the format-2"),
    ],
)
def test_an_empty_root_tries_the_download_then_says_where_files_go(
    name: str, expected: str, tmp_path: Path, downloads: list[object]
) -> None:
    with pytest.raises(DataNotFoundError) as info:
        load_dataset(name, tmp_path)

    message = str(info.value)
    assert f"Put {expected.format(root=tmp_path)}" in message
    assert "torchvision's download failed" in message and "network disabled" in message
    assert len(downloads) == 1


def test_missing_files_are_fetched_by_the_download_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fake_download(open_split: object) -> None:  # what torchvision's download leaves behind
        _write_svhn(tmp_path / "train_32x32.mat", 4, seed=0)
        _write_svhn(tmp_path / "test_32x32.mat", 2, seed=1)

    monkeypatch.setattr(datasets_module, "_download_pair", fake_download)

    svhn = load_dataset("svhn", tmp_path)

    assert (len(svhn.train), len(svhn.test)) == (4, 2) and "downloaded" in svhn.source


def test_a_batch_that_names_another_global_is_refused(tmp_path: Path) -> None:
    _write_cifar10(tmp_path)

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[()]]:
            return (os.getcwd, ())

    bad = {b"data": _pixels(4, 0), b"labels": [0, 1, 2, 3], b"extra": Payload()}
    _write_batch(tmp_path / CIFAR10 / "test_batch", bad)

    with pytest.raises(pickle.UnpicklingError, match="refusing to unpickle .*getcwd"):
        load_dataset("cifar10", tmp_path)


def test_malformed_files_name_the_file_and_the_problem(tmp_path: Path) -> None:
    _write_cifar10(tmp_path)
    short = tmp_path / CIFAR10 / "data_batch_2"
    _write_batch(short, {b"data": _pixels(4, 0)[:, :3000], b"labels": [0, 1, 2, 3]})

    with pytest.raises(ValueError, match=r"data_batch_2: data must be uint8 N x 3072"):
        load_dataset("cifar10", tmp_path)

    other = tmp_path / "svhn"
    other.mkdir()
    _write_svhn(other / "test_32x32.mat", 2, seed=1)
    scipy.io.savemat(str(other / "train_32x32.mat"), {"X": np.zeros((32, 32, 3, 2), np.uint8)})
    with pytest.raises(ValueError, match="expected variables X and y"):
        load_dataset("svhn", other)
