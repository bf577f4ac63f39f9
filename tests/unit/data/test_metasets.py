"""Few-shot loaders: tiny mini-ImageNet and Meta-Dataset trees written to disk and read back."""

from __future__ import annotations

import os
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from flcore.data import metasets
from flcore.data.metasets import METASETS, ClassPool, load_class_pool
from flcore.errors import DataNotFoundError, UnknownNameError

MINI_SPLITS = {"train": ["n03", "n01", "n02"], "val": ["n05", "n04"], "test": ["n07", "n06"]}
MINI_ORDER = ("n01", "n02", "n03", "n04", "n05", "n06", "n07")  # train, val, test; sorted in each
BIRD_SPLITS = {"train": ["003.Wren", "001.Albatross"], "val": ["002.Gull"], "test": ["004.Tern"]}
PER_CLASS = 4


def _colour(label: int, k: int) -> tuple[int, int, int]:
    """A colour unique to (class, image), far enough apart to survive JPEG."""
    return (30 * label + 20, 60 * k + 10, 250 - 30 * label)


def _write(path: Path, colour: tuple[int, int, int], size: int, **save: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), colour).save(path, **save)


def _size(k: int) -> int:
    return 90 if k % 2 else 84  # odd images need resizing


@pytest.fixture
def mini_root(tmp_path: Path) -> Path:
    """mini-ImageNet with 3 train, 2 val, 2 test classes of 4 JPEGs; csv rows shuffled."""
    base = tmp_path / "miniimagenet"
    rng = random.Random(0)
    for split, wnids in MINI_SPLITS.items():
        rows = []
        for wnid in wnids:
            for k in range(PER_CLASS):
                name = f"{wnid}{k:08d}.jpg"
                _write(base / "images" / name, _colour(MINI_ORDER.index(wnid), k), _size(k))
                rows.append(f"{name},{wnid}")
        rng.shuffle(rows)
        (base / f"{split}.csv").write_text("filename,label\n" + "\n".join(rows) + "\n")
    return tmp_path


@pytest.fixture
def bird_root(tmp_path: Path) -> Path:
    """CUB_Bird with 2 train, 1 val, 1 test classes of 4 PNGs, plus files to ignore."""
    order = sorted(BIRD_SPLITS["train"]) + BIRD_SPLITS["val"] + BIRD_SPLITS["test"]
    for split, classes in BIRD_SPLITS.items():
        for name in classes:
            folder = tmp_path / "CUB_Bird" / split / name
            for k in range(PER_CLASS):
                suffix = ".PNG" if k == 3 else ".png"
                _write(folder / f"img{k}{suffix}", _colour(order.index(name), k), _size(k))
            (folder / "notes.txt").write_text("not an image")
            (folder / ".hidden.png").write_bytes(b"")
    return tmp_path


def _expected_colours(pool: ClassPool) -> torch.Tensor:
    """N x 3: the colour written for each sample (k-th image of its class, in file order)."""
    seen: dict[int, int] = {}
    out = []
    for label in pool.labels.tolist():
        k = seen.get(label, 0)
        seen[label] = k + 1
        out.append(_colour(label, k))
    return torch.tensor(out, dtype=torch.int16)


def test_registry_holds_the_five_datasets() -> None:
    assert METASETS.names() == ["aircraft", "bird", "fungi", "miniimagenet", "texture"]


def test_miniimagenet_orders_classes_train_val_then_test(mini_root: Path) -> None:
    pool = load_class_pool("miniimagenet", mini_root)

    assert pool.classes == MINI_ORDER
    assert pool.meta_train == (0, 1, 2, 3, 4)
    assert pool.meta_test == (5, 6)
    assert pool.images.dtype == torch.uint8 and pool.images.shape == (28, 3, 84, 84)
    assert pool.labels.dtype == torch.int64
    assert pool.labels.tolist() == [c for c in range(7) for _ in range(PER_CLASS)]
    assert (pool.info.name, pool.info.num_classes, pool.info.image_size) == ("miniimagenet", 7, 84)
    assert pool.info.mean == (0.485, 0.456, 0.406) and pool.info.std == (0.229, 0.224, 0.225)
    assert (pool.info.model, pool.info.class_groups, pool.info.samples_per_client) == (
        "conv4",
        (),
        0,
    )


