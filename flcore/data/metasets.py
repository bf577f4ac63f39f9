"""Class-structured few-shot image datasets (LoDMeta's benchmarks), read offline into uint8 pools.

Nothing is downloaded: each loader reads a folder the user has unpacked under the data root
(``root=`` or ``$FEDSWEEP_DATA_ROOT``). Two layouts are supported.

mini-ImageNet (``miniimagenet``), the split of Ravi & Larochelle, "Optimization as a Model for
Few-Shot Learning" (ICLR 2017): 100 ImageNet classes, 600 images each, 64 train / 16 val / 20 test
classes::

    <root>/miniimagenet/
        train.csv  val.csv  test.csv   header "filename,label"; label is the wnid (n01532829),
                                       filename the image's name (n0153282900000005.jpg)
        images/                        every image file, flat

Meta-Dataset subsets (``bird``, ``texture``, ``aircraft``, ``fungi``): CUB-200-2011, DTD,
FGVC-Aircraft and FGVCx Fungi from Triantafillou et al., "Meta-Dataset: A Dataset of Datasets for
Learning to Learn from Few Examples" (ICLR 2020), in the folders released with Yao et al.,
"Hierarchically Structured Meta-learning" (HSML, ICML 2019)::

    <root>/CUB_Bird/        (bird)       each holding
    <root>/DTD_Texture/     (texture)        train/<class>/<images>
    <root>/FGVC_Aircraft/   (aircraft)       val/<class>/<images>
    <root>/FGVCx_Fungi/     (fungi)          test/<class>/<images>

Meta-training and meta-testing: the classes of train and val (train first, each sorted by name)
are the meta-training classes, from which training clients draw their tasks; the test classes are
the meta-testing classes of the unseen clients, which join after meta-training. The two sets are
disjoint; a class named in two splits is an error. Images (.jpg, .jpeg, .png, any case; other
files ignored) are read in sorted order, converted to RGB and resized with PIL's bilinear
``Image.resize`` to ``image_size`` square when they are not that size already.

Cache: decoding 60,000 JPEGs takes minutes, so the decoded images are saved next to the data as
``<dataset folder>/.fedsweep-<name>-<image_size>.pt`` together with a fingerprint of the files read
(sha256 of their relative names, sizes and modification times). A cache whose fingerprint differs
is rebuilt; when the folder is not writable the pool is simply decoded every time.
"""

from __future__ import annotations

import csv
import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from flcore.data.datasets import DatasetInfo, default_data_root
from flcore.errors import DataNotFoundError
from flcore.registry import Registry

__all__ = ["ClassPool", "IMAGE_SUFFIXES", "METASETS", "META_DATASET_FOLDERS", "load_class_pool"]

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png"})
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: Registry name -> the HSML release's folder name and a title for messages.
META_DATASET_FOLDERS: dict[str, tuple[str, str]] = {
    "bird": ("CUB_Bird", "CUB-200-2011 (bird)"),
    "texture": ("DTD_Texture", "DTD (texture)"),
    "aircraft": ("FGVC_Aircraft", "FGVC-Aircraft (aircraft)"),
    "fungi": ("FGVCx_Fungi", "FGVCx Fungi (fungi)"),
}
_SPLITS = ("train", "val", "test")
_DECODE_THREADS = 2
_CACHE_VERSION = 1


