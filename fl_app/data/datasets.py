"""Image datasets as normalised in-memory tensors (SPEC §8 "Data and models").

Fashion-MNIST is the offline default: the Debian package ``dataset-fashion-mnist`` installs the IDX
``.gz`` files in ``/usr/share/datasets/fashion-mnist``; they are extracted once into
``<data_dir>/FashionMNIST/raw`` and read through torchvision's ``FashionMNIST`` class. EMNIST (split
``byclass``, 62 classes — the released DP-FedSAM code loads ``letters`` into a 62-way model, which SPEC §8
calls a bug), CIFAR-10 and CIFAR-100 are read through torchvision from ``data_dir``; they are downloaded only
when the caller passes ``download=True``.

Each split is converted once to a float32 ``N×C×H×W`` tensor normalised with the dataset's mean/std, so local
training indexes tensors instead of paying a PIL round trip and a transform per sample. The result is cached
per process, so a Flower simulation worker loads a dataset once, not once per round. Augmentation is
deliberately absent: SPEC §8 does not ask for it, and per-sample random transforms would break the
"convert once" design.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import pickle
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

__all__ = [
    "DATASETS",
    "DEFAULT_DATA_DIR",
    "FASHION_MNIST_SYSTEM_DIR",
    "DatasetInfo",
    "DatasetUnavailableError",
    "TensorData",
    "check_dataset",
    "clear_dataset_cache",
    "labels_of",
    "load_dataset",
    "load_labels",
    "load_split",
    "resolve_data_dir",
]

DEFAULT_DATA_DIR = "~/.cache/dpfedsam/data"
FASHION_MNIST_SYSTEM_DIR = "/usr/share/datasets/fashion-mnist"

_IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a dataset; ``mean``/``std``: per-channel training-set statistics in [0, 1] units."""

    num_classes: int
    in_channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


