"""The dataset files on disk: Fashion-MNIST extracted from the Debian package ``dataset-fashion-mnist`` into
``<data_dir>/FashionMNIST/raw``, and torchvision's readers (and downloaders) of every dataset's raw uint8
splits, with the errors they raise on missing or corrupt files.
"""

from __future__ import annotations

import gzip
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fl_app.data.datasets.catalog import _IDX_FILES

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