@dataclass(frozen=True)
class ClassPool:
    """Images of a class-structured dataset for few-shot tasks."""

    images: torch.Tensor  # uint8, N x 3 x image_size x image_size
    labels: torch.Tensor  # int64, N: index into ``classes``
    classes: tuple[str, ...]  # class names (mini-ImageNet wnids, folder names), index = label
    meta_train: tuple[int, ...]  # class indices of the training clients' tasks
    meta_test: tuple[int, ...]  # class indices of the unseen clients' tasks
    info: DatasetInfo
    #: provenance: the files' fingerprint (names, sizes, mtimes) and the folder they came from
    checksum: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        info = self.info
        expected = (info.in_channels, info.image_size, info.image_size)
        if (
            self.images.dtype != torch.uint8
            or self.images.dim() != 4
            or tuple(self.images.shape[1:]) != expected
        ):
            raise ValueError(
                f"images must be uint8 N x {' x '.join(map(str, expected))}, got "
                f"{self.images.dtype} {tuple(self.images.shape)}"
            )
        if self.labels.dtype != torch.int64 or self.labels.shape != self.images.shape[:1]:
            raise ValueError("labels must be int64 with one label per image")
        if len(set(self.classes)) != len(self.classes) or info.num_classes != len(self.classes):
            raise ValueError("classes must be distinct, as many as info.num_classes")
        n = len(self.classes)
        if len(self.labels) and not 0 <= int(self.labels.min()) <= int(self.labels.max()) < n:
            raise ValueError(f"labels must lie in [0, {n})")
        for name, split in (("meta_train", self.meta_train), ("meta_test", self.meta_test)):
            if not split or len(set(split)) != len(split) or not all(0 <= c < n for c in split):
                raise ValueError(f"{name} must be non-empty distinct class indices in [0, {n})")
        if set(self.meta_train) & set(self.meta_test):
            raise ValueError("meta_train and meta_test must be disjoint")

    def __len__(self) -> int:
        return int(self.labels.shape[0])


MetaLoader = Callable[[Path, int], ClassPool]
METASETS: Registry[MetaLoader] = Registry("few-shot dataset")


def load_class_pool(name: str, root: str | Path | None = None, image_size: int = 84) -> ClassPool:
    """Load few-shot dataset ``name`` from ``root`` (default: :func:`default_data_root`).

    Raises:
        UnknownNameError: ``name`` is not registered in :data:`METASETS`.
        DataNotFoundError: the dataset's folder, a csv or an image is missing.
        ValueError: an empty class folder, a class in two splits, a bad ``image_size``.
    """
    loader = METASETS.get(name)
    path = Path(root).expanduser() if root is not None else default_data_root()
    return loader(path, image_size)


# --- the layouts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """What a loader will read: image files grouped by label, and the files that listed them."""

    name: str
    base: Path
    files: list[Path]
    labels: list[int]
    classes: tuple[str, ...]
    num_meta_train: int
    listings: list[Path]  # csv files, part of the fingerprint


@METASETS.register("miniimagenet")
def load_miniimagenet(root: Path, image_size: int = 84) -> ClassPool:
    """mini-ImageNet (Ravi & Larochelle split) from ``<root>/miniimagenet/``."""
    base = root / "miniimagenet"
    csvs = [base / f"{split}.csv" for split in _SPLITS]
    images = base / "images"
    if not (all(p.is_file() for p in csvs) and images.is_dir()):
        raise DataNotFoundError(
            f"mini-ImageNet not found: expected {base}/train.csv, val.csv, test.csv and images/ "
            "(the Ravi & Larochelle split); unpack it there, or point FEDSWEEP_DATA_ROOT (or "
            "root=) at a folder holding miniimagenet/."
        )
    present = set(os.listdir(images))
    split_classes: list[dict[str, list[str]]] = []
    owner: dict[str, Path] = {}
    for path in csvs:
        by_class = _read_csv(path)
        for wnid in by_class:
            if wnid in owner:
                raise ValueError(f"mini-ImageNet: class {wnid} is in both {owner[wnid]} and {path}")
            owner[wnid] = path
        for wnid, names in by_class.items():
            for filename in names:
                if filename not in present:
                    raise DataNotFoundError(
                        f"mini-ImageNet: {path} names {filename} (class {wnid}), but "
                        f"{images / filename} does not exist"
                    )
        split_classes.append(by_class)
    groups = [
        (wnid, [images / f for f in sorted(d[wnid])]) for d in split_classes for wnid in sorted(d)
    ]
    return _build(
        _plan("miniimagenet", base, groups, len(split_classes[0]) + len(split_classes[1]), csvs),
        image_size,
    )