DATASETS: dict[str, DatasetInfo] = {
    # Computed on the 60k training images of the Debian package.
    "fashion_mnist": DatasetInfo(10, 1, 28, (0.2860,), (0.3530,)),
    # byclass: 10 digits + 26 upper + 26 lower case letters. Commonly quoted training-set statistics.
    "emnist": DatasetInfo(62, 1, 28, (0.1736,), (0.3317,)),
    # True per-pixel std (not the often copied 0.2023/0.1994/0.2010, which is a std of per-image means).
    "cifar10": DatasetInfo(10, 3, 32, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": DatasetInfo(100, 3, 32, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


class DatasetUnavailableError(RuntimeError):
    """The dataset files are missing or unreadable; the message says how to obtain them."""


@dataclass(frozen=True, eq=False)
class TensorData:
    """One split held in memory: ``x`` float32 ``N×C×H×W`` (normalised), ``y`` int64 ``N``.

    The tensors are shared by every caller of the cached :func:`load_dataset`: never modify them in place.
    ``eq=False`` keeps identity semantics (element-wise tensor ``==`` has no single truth value).
    """

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.dtype != torch.float32 or self.x.ndim != 4:
            raise ValueError(f"x must be float32 N×C×H×W, got {self.x.dtype} of shape {tuple(self.x.shape)}")
        if self.y.dtype != torch.int64 or self.y.shape != (self.x.shape[0],):
            raise ValueError(f"y must be int64 of shape ({len(self.x)},), got {self.y.dtype} {tuple(self.y.shape)}")

    def __len__(self) -> int:
        return int(self.y.shape[0])


def labels_of(data: TensorData) -> np.ndarray:
    """Labels as an int64 numpy array (what the partitioners consume)."""
    return data.y.numpy().astype(np.int64, copy=True)


def resolve_data_dir(data_dir: str | None) -> str:
    """Absolute data directory; ``None`` means :data:`DEFAULT_DATA_DIR`.

    Normalising here makes ``None`` and the explicit default hit the same cache entry.
    """
    return os.path.abspath(os.path.expanduser(DEFAULT_DATA_DIR if data_dir is None else data_dir))


# ----------------------------------------------------------------------------------------------------
# Messages


def _how_to(name: str, root: str, system_dir: str) -> str:
    if name == "fashion_mnist":
        raw = os.path.join(root, "FashionMNIST", "raw")
        return (
            "Fashion-MNIST is read from the Debian package: run `apt-get install dataset-fashion-mnist` "
            f"(it installs the IDX .gz files in {system_dir}), or put the four IDX files "
            f"({', '.join(_IDX_FILES)}, optionally .gz) in {raw}, "
            "or set dataset.download=true on a machine with internet access."
        )
    where = {
        "emnist": os.path.join(root, "EMNIST", "raw", "emnist-byclass-{train,test}-{images,labels}-idx*-ubyte"),
        "cifar10": os.path.join(root, "cifar-10-batches-py", "{data_batch_1..5,test_batch,batches.meta}"),
        "cifar100": os.path.join(root, "cifar-100-python", "{train,test,meta}"),
    }[name]
    return (
        f"torchvision expects the {name} files at {where} (the layout its downloader produces). "
        f"Put them there, or set dataset.download=true (download=True) on a machine with internet access "
        f"to let torchvision fetch them into {root}."
    )


# ----------------------------------------------------------------------------------------------------
# Fashion-MNIST: system package -> data_dir extraction


def _extract_atomically(src: str, gzipped: bool, dst: str) -> None:
    """Copy (gunzipping if needed) ``src`` to ``dst`` through a temp file in the same directory.

    Simulation workers may extract concurrently; a reader must never see a half-written file, and
    ``os.replace`` is atomic within one filesystem (the last writer wins, with identical content).
    """
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dst), prefix=os.path.basename(dst) + ".", suffix=".tmp")
    try:
        opener = gzip.open if gzipped else open
        with os.fdopen(fd, "wb") as out, opener(src, "rb") as inp:
            shutil.copyfileobj(inp, out, length=1 << 20)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the data dir may be shared with other users
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _prepare_fashion_mnist(root: str, system_dir: str) -> bool:
    """Make ``<root>/FashionMNIST/raw`` hold the four un-gzipped IDX files; return whether it does."""
    raw = os.path.join(root, "FashionMNIST", "raw")
    for name in _IDX_FILES:
        dst = os.path.join(raw, name)
        if os.path.isfile(dst):
            continue
        # Prefer a user-supplied .gz next to the target, then the system package (gzipped or not).
        candidates = [
            (os.path.join(raw, name + ".gz"), True),
            (os.path.join(system_dir, name + ".gz"), True),
            (os.path.join(system_dir, name), False),
        ]
        source = next(((src, gz) for src, gz in candidates if os.path.isfile(src)), None)
        if source is None:
            return False
        os.makedirs(raw, exist_ok=True)
        _extract_atomically(source[0], source[1], dst)
    return True


# ----------------------------------------------------------------------------------------------------
# Raw loaders: each returns (uint8 images N×H×W or N×H×W×C, int labels) for one split.

_RawSplit = tuple[torch.Tensor | np.ndarray, torch.Tensor | np.ndarray | list[int]]


def _tvd() -> Any:
    """torchvision.datasets, imported on first use: importing torchvision costs ~2 s (it pulls in
    torch._dynamo) in every process, and a process that finds the decoded cache never needs it. Resolved at call
    time, so tests can monkeypatch torchvision.datasets."""
    import torchvision.datasets

    return torchvision.datasets


def _raw_fashion_mnist(root: str, train: bool, download: bool) -> _RawSplit:
    ds = _tvd().FashionMNIST(root, train=train, download=download)
    return ds.data, ds.targets


def _raw_emnist(root: str, train: bool, download: bool) -> _RawSplit:
    ds = _tvd().EMNIST(root, split="byclass", train=train, download=download)
    # The EMNIST IDX files store images transposed relative to MNIST; fix it so glyphs are upright.
    return ds.data.transpose(1, 2), ds.targets


def _raw_cifar10(root: str, train: bool, download: bool) -> _RawSplit:
    ds = _tvd().CIFAR10(root, train=train, download=download)
    return ds.data, ds.targets


