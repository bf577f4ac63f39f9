"""Real image datasets, loaded through torchvision once and held in memory as uint8 tensors.

Why uint8 in memory: a whole split of Fashion-MNIST is 47 MB as uint8 and four times that as
float32; clients index into the shared tensors and :func:`normalize` turns each batch into floats
on the fly, so metrics that need pixel values (PSNR of a reconstruction) read the raw images and
never normalized ones.

Every loader is ``(root: Path) -> DatasetSplits``, registered in :data:`DATASETS`; the static facts
about a dataset (:class:`DatasetInfo`) live in :data:`DATASET_INFO` so a config can be checked
without reading a byte of data.

Normalization constants: for Fashion-MNIST and EMNIST we use MNIST's (0.1307,), (0.3081,),
because that is what the HyperFL authors' code applies to those datasets; the CIFAR-10 values
(std 0.2023, 0.1994, 0.2010) are the ones common in FL code, the CIFAR-100 values are the usual
per-channel statistics of its training split.

CIFAR-10/100 and SVHN are read straight from their standard files (the python-version pickled
batches; the ``*_32x32.mat`` files) rather than through torchvision's classes, which check MD5
sums and so refuse any copy that is not byte-identical to the published one; torchvision is used
only to download missing files.

EMNIST: the NIST files store each character transposed and torchvision (0.29) does not undo it
(pytorch/vision issue #8783, open), so the loader transposes height and width to make characters
upright.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flcore.errors import DataNotFoundError, UnknownNameError
from flcore.registry import Registry

__all__ = [
    "ArrayDataset",
    "DATASETS",
    "DATASET_INFO",
    "DEBIAN_FASHION_MNIST_DIR",
    "DatasetInfo",
    "DatasetSplits",
    "dataset_info",
    "default_data_root",
    "denormalize",
    "load_dataset",
    "clear_dataset_cache",
    "normalize",
]

#: Where Debian's package ``dataset-fashion-mnist`` installs its four .gz files. A module
#: constant so tests (and unusual installs) can point it elsewhere.
DEBIAN_FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
DEBIAN_INSTALL_COMMAND = "sudo apt-get update && sudo apt-get install -y dataset-fashion-mnist"

_MNIST_FILES = (  # the order the checksum reads them in
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a dataset: shape, normalization, HyperFL groups, default sizes."""

    name: str
    num_classes: int
    in_channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_groups: tuple[tuple[int, ...], ...]
    samples_per_client: int
    test_samples_per_client: int
    model: str

    def __post_init__(self) -> None:
        if not len(self.mean) == len(self.std) == self.in_channels:
            raise ValueError(f"{self.name}: mean and std need one value per channel")


@dataclass(frozen=True)
class ArrayDataset:
    """Images (uint8, N x C x H x W) and labels (int64, N) held as tensors."""

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        if self.images.dtype != torch.uint8 or self.images.dim() != 4:
            raise ValueError(
                f"images must be uint8 N x C x H x W, got {self.images.dtype} "
                f"{tuple(self.images.shape)}"
            )
        if self.labels.dtype != torch.int64 or self.labels.shape != self.images.shape[:1]:
            raise ValueError("labels must be int64 with one label per image")

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass(frozen=True)
class DatasetSplits:
    """A loaded dataset: its info, both splits, and where the bytes came from."""

    info: DatasetInfo
    train: ArrayDataset
    test: ArrayDataset
    checksum: str  # sha256 (hex) of the source files read, concatenated in a fixed order
    source: str


Loader = Callable[[Path], DatasetSplits]
DATASETS: Registry[Loader] = Registry("dataset")

_TEN_GROUPS = ((0, 1, 2), (2, 3, 4), (4, 5, 6), (6, 7, 8), (8, 9, 0))


def _gray(name: str, classes: int, groups: tuple[tuple[int, ...], ...], n: int) -> DatasetInfo:
    """A 1 x 28 x 28 dataset with MNIST's normalization (what HyperFL's code uses)."""
    return DatasetInfo(name, classes, 1, 28, (0.1307,), (0.3081,), groups, n, 600, "cnn_fmnist")