def _read_csv(path: Path) -> dict[str, list[str]]:
    """``label -> [filename, ...]`` of one Ravi & Larochelle csv."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        if not {"filename", "label"} <= set(reader.fieldnames or ()):
            raise ValueError(f"{path}: expected the header 'filename,label'")
        by_class: dict[str, list[str]] = {}
        for line, row in enumerate(reader, start=2):
            filename, label = (row["filename"] or "").strip(), (row["label"] or "").strip()
            if not filename or not label:
                raise ValueError(f"{path}, line {line}: empty filename or label")
            by_class.setdefault(label, []).append(filename)
    return by_class


def _load_meta_dataset(name: str, root: Path, image_size: int) -> ClassPool:
    """A Meta-Dataset subset in the HSML layout: ``<folder>/{train,val,test}/<class>/<images>``."""
    folder, title = META_DATASET_FOLDERS[name]
    base = root / folder
    if not all((base / split).is_dir() for split in _SPLITS):
        raise DataNotFoundError(
            f"{title} not found: expected {base}/train/, val/ and test/, each with one "
            "sub-folder of images per class (the Meta-Dataset release of Yao et al. 2019, "
            f"HSML); unpack it there, or point FEDSWEEP_DATA_ROOT (or root=) at a folder "
            f"holding {folder}/."
        )
    groups: list[tuple[str, list[Path]]] = []
    owner: dict[str, Path] = {}
    num_meta_train = 0
    for split in _SPLITS:
        for class_dir in sorted(p for p in (base / split).iterdir() if _visible_dir(p)):
            if class_dir.name in owner:
                raise ValueError(
                    f"{title}: class {class_dir.name} is in both {owner[class_dir.name]} and "
                    f"{class_dir.parent}"
                )
            owner[class_dir.name] = class_dir.parent
            files = sorted(p for p in class_dir.iterdir() if _is_image(p))
            if not files:
                raise ValueError(f"{title}: class folder {class_dir} holds no .jpg/.jpeg/.png")
            groups.append((class_dir.name, files))
        if split == "val":
            num_meta_train = len(groups)
    return _build(_plan(name, base, groups, num_meta_train, []), image_size)


@METASETS.register("bird")
def load_bird(root: Path, image_size: int = 84) -> ClassPool:
    """CUB-200-2011 from ``<root>/CUB_Bird/{train,val,test}/<class>/``."""
    return _load_meta_dataset("bird", root, image_size)


@METASETS.register("texture")
def load_texture(root: Path, image_size: int = 84) -> ClassPool:
    """DTD from ``<root>/DTD_Texture/{train,val,test}/<class>/``."""
    return _load_meta_dataset("texture", root, image_size)


@METASETS.register("aircraft")
def load_aircraft(root: Path, image_size: int = 84) -> ClassPool:
    """FGVC-Aircraft from ``<root>/FGVC_Aircraft/{train,val,test}/<class>/``."""
    return _load_meta_dataset("aircraft", root, image_size)


@METASETS.register("fungi")
def load_fungi(root: Path, image_size: int = 84) -> ClassPool:
    """FGVCx Fungi from ``<root>/FGVCx_Fungi/{train,val,test}/<class>/``."""
    return _load_meta_dataset("fungi", root, image_size)


def _visible_dir(path: Path) -> bool:
    return not path.name.startswith(".") and path.is_dir()


def _is_image(path: Path) -> bool:
    return (
        not path.name.startswith(".") and path.suffix.lower() in IMAGE_SUFFIXES and path.is_file()
    )


def _plan(
    name: str,
    base: Path,
    groups: Sequence[tuple[str, list[Path]]],
    num_meta_train: int,
    listings: list[Path],
) -> _Plan:
    files = [f for _, fs in groups for f in fs]
    labels = [label for label, (_, fs) in enumerate(groups) for _ in fs]
    classes = tuple(c for c, _ in groups)
    return _Plan(name, base, files, labels, classes, num_meta_train, listings)


# --- decoding and the cache ---------------------------------------------------------------------


def _build(plan: _Plan, image_size: int) -> ClassPool:
    """Decode the plan's images (or take them from a matching cache) into a :class:`ClassPool`."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    cache = plan.base / f".fedsweep-{plan.name}-{image_size}.pt"
    fingerprint = _fingerprint(plan, image_size)
    images = _read_cache(cache, fingerprint, (len(plan.files), 3, image_size, image_size))
    if images is None:
        images = _decode_all(plan.files, image_size)
        _write_cache(cache, fingerprint, images)
    n = len(plan.classes)
    return ClassPool(
        images=images,
        labels=torch.tensor(plan.labels, dtype=torch.int64),
        classes=plan.classes,
        meta_train=tuple(range(plan.num_meta_train)),
        meta_test=tuple(range(plan.num_meta_train, n)),
        info=DatasetInfo(
            plan.name, n, 3, image_size, IMAGENET_MEAN, IMAGENET_STD, (), 0, 0, "conv4"
        ),
        checksum=fingerprint,
        source=str(plan.base),
    )