def _raw_cifar100(root: str, train: bool, download: bool) -> _RawSplit:
    ds = _tvd().CIFAR100(root, train=train, download=download)
    return ds.data, ds.targets


_RAW_LOADERS: dict[str, Callable[[str, bool, bool], _RawSplit]] = {
    "fashion_mnist": _raw_fashion_mnist,
    "emnist": _raw_emnist,
    "cifar10": _raw_cifar10,
    "cifar100": _raw_cifar100,
}

# What torchvision and the IDX/pickle readers raise on missing or corrupt files (the IDX reader asserts on bad
# magic numbers; truncated arrays fail in view/reshape).
_LOAD_ERRORS = (
    RuntimeError,
    AssertionError,
    ValueError,
    TypeError,
    OSError,
    EOFError,
    KeyError,
    pickle.UnpicklingError,
)


def _checked_labels(labels: object, info: DatasetInfo) -> np.ndarray:
    y = np.asarray(labels, dtype=np.int64)
    if y.size and (int(y.min()) < 0 or int(y.max()) >= info.num_classes):
        raise ValueError(f"labels outside [0, {info.num_classes}): min {int(y.min())}, max {int(y.max())}")
    return y


def _checked_images(images: torch.Tensor | np.ndarray, info: DatasetInfo) -> torch.Tensor:
    """The uint8 images as N×C×H×W (a view where possible), or ValueError."""
    x = torch.as_tensor(np.asarray(images))
    if x.dtype != torch.uint8:
        raise ValueError(f"expected uint8 images, got {x.dtype}")
    if x.ndim == 3:  # grey N×H×W
        x = x.unsqueeze(1)
    elif x.ndim == 4 and x.shape[-1] == info.in_channels:  # torchvision CIFAR keeps N×H×W×C
        x = x.permute(0, 3, 1, 2)
    expected = (info.in_channels, info.image_size, info.image_size)
    if tuple(x.shape[1:]) != expected:
        raise ValueError(f"expected images of shape N×{expected}, got {tuple(x.shape)}")
    return x