def _color(
    name: str,
    classes: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    groups: tuple[tuple[int, ...], ...] = _TEN_GROUPS,
) -> DatasetInfo:
    """A 3 x 32 x 32 dataset with 600 train / 300 test samples per client."""
    return DatasetInfo(name, classes, 3, 32, mean, std, groups, 600, 300, "cnn_cifar")


DATASET_INFO: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        _gray("fmnist", 10, _TEN_GROUPS, 600),
        _gray("emnist", 62, (tuple(range(10)), tuple(range(10, 36)), tuple(range(36, 62))), 1000),
        _color("cifar10", 10, (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
        _color(
            "cifar100",
            100,
            (0.5071, 0.4865, 0.4409),
            (0.2673, 0.2564, 0.2762),
            tuple(tuple(range(g, g + 20)) for g in range(0, 100, 20)),
        ),
        _color("svhn", 10, (0.4377, 0.4438, 0.4728), (0.198, 0.201, 0.197)),
        _color(
            "cinic10",
            10,
            (0.47889522, 0.47227842, 0.43047404),
            (0.24205776, 0.23828046, 0.25874835),
        ),
    )
}


def dataset_info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of ``name``; an unknown name lists the known ones."""
    try:
        return DATASET_INFO[name]
    except KeyError:
        raise UnknownNameError("dataset", name, sorted(DATASET_INFO)) from None


def default_data_root() -> Path:
    """``$FEDSWEEP_DATA_ROOT`` if set, else ``~/.cache/fedsweep/data``."""
    env = os.environ.get("FEDSWEEP_DATA_ROOT")
    return Path(env) if env else Path.home() / ".cache" / "fedsweep" / "data"


def load_dataset(name: str, root: str | Path | None = None) -> DatasetSplits:
    """Load dataset ``name`` from ``root`` (created if missing), else by download.

    Raises:
        UnknownNameError: ``name`` is not a registered dataset.
        DataNotFoundError: the data is neither under ``root`` nor downloadable.
    """
    loader = DATASETS.get(name)
    path = Path(root).expanduser() if root is not None else default_data_root()
    key = (name, str(path.resolve()))
    # A sweep worker runs many trials on one dataset: decode it once per process. The tensors
    # are shared read-only by every caller.
    if key not in _LOADED:
        path.mkdir(parents=True, exist_ok=True)
        _LOADED[key] = loader(path)
    return _LOADED[key]


_LOADED: dict[tuple[str, str], DatasetSplits] = {}


def clear_dataset_cache() -> None:
    """Forget datasets loaded in this process (the next load reads the files again)."""
    _LOADED.clear()


# --- normalization ------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _affine(
    mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``scale, shift`` with ``(x/255 - mean)/std == x*scale - shift``, shaped C x 1 x 1."""
    m = torch.tensor(mean, dtype=torch.float32, device=device).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device=device).view(-1, 1, 1)
    return 1.0 / (255.0 * s), m / s


def _check_channels(x: torch.Tensor, info: DatasetInfo) -> None:
    # Broadcasting would silently turn a 1-channel batch into 3 channels; refuse instead.
    if x.dim() < 3 or x.shape[-3] != info.in_channels:
        raise ValueError(
            f"{info.name} images have {info.in_channels} channel(s) in dim -3, "
            f"got shape {tuple(x.shape)}"
        )