def _fingerprint(plan: _Plan, image_size: int) -> str:
    """sha256 of the files' relative names, sizes and mtimes: cheap, and changes with any edit."""
    digest = hashlib.sha256(f"v{_CACHE_VERSION} {image_size} {plan.classes}\n".encode())
    entries = [(-1, p) for p in plan.listings] + list(zip(plan.labels, plan.files, strict=True))
    for label, path in entries:
        stat = path.stat()
        rel = path.relative_to(plan.base).as_posix()
        digest.update(f"{label}\t{rel}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _decode(path: Path, image_size: int) -> np.ndarray:
    """One image as uint8 H x W x 3, resized bilinearly to ``image_size`` square if needed."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            rgb = img.convert("RGB")
    except OSError as err:
        raise ValueError(f"cannot decode image {path}: {err}") from err
    if rgb.size != (image_size, image_size):
        rgb = rgb.resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.asarray(rgb, dtype=np.uint8)


def _decode_all(files: list[Path], image_size: int) -> torch.Tensor:
    images = np.empty((len(files), 3, image_size, image_size), dtype=np.uint8)
    # PIL releases the GIL while decoding, so a couple of threads nearly halve the wall time.
    with ThreadPoolExecutor(max_workers=_DECODE_THREADS) as pool:
        for i, array in enumerate(pool.map(partial(_decode, image_size=image_size), files)):
            images[i] = array.transpose(2, 0, 1)
    return torch.from_numpy(images)


def _read_cache(path: Path, fingerprint: str, shape: tuple[int, ...]) -> torch.Tensor | None:
    """The cached images if ``path`` holds them for ``fingerprint``, else ``None``."""
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError):
        return None  # truncated or unreadable: rebuild
    if not isinstance(saved, dict) or saved.get("fingerprint") != fingerprint:
        return None
    images = saved.get("images")
    if not isinstance(images, torch.Tensor) or images.dtype != torch.uint8:
        return None
    return images if tuple(images.shape) == shape else None


def _write_cache(path: Path, fingerprint: str, images: torch.Tensor) -> None:
    """Save the cache atomically (write, then rename); a read-only folder means no cache."""
    partial_file: Path | None = None
    try:
        with tempfile.NamedTemporaryFile(
            dir=path.parent, prefix=f"{path.name}.", suffix=".partial", delete=False
        ) as handle:
            partial_file = Path(handle.name)
            torch.save({"fingerprint": fingerprint, "images": images}, handle)
        partial_file.replace(path)
    except OSError:
        if partial_file is not None:
            partial_file.unlink(missing_ok=True)