def test_miniimagenet_pixels_land_at_their_labels(mini_root: Path) -> None:
    pool = load_class_pool("miniimagenet", mini_root)

    expected = _expected_colours(pool).view(-1, 3, 1, 1)
    error = (pool.images.to(torch.int16) - expected).abs().max()
    assert int(error) <= 8  # JPEG of a solid colour, resized or not


def test_bird_reads_class_folders_and_ignores_other_files(bird_root: Path) -> None:
    pool = load_class_pool("bird", bird_root)

    assert pool.classes == ("001.Albatross", "003.Wren", "002.Gull", "004.Tern")
    assert pool.meta_train == (0, 1, 2) and pool.meta_test == (3,)
    assert pool.images.shape == (16, 3, 84, 84)
    assert torch.equal(pool.labels.bincount(), torch.full((4,), PER_CLASS))
    expected = _expected_colours(pool).to(torch.uint8).view(-1, 3, 1, 1)
    assert torch.equal(pool.images, expected.expand_as(pool.images))  # PNG: exact


def test_other_sizes_are_resized_bilinearly_as_pil_does(bird_root: Path) -> None:
    rng = np.random.default_rng(0)
    pattern = rng.integers(0, 256, size=(90, 90, 3), dtype=np.uint8)
    path = bird_root / "CUB_Bird" / "test" / "004.Tern" / "img0.png"
    Image.fromarray(pattern).save(path)
    want = np.array(Image.fromarray(pattern).resize((32, 32), Image.Resampling.BILINEAR))

    pool = load_class_pool("bird", bird_root, image_size=32)

    first_tern = int((pool.labels == 3).nonzero()[0])
    assert pool.images.shape == (16, 3, 32, 32) and pool.info.image_size == 32
    assert torch.equal(pool.images[first_tern], torch.from_numpy(want).permute(2, 0, 1))


@pytest.mark.parametrize(
    ("name", "folder"),
    [("texture", "DTD_Texture"), ("aircraft", "FGVC_Aircraft"), ("fungi", "FGVCx_Fungi")],
)
def test_each_meta_dataset_reads_its_own_folder(tmp_path: Path, name: str, folder: str) -> None:
    for split in ("train", "val", "test"):
        _write(tmp_path / folder / split / f"{split}-class" / "a.jpeg", (1, 2, 3), 84)

    pool = load_class_pool(name, tmp_path)

    assert pool.classes == ("train-class", "val-class", "test-class")
    assert pool.meta_train == (0, 1) and pool.meta_test == (2,)
    assert pool.info.name == name


