"""Loading a dataset: one split (:func:`load_split`), its labels alone (:func:`load_labels`), both splits
(:func:`load_dataset`) or a check without keeping anything (:func:`check_dataset`), each cached per process and
from local files first, downloaded through torchvision only when the caller allows it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np

from fl_app.data.datasets.catalog import (
    DATASETS,
    FASHION_MNIST_SYSTEM_DIR,
    DatasetUnavailableError,
    _how_to,
    resolve_data_dir,
)
from fl_app.data.datasets.decoded import _read_raw
from fl_app.data.datasets.sources import _LOAD_ERRORS, _RAW_LOADERS
from fl_app.data.datasets.tensors import TensorData, _checked_images, _checked_labels, _to_tensor_data


def _split_name(train: bool) -> str:
    return "train" if train else "test"


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
