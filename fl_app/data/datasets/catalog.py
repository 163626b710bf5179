"""The datasets there are (docs/running.md, "Data and models"): their static facts (:data:`DATASETS`), where their files
live (:data:`DEFAULT_DATA_DIR`, the Debian package's :data:`FASHION_MNIST_SYSTEM_DIR`), and the error that says
how to obtain missing files (:class:`DatasetUnavailableError`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

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