def test_the_cache_is_written_and_reused(bird_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = load_class_pool("bird", bird_root)
    cache = bird_root / "CUB_Bird" / ".fedsweep-bird-84.pt"
    assert cache.is_file()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("an image was opened despite the cache")

    monkeypatch.setattr(Image, "open", refuse)
    again = load_class_pool("bird", bird_root)

    assert torch.equal(again.images, first.images)
    assert torch.equal(again.labels, first.labels) and again.classes == first.classes
    assert list(cache.parent.glob("*.partial")) == []


def test_the_cache_is_rebuilt_when_a_file_changes(bird_root: Path) -> None:
    load_class_pool("bird", bird_root)
    changed = bird_root / "CUB_Bird" / "train" / "001.Albatross" / "img0.png"
    _write(changed, (7, 8, 9), 84)
    os.utime(changed, ns=(1, 1))  # a new mtime even on coarse-grained file systems

    pool = load_class_pool("bird", bird_root)

    assert pool.images[0, :, 0, 0].tolist() == [7, 8, 9]


def test_an_unwritable_folder_loads_without_a_cache(
    bird_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError("read-only file system")

    monkeypatch.setattr(torch, "save", refuse)

    pool = load_class_pool("bird", bird_root)

    assert len(pool) == 16
    assert list((bird_root / "CUB_Bird").glob(".fedsweep-*")) == []  # no cache, no partial file


@pytest.mark.parametrize(
    ("name", "folder"),
    [("miniimagenet", "miniimagenet"), ("bird", "CUB_Bird"), ("fungi", "FGVCx_Fungi")],
)
def test_a_missing_layout_names_the_expected_path(tmp_path: Path, name: str, folder: str) -> None:
    with pytest.raises(DataNotFoundError, match="not found: expected") as err:
        load_class_pool(name, tmp_path)

    assert str(tmp_path / folder) in str(err.value)


def test_a_missing_csv_is_data_not_found(mini_root: Path) -> None:
    (mini_root / "miniimagenet" / "val.csv").unlink()

    with pytest.raises(DataNotFoundError, match="train.csv, val.csv, test.csv and images/"):
        load_class_pool("miniimagenet", mini_root)


def test_an_image_named_in_a_csv_must_exist(mini_root: Path) -> None:
    (mini_root / "miniimagenet" / "images" / "n0600000002.jpg").unlink()

    with pytest.raises(DataNotFoundError, match="n0600000002.jpg"):
        load_class_pool("miniimagenet", mini_root)


def test_a_class_in_two_csvs_is_an_error(mini_root: Path) -> None:
    with open(mini_root / "miniimagenet" / "test.csv", "a") as handle:
        handle.write("n0100000000.jpg,n01\n")

    with pytest.raises(ValueError, match="class n01 is in both"):
        load_class_pool("miniimagenet", mini_root)


def test_an_empty_class_folder_is_an_error(bird_root: Path) -> None:
    empty = bird_root / "CUB_Bird" / "val" / "005.Empty"
    empty.mkdir()

    with pytest.raises(ValueError, match=str(empty)):
        load_class_pool("bird", bird_root)


def test_an_unknown_name_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError, match="miniimagenet"):
        load_class_pool("omniglot", tmp_path)


def test_the_root_defaults_to_fedsweep_data_root(
    bird_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEDSWEEP_DATA_ROOT", str(bird_root))

    pool = load_class_pool("bird")

    assert len(pool.classes) == 4


def test_a_class_pool_rejects_overlapping_or_empty_splits(bird_root: Path) -> None:
    pool = metasets.load_bird(bird_root, 84)

    with pytest.raises(ValueError, match="disjoint"):
        replace(pool, meta_test=(2, 3))
    with pytest.raises(ValueError, match="meta_test must be non-empty"):
        replace(pool, meta_test=())
    with pytest.raises(ValueError, match="in \\[0, 4\\)"):
        replace(pool, meta_train=(0, 4))
    with pytest.raises(ValueError, match="uint8"):
        replace(pool, images=pool.images.float())


def test_a_meta_learning_run_on_mini_imagenet_files(mini_root: Path) -> None:
    # Prepare: one 2-way 1-shot task from the 5 meta-training classes (4 images each: a second
    # client could need a class's images twice), an unseen client from the 2 meta-testing
    # classes, CONV4 on 84 x 84 RGB
    from flcore.config import validate_config
    from flcore.experiment import build_engine

    raw = {
        "algorithm": "fedmaml",
        "dataset": "miniimagenet",
        "data_root": str(mini_root),
        "model_params": {"hidden": 8},
        "num_clients": 1,
        "rounds": 2,
        "lr": 0.001,
        "workers": 1,
        "fewshot": {"n_way": 2, "k_shot": 1, "query": 1, "test_query": 1, "unseen_clients": 1},
        "algorithm_params": {"inner_steps": 1, "clients_per_round": 1},
    }
    # Execute
    engine = build_engine(validate_config(raw))
    summary = engine.run()
    # Assert: the clients' tasks come from the meta-training classes, the unseen one's from the
    # meta-testing classes, and both accuracies are measured
    data = engine.data
    assert data.info.num_classes == 2 and data.info.image_size == 84
    train_classes = set(data.splits.train.labels[list(data.train.client_indices[0])].tolist())
    assert train_classes <= set(range(5))
    unseen = data.splits.train.labels[list(data.unseen_support.client_indices[0])].tolist()
    assert set(unseen) == {5, 6}
    assert 0 <= summary["accuracy"] <= 1 and 0 <= summary["unseen_accuracy"] <= 1