def normalize(images: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    """uint8 images (…, C, H, W) -> ``(x/255 - mean) / std`` per channel, in torch's default
    dtype (float32, unless a float64 check set it)."""
    if images.dtype != torch.uint8:
        raise TypeError(f"normalize expects uint8 images, got {images.dtype}")
    _check_channels(images, info)
    scale, shift = _affine(info.mean, info.std, images.device)
    return images.to(torch.get_default_dtype()).mul_(scale).sub_(shift)


def conv_layout(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Images (N, C, H, W) laid out as convolutions run them fastest on ``device``: channels-last
    on the CPU (oneDNN's kernels: a training step of Pa3dFL's FMNIST CNN on one thread ran
    1.3-1.4x as fast; BENCHMARKS.md, "CPU image layout"), as they are elsewhere. Same values,
    same shape; an indexed subset keeps the layout."""
    if x.dim() == 4 and device.type == "cpu":
        return x.to(memory_format=torch.channels_last)
    return x


def denormalize(x: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    """Inverse of :func:`normalize` onto pixel intensities in [0, 1] (clamped), float32."""
    _check_channels(x, info)
    scale, shift = _affine(info.mean, info.std, x.device)
    return ((x.to(torch.float32) + shift) / (scale * 255.0)).clamp_(0.0, 1.0)


# --- helpers shared by the loaders --------------------------------------------------------------


def _sha256(files: Iterable[Path]) -> str:
    """sha256 of the files' bytes concatenated in order (``cat files | sha256sum``)."""
    digest = hashlib.sha256()
    for file in files:
        with open(file, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def _array_dataset(images: Any, labels: Any, *, channels_last: bool = False) -> ArrayDataset:
    x = torch.as_tensor(np.asarray(images) if not torch.is_tensor(images) else images)
    if x.dim() == 3:
        x = x.unsqueeze(1)
    elif channels_last:
        x = x.permute(0, 3, 1, 2)
    y = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
    return ArrayDataset(x.to(torch.uint8).contiguous(), y.clone())


OpenSplit = Callable[[bool, bool], Any]  # (train, download) -> torchvision dataset


def _download_pair(open_split: OpenSplit) -> tuple[Any, Any]:
    """Ask torchvision to download both splits: the one step that touches the network."""
    return open_split(True, True), open_split(False, True)


def _open_pair(name: str, root: Path, open_split: OpenSplit, layout: str) -> tuple[Any, Any, str]:
    """Open (train, test) from ``root``, else by torchvision download; ``how`` says which."""
    try:
        return open_split(True, False), open_split(False, False), f"{root} (data root)"
    except (RuntimeError, OSError) as err:
        local_error = err
    try:
        train, test = _download_pair(open_split)
    except (RuntimeError, OSError) as err:
        raise DataNotFoundError(
            f"dataset {name!r} not found under data root {root} ({_short(local_error)}), and "
            f"torchvision's download failed ({_short(err)}). Provide it by placing {layout} "
            f"under {root}, by running once with network access, or by pointing "
            "FEDSWEEP_DATA_ROOT (or root=) at a folder that holds it."
        ) from err
    return train, test, f"{root} (downloaded by torchvision)"


def _short(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:200]}"


def _mnist_source_files(dataset: Any, names: Iterable[str]) -> list[Path]:
    """The files torchvision read for an MNIST-family dataset (legacy .pt files take priority)."""
    processed = Path(dataset.processed_folder)
    legacy = [processed / dataset.training_file, processed / dataset.test_file]
    if all(p.is_file() for p in legacy):
        return legacy
    return [Path(dataset.raw_folder) / n for n in names]


# --- Fashion-MNIST ------------------------------------------------------------------------------


def _fmnist_opener(root: Path) -> OpenSplit:
    from torchvision.datasets import FashionMNIST

    return lambda train, download: FashionMNIST(str(root), train=train, download=download)


def _unpack_debian(root: Path) -> None:
    """Decompress the Debian .gz files into ``<root>/FashionMNIST/raw/``.

    Debian re-compresses the files, so torchvision's MD5 check of the .gz fails; the unzipped idx
    files are what torchvision looks for, and with them present it never goes to the network.
    """
    sources = [DEBIAN_FASHION_MNIST_DIR / f"{n}.gz" for n in _MNIST_FILES]
    missing = [p.name for p in sources if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"missing {', '.join(missing)} in {DEBIAN_FASHION_MNIST_DIR}")
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for src, name in zip(sources, _MNIST_FILES, strict=True):
        # Renamed only when complete: no half files left. The temporary name is unique, so
        # processes or threads unpacking at once (parallel trials, runs started together) never
        # collide; the last rename wins, with identical bytes.
        with (
            gzip.open(src, "rb") as fin,
            tempfile.NamedTemporaryFile(
                dir=raw, prefix=f"{name}.", suffix=".partial", delete=False
            ) as fout,
        ):
            shutil.copyfileobj(fin, fout, 1 << 20)
        Path(fout.name).replace(raw / name)


@DATASETS.register("fmnist")
def load_fmnist(root: Path) -> DatasetSplits:
    """Fashion-MNIST from, in order: the data root; Debian's package; torchvision's download."""
    root.mkdir(parents=True, exist_ok=True)
    open_split = _fmnist_opener(root)
    tried: list[str] = []
    splits: tuple[Any, Any] | None = None
    how = ""
    try:
        splits, how = (open_split(True, False), open_split(False, False)), f"{root} (data root)"
    except (RuntimeError, OSError) as err:
        tried.append(f"1. the data root {root}: {_short(err)}")
    if splits is None:
        try:
            _unpack_debian(root)
            splits = open_split(True, True), open_split(False, True)
            how = f"{root}, unpacked from {DEBIAN_FASHION_MNIST_DIR} (Debian dataset-fashion-mnist)"
        except (RuntimeError, OSError, EOFError) as err:
            tried.append(
                f"2. Debian's package dataset-fashion-mnist at {DEBIAN_FASHION_MNIST_DIR}: "
                f"{_short(err)}; install it with: {DEBIAN_INSTALL_COMMAND}"
            )
    if splits is None:
        try:
            splits, how = _download_pair(open_split), f"{root} (downloaded by torchvision)"
        except (RuntimeError, OSError) as err:
            tried.append(f"3. torchvision's download into {root}: {_short(err)}")
            raise DataNotFoundError(
                "Fashion-MNIST not found. Tried three ways:\n  " + "\n  ".join(tried)
            ) from err
    train, test = splits
    return DatasetSplits(
        info=DATASET_INFO["fmnist"],
        train=_array_dataset(train.data, train.targets),
        test=_array_dataset(test.data, test.targets),
        checksum=_sha256(_mnist_source_files(train, _MNIST_FILES)),
        source=f"torchvision FashionMNIST from {how}",
    )


# --- the other datasets: data root, then torchvision's download ---------------------------------


@DATASETS.register("emnist")
def load_emnist(root: Path) -> DatasetSplits:
    """EMNIST byclass (62 classes), transposed so that characters stand upright."""
    from torchvision.datasets import EMNIST

    def open_split(train: bool, download: bool) -> Any:
        return EMNIST(str(root), split="byclass", train=train, download=download)

    layout = "EMNIST/raw/emnist-byclass-{train,test}-{images-idx3,labels-idx1}-ubyte"
    train, test, how = _open_pair("emnist", root, open_split, layout)
    files = [Path(f) for d in (train, test) for f in (d.images_file, d.labels_file)]
    return DatasetSplits(
        info=DATASET_INFO["emnist"],
        train=_array_dataset(train.data.transpose(1, 2), train.targets),
        test=_array_dataset(test.data.transpose(1, 2), test.targets),
        checksum=_sha256(files),
        source=f"torchvision EMNIST(byclass) from {how}",
    )


# --- CIFAR-10 / CIFAR-100 and SVHN: read straight from the standard files -----------------------
#
# torchvision's CIFAR and SVHN classes check each file's MD5 before reading it, which refuses any
# copy that is not byte-identical to the archive's (a re-pickled batch, a test's small file). These
# readers parse the formats themselves; torchvision is asked only to download the files when none
# of them is there, which is the one step that touches the network.


@dataclass(frozen=True)
class _Files:
    """Where one dataset's files live under the data root and where a user gets them."""

    name: str
    folder: str  # relative to the data root ("" for the root itself)
    train: tuple[str, ...]
    test: tuple[str, ...]
    origin: str

    def missing(self, root: Path) -> list[str]:
        return [n for n in self.train + self.test if not (root / self.folder / n).is_file()]

    def paths(self, root: Path, names: Iterable[str]) -> list[Path]:
        return [root / self.folder / n for n in names]


_CIFAR10_FILES = _Files(
    "cifar10",
    "cifar-10-batches-py",
    tuple(f"data_batch_{i}" for i in range(1, 6)),
    ("test_batch",),
    "cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, unpacked",
)
_CIFAR100_FILES = _Files(
    "cifar100",
    "cifar-100-python",
    ("train",),
    ("test",),
    "cifar-100-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, unpacked",
)
_SVHN_FILES = _Files(
    "svhn",
    "",
    ("train_32x32.mat",),
    ("test_32x32.mat",),
    "the format-2 (cropped digits) files from http://ufldl.stanford.edu/housenumbers/",
)


def _ensure_files(files: _Files, root: Path, open_split: OpenSplit) -> str:
    """Check that every file is under ``root``, else have torchvision download them; says which.

    Only a dataset with none of its files present is downloaded: the download would replace the
    files that are there, which may be the user's own (differing) copies.

    Raises:
        DataNotFoundError: files are missing, and some are present or the download failed.
    """
    missing = files.missing(root)
    if not missing:
        return f"{root} (data root)"
    if len(missing) < len(files.train + files.test):
        reason = "the other files are there, so nothing is downloaded over them"
    else:
        try:
            _download_pair(open_split)
            reason = "the download did not provide them"
        except (RuntimeError, OSError) as err:
            reason = f"torchvision's download failed ({_short(err)})"
        missing = files.missing(root)
    if missing:
        where = root / files.folder
        raise DataNotFoundError(
            f"dataset {files.name!r} not found under data root {root}: missing "
            f"{', '.join(missing)} in {where}; {reason}. Put "
            f"{', '.join(files.train + files.test)} in {where} ({files.origin}), run once with "
            "network access, or point FEDSWEEP_DATA_ROOT (or root=) at a folder that holds them."
        )
    return f"{root} (downloaded by torchvision)"


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles only what the CIFAR batches hold (dicts, lists, bytes, numpy arrays).

    Any other global is refused, so a data file cannot make the loader call other functions.
    """

    _ALLOWED = frozenset(
        [
            (m, n)
            for m in ("numpy.core.multiarray", "numpy._core.multiarray")
            for n in ("_reconstruct", "scalar")
        ]
        + [("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")]
    )

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name} from a data file")
        return super().find_class(module, name)


def _read_cifar_batch(path: Path, label_key: str, num_classes: int) -> tuple[np.ndarray, Any]:
    """One python-version CIFAR batch: images (N x 3 x 32 x 32 uint8) and labels.

    A row of ``data`` is 3072 bytes: the red plane, then green, then blue, each 32 x 32 row-major,
    so a reshape (no transpose) gives channels first.
    """
    with open(path, "rb") as handle:
        # Python 2 pickles: encoding="bytes" keeps their str keys as bytes (b"data").
        batch = _ArrayUnpickler(handle, encoding="bytes").load()
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: expected a pickled dict, got {type(batch).__name__}")
    entries = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in entries or label_key not in entries:
        raise ValueError(f"{path}: expected keys b'data' and b'{label_key}', got {sorted(entries)}")
    data = np.asarray(entries["data"])
    labels = np.asarray(entries[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise ValueError(f"{path}: data must be uint8 N x 3072, got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],) or labels.min(initial=0) < 0:
        raise ValueError(f"{path}: need one label in [0, {num_classes}) per image")
    if labels.max(initial=0) >= num_classes:
        raise ValueError(f"{path}: label {labels.max()} is out of range [0, {num_classes})")
    return data.reshape(-1, 3, 32, 32), labels


def _read_cifar(files: _Files, root: Path, names: Iterable[str]) -> ArrayDataset:
    info = DATASET_INFO[files.name]
    label_key = "fine_labels" if info.num_classes == 100 else "labels"
    parts = [_read_cifar_batch(p, label_key, info.num_classes) for p in files.paths(root, names)]
    images = np.concatenate([x for x, _ in parts])
    return _array_dataset(images, np.concatenate([y for _, y in parts]))


def _load_cifar(files: _Files, root: Path) -> DatasetSplits:
    from torchvision.datasets import CIFAR10, CIFAR100

    cls = CIFAR100 if files.name == "cifar100" else CIFAR10

    def open_split(train: bool, download: bool) -> Any:
        return cls(str(root), train=train, download=download)

    how = _ensure_files(files, root, open_split)
    return DatasetSplits(
        info=DATASET_INFO[files.name],
        train=_read_cifar(files, root, files.train),
        test=_read_cifar(files, root, files.test),
        checksum=_sha256(files.paths(root, files.train + files.test)),
        source=f"CIFAR python batches ({files.folder}) from {how}",
    )


@DATASETS.register("cifar10")
def load_cifar10(root: Path) -> DatasetSplits:
    """CIFAR-10 (50,000 / 10,000) from ``<root>/cifar-10-batches-py/``."""
    return _load_cifar(_CIFAR10_FILES, root)


@DATASETS.register("cifar100")
def load_cifar100(root: Path) -> DatasetSplits:
    """CIFAR-100 with its 100 fine labels (50,000 / 10,000) from ``<root>/cifar-100-python/``."""
    return _load_cifar(_CIFAR100_FILES, root)


def _read_svhn(path: Path) -> ArrayDataset:
    """One SVHN .mat file: ``X`` is H x W x C x N uint8, ``y`` N x 1 with 10 standing for 0."""
    from scipy.io import loadmat

    mat = loadmat(str(path))
    if "X" not in mat or "y" not in mat:
        raise ValueError(f"{path}: expected variables X and y, got {sorted(mat)}")
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"]).astype(np.int64).reshape(-1)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[2] != 3:
        raise ValueError(f"{path}: X must be uint8 H x W x 3 x N, got {x.dtype} {x.shape}")
    if y.shape != (x.shape[3],):
        raise ValueError(f"{path}: y must hold one label per image ({x.shape[3]}), got {y.shape}")
    y[y == 10] = 0  # the digit 0 is stored as label 10
    if y.size and (y.min() < 0 or y.max() > 9):
        raise ValueError(f"{path}: labels must be 1..10 (10 for the digit 0)")
    return _array_dataset(x.transpose(3, 2, 0, 1), y)


@DATASETS.register("svhn")
def load_svhn(root: Path) -> DatasetSplits:
    """SVHN train and test from ``<root>/{train,test}_32x32.mat`` (label 10 mapped to 0; the
    'extra' split is not used)."""
    from torchvision.datasets import SVHN

    def open_split(train: bool, download: bool) -> Any:
        return SVHN(str(root), split="train" if train else "test", download=download)

    files = _SVHN_FILES
    how = _ensure_files(files, root, open_split)
    train_path, test_path = files.paths(root, files.train + files.test)
    return DatasetSplits(
        info=DATASET_INFO["svhn"],
        train=_read_svhn(train_path),
        test=_read_svhn(test_path),
        checksum=_sha256([train_path, test_path]),
        source=f"SVHN .mat files from {how}",
    )


CINIC10_URL = "https://datashare.ed.ac.uk/handle/10283/3192"


def _read_image_folder(folder: Path, digest: Any) -> ArrayDataset:
    """Every image of an ImageFolder as uint8 RGB, hashing the file bytes as they are read."""
    from PIL import Image
    from torchvision.datasets import ImageFolder

    samples = ImageFolder(str(folder)).samples  # sorted by class, then path
    images = np.empty((len(samples), 32, 32, 3), dtype=np.uint8)
    for i, (path, _) in enumerate(samples):
        data = Path(path).read_bytes()
        digest.update(data)
        with Image.open(io.BytesIO(data)) as img:
            images[i] = np.asarray(img.convert("RGB"))
    return _array_dataset(images, [label for _, label in samples], channels_last=True)


@DATASETS.register("cinic10")
def load_cinic10(root: Path) -> DatasetSplits:
    """CINIC-10 train and test (90,000 each) from ``<root>/CINIC-10/{train,test}``.

    torchvision has no CINIC-10 class and no download: the archive must be unpacked by hand.
    The valid split is not used.
    """
    base = root / "CINIC-10"
    if not all((base / split).is_dir() for split in ("train", "test")):
        raise DataNotFoundError(
            f"dataset 'cinic10' not found: expected {base}/train and {base}/test "
            f"(ImageFolder layout). Download CINIC-10.tar.gz from {CINIC10_URL} and unpack it "
            f"into {base}, or point FEDSWEEP_DATA_ROOT (or root=) at a folder holding CINIC-10/."
        )
    digest = hashlib.sha256()
    train = _read_image_folder(base / "train", digest)
    test = _read_image_folder(base / "test", digest)
    return DatasetSplits(
        info=DATASET_INFO["cinic10"],
        train=train,
        test=test,
        checksum=digest.hexdigest(),
        source=f"torchvision ImageFolder from {base}",
    )
