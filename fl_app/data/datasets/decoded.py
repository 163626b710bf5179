"""The decoded cache: every simulation process (driver and each Ray worker) loads the dataset; after the first
decode through torchvision, the uint8 arrays are kept in ``<data_dir>/.decoded/<name>.npz`` and reused while the
source files are unchanged (same names, sizes and mtimes).
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from fl_app.data.datasets.catalog import DatasetUnavailableError, _how_to
from fl_app.data.datasets.sources import _RAW_LOADERS, _prepare_fashion_mnist

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
    from fl_app.core.atomic import atomic_write

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