def _to_tensor_data(images: torch.Tensor | np.ndarray, labels: object, info: DatasetInfo) -> TensorData:
    x = _checked_images(images, info)
    y = torch.as_tensor(_checked_labels(labels, info))
    mean = torch.tensor(info.mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(info.std, dtype=torch.float32).view(1, -1, 1, 1)
    xf = x.to(torch.float32).div_(255.0).sub_(mean).div_(std).contiguous()
    return TensorData(x=xf, y=y)


# ----------------------------------------------------------------------------------------------------
# Decoded cache: every simulation process (driver and each Ray worker) loads the dataset; after the first
# decode through torchvision, the uint8 arrays are kept in <data_dir>/.decoded/<name>.npz and reused while the
# source files are unchanged (same names, sizes and mtimes).

#: Where torchvision's readers find each dataset's files under the data dir.
_SOURCE_DIRS = {
    "fashion_mnist": os.path.join("FashionMNIST", "raw"),
    "emnist": os.path.join("EMNIST", "raw"),
    "cifar10": "cifar-10-batches-py",
    "cifar100": "cifar-100-python",
}


def _source_signature(root: str, name: str) -> list[list[Any]]:
    """(relative path, size, mtime) of every source file; empty when there are none."""
    base = os.path.join(root, _SOURCE_DIRS[name])
    entries = []
    for dirpath, _, files in os.walk(base):
        for file in files:
            path = os.path.join(dirpath, file)
            with contextlib.suppress(OSError):
                st = os.stat(path)
                entries.append([os.path.relpath(path, base), st.st_size, st.st_mtime_ns])
    return sorted(entries)


def _decoded_path(root: str, name: str) -> str:
    return os.path.join(root, ".decoded", f"{name}.npz")


def _as_arrays(images: object, labels: object) -> tuple[np.ndarray, np.ndarray]:
    return np.ascontiguousarray(np.asarray(images)), np.asarray(labels, dtype=np.int64)


def _split_name(train: bool) -> str:
    return "train" if train else "test"


def _read_decoded(
    root: str, name: str, signature: list[list[Any]], members: tuple[str, ...]
) -> list[np.ndarray] | None:
    """The cached arrays ``members`` (e.g. ``train_x``, ``train_y``; each read alone from the ``.npz``), or None when
    the cache is absent, stale (another source signature) or damaged."""
    if not signature:
        return None
    try:
        with np.load(_decoded_path(root, name), allow_pickle=False) as cached:
            if json.loads(str(cached["signature"])) != signature:
                return None
            return [cached[member] for member in members]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None  # absent, stale or damaged: decode the sources again


def _write_decoded(
    root: str, name: str, signature: list[list[Any]], splits: tuple[tuple[np.ndarray, np.ndarray], ...]
) -> None:
    from fl_app.atomic import atomic_write

    (train_x, train_y), (test_x, test_y) = splits
    path = _decoded_path(root, name)
    # A read-only data dir just goes without the cache; concurrent writers each replace the file atomically.
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_write(Path(path), "wb") as fh:
            np.savez(
                fh, signature=json.dumps(signature), train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y
            )
        os.chmod(path, 0o644)  # the data dir may be shared with other users, as the extracted files are


def _read_raw(name: str, root: str, system_dir: str, members: tuple[str, ...]) -> list[np.ndarray]:
    """The decoded arrays ``members`` from local files only (never downloads): from the decoded cache while it is
    current, else decoded from the sources through torchvision (both splits, written to the cache)."""
    if name == "fashion_mnist" and not _prepare_fashion_mnist(root, system_dir):
        raise DatasetUnavailableError(
            f"Fashion-MNIST not found in {system_dir} "
            f"nor in {os.path.join(root, 'FashionMNIST', 'raw')}. " + _how_to(name, root, system_dir)
        )
    signature = _source_signature(root, name)
    cached = _read_decoded(root, name, signature, members)
    if cached is not None:
        return cached
    loader = _RAW_LOADERS[name]
    (train_x, train_y), (test_x, test_y) = raw = tuple(_as_arrays(*loader(root, t, False)) for t in (True, False))
    _write_decoded(root, name, signature, raw)
    decoded = {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}
    return [decoded[member] for member in members]


@contextlib.contextmanager
def _reading(name: str, root: str, system_dir: str) -> Iterator[None]:
    """Whatever the readers raise on missing or corrupt files (:data:`_LOAD_ERRORS`) as a
    :class:`DatasetUnavailableError` that says how to get the files."""
    try:
        yield
    except DatasetUnavailableError:  # a RuntimeError, already saying how
        raise
    except _LOAD_ERRORS as exc:
        raise DatasetUnavailableError(
            f"Could not load {name} from {root}: {type(exc).__name__}: {exc}. " + _how_to(name, root, system_dir)
        ) from exc


@functools.cache  # = lru_cache(maxsize=None); exceptions are never cached
def _load_split_cached(name: str, root: str, system_dir: str, train: bool) -> TensorData:
    split = _split_name(train)
    with _reading(name, root, system_dir):
        images, labels = _read_raw(name, root, system_dir, (f"{split}_x", f"{split}_y"))
        return _to_tensor_data(images, labels, DATASETS[name])


@functools.cache
def _load_labels_cached(name: str, root: str, system_dir: str, train: bool) -> np.ndarray:
    with _reading(name, root, system_dir):
        (labels,) = _read_raw(name, root, system_dir, (f"{_split_name(train)}_y",))
        labels = _checked_labels(labels, DATASETS[name])
    labels.setflags(write=False)  # shared by every caller in the process
    return labels


def _check_split(name: str, root: str, system_dir: str, train: bool) -> None:
    split = _split_name(train)
    with _reading(name, root, system_dir):
        images, labels = _read_raw(name, root, system_dir, (f"{split}_x", f"{split}_y"))
        x = _checked_images(images, DATASETS[name])
        y = _checked_labels(labels, DATASETS[name])
        if len(x) != len(y):
            raise ValueError(f"{len(x)} {split} images but {len(y)} labels")


_LOAD_LOCK = threading.Lock()
_T = TypeVar("_T")


def _locally_or_downloaded(
    name: str, data_dir: str | None, download: bool, system_dir: str, load: Callable[[str, str, str], _T]
) -> _T:
    """``load(name, root, system_dir)`` from local files; when that fails and ``download``, after torchvision
    downloaded both splits (once), again."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(DATASETS)}")
    root = resolve_data_dir(data_dir)
    system_dir = os.path.abspath(system_dir)
    # The lock stops two threads of one process from both materialising the same (large) tensors.
    with _LOAD_LOCK:
        try:
            return load(name, root, system_dir)
        except DatasetUnavailableError:
            if not download:
                raise
        try:
            os.makedirs(root, exist_ok=True)
            for train in (True, False):
                _RAW_LOADERS[name](root, train, True)
        except _LOAD_ERRORS as exc:
            raise DatasetUnavailableError(
                f"Downloading {name} into {root} failed: {type(exc).__name__}: {exc}. "
                + _how_to(name, root, system_dir)
            ) from exc
        return load(name, root, system_dir)


def load_split(
    name: str,
    data_dir: str | None = None,
    train: bool = True,
    download: bool = False,
    system_dir: str = FASHION_MNIST_SYSTEM_DIR,
) -> TensorData:
    """One split of dataset ``name`` (``train``, else test) as normalised tensors, cached per process: a process
    holds only the splits it uses (a training worker the train split, the ServerApp the test split).

    Args:
        name: one of :data:`DATASETS`.
        data_dir: torchvision root; ``None`` means ``~/.cache/dpfedsam/data``.
        train: the training split, else the test split.
        download: let torchvision download the files if they are not present locally. Only consulted when
            the local load fails, so the cache entry is shared by ``download=True`` and ``False`` calls.
        system_dir: where the Debian package put the Fashion-MNIST IDX ``.gz`` files.

    Raises:
        ValueError: unknown dataset name.
        DatasetUnavailableError: files missing or corrupt (and not downloadable); the message says how
            to get them.
    """
    return _locally_or_downloaded(
        name, data_dir, download, system_dir, lambda n, r, s: _load_split_cached(n, r, s, train)
    )


def load_labels(
    name: str,
    data_dir: str | None = None,
    train: bool = True,
    download: bool = False,
    system_dir: str = FASHION_MNIST_SYSTEM_DIR,
) -> np.ndarray:
    """The labels of one split as a read-only int64 array, cached per process, without the images (what the
    partitioners consume: fl_app/data/partition.py). Arguments and errors as :func:`load_split`."""
    return _locally_or_downloaded(
        name, data_dir, download, system_dir, lambda n, r, s: _load_labels_cached(n, r, s, train)
    )


def check_dataset(
    name: str, data_dir: str | None = None, download: bool = False, system_dir: str = FASHION_MNIST_SYSTEM_DIR
) -> None:
    """Raise as :func:`load_split` would for either split (missing or corrupt files, images of the wrong shape or
    dtype, labels out of range) without keeping anything: the preflight's check, in a process that does not
    train."""

    def check(n: str, r: str, s: str) -> None:
        for train in (True, False):
            _check_split(n, r, s, train)

    _locally_or_downloaded(name, data_dir, download, system_dir, check)


def load_dataset(
    name: str,
    data_dir: str | None = None,
    download: bool = False,
    system_dir: str = FASHION_MNIST_SYSTEM_DIR,
) -> tuple[TensorData, TensorData]:
    """Return ``(train, test)`` of dataset ``name``: :func:`load_split` of each (arguments and errors as there)."""
    train = load_split(name, data_dir, True, download, system_dir)
    return train, load_split(name, data_dir, False, download, system_dir)


def clear_dataset_cache() -> None:
    """Drop the per-process dataset caches (tests; freeing memory)."""
    _load_split_cached.cache_clear()
    _load_labels_cached.cache_clear()
