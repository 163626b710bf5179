"""Tests for fl_app.data.datasets (docs/running.md, "Data and models"): real Fashion-MNIST, and the other datasets on
generated files."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.datasets as tvd
import torchvision.datasets.cifar as tv_cifar

from fl_app.data.datasets import (
    DATASETS,
    FASHION_MNIST_SYSTEM_DIR,
    DatasetUnavailableError,
    TensorData,
    check_dataset,
    clear_dataset_cache,
    labels_of,
    load_dataset,
    load_labels,
    load_split,
)


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    # Each test uses its own tmp data dir (its own cache key); clearing afterwards frees the tensors.
    yield
    clear_dataset_cache()


def _idx_bytes(array: np.ndarray) -> bytes:
    """Serialise a uint8 array in the IDX format torchvision's MNIST readers parse."""
    assert array.dtype == np.uint8
    header = struct.pack(">I", 0x0800 | array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + array.tobytes()


def _expected_normalised(raw: np.ndarray, name: str) -> torch.Tensor:
    """raw: uint8 N×C×H×W."""
    info = DATASETS[name]
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    return (torch.from_numpy(raw).float() / 255.0 - mean) / std


def _write_fake_fashion(system_dir: Path, n_train: int, n_test: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    system_dir.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        arrays[f"{split}-images"] = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        arrays[f"{split}-labels"] = rng.integers(0, 10, size=n, dtype=np.uint8)
        for kind, idx in (("images", 3), ("labels", 1)):
            path = system_dir / f"{split}-{kind}-idx{idx}-ubyte.gz"
            path.write_bytes(gzip.compress(_idx_bytes(arrays[f"{split}-{kind}"])))
    return arrays


def test_decoded_cache_serves_new_processes_without_torchvision_until_a_source_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arrays = _write_fake_fashion(tmp_path / "system", n_train=12, n_test=5, seed=0)
    data, system = str(tmp_path / "data"), str(tmp_path / "system")
    first, _ = load_dataset("fashion_mnist", data, system_dir=system)
    assert (tmp_path / "data" / ".decoded" / "fashion_mnist.npz").is_file()

    # A new process (here: a cleared cache) reads the decoded arrays; torchvision's reader is never called.
    clear_dataset_cache()

    def must_not_decode(*args: object, **kwargs: object) -> None:
        raise AssertionError("decoded again although the sources did not change")

    monkeypatch.setattr(tvd, "FashionMNIST", must_not_decode)
    again, _ = load_dataset("fashion_mnist", data, system_dir=system)
    torch.testing.assert_close(again.x, first.x, rtol=0, atol=0)
    assert torch.equal(again.y, first.y)

    # A changed source file makes the cache stale: decoded again, with the new content.
    monkeypatch.undo()
    clear_dataset_cache()
    raw = tmp_path / "data" / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte"
    new_labels = (arrays["t10k-labels"] + 1) % 10
    raw.write_bytes(_idx_bytes(new_labels))
    os.utime(raw, ns=(raw.stat().st_atime_ns, raw.stat().st_mtime_ns + 10**9))
    _, test = load_dataset("fashion_mnist", data, system_dir=system)
    assert np.array_equal(labels_of(test), new_labels.astype(np.int64))


# ----------------------------------------------------------------------------------------------------
# Registry


def test_dataset_registry() -> None:
    assert set(DATASETS) == {"fashion_mnist", "emnist", "cifar10", "cifar100"}
    assert DATASETS["emnist"].num_classes == 62  # byclass, not letters (docs/running.md)
    assert (DATASETS["fashion_mnist"].in_channels, DATASETS["fashion_mnist"].image_size) == (1, 28)
    assert (DATASETS["cifar10"].num_classes, DATASETS["cifar100"].num_classes) == (10, 100)
    for info in DATASETS.values():
        assert len(info.mean) == len(info.std) == info.in_channels


def test_unknown_dataset(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("mnist", str(tmp_path))


def test_tensor_data_validates() -> None:
    with pytest.raises(ValueError):
        TensorData(x=torch.zeros(2, 1, 4, 4), y=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError):
        TensorData(x=torch.zeros(2, 1, 4, 4, dtype=torch.float64), y=torch.zeros(2, dtype=torch.int64))


# ----------------------------------------------------------------------------------------------------
# Fashion-MNIST


@pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_SYSTEM_DIR),
    reason=f"{FASHION_MNIST_SYSTEM_DIR} absent (apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist(tmp_path: Path) -> None:
    train, test = load_dataset("fashion_mnist", str(tmp_path))
    assert train.x.shape == (60000, 1, 28, 28) and test.x.shape == (10000, 1, 28, 28)
    assert train.x.dtype == torch.float32 and train.y.dtype == torch.int64
    assert abs(float(train.x.mean())) < 0.01 and abs(float(train.x.std()) - 1.0) < 0.01
    labels = labels_of(train)
    assert labels.dtype == np.int64 and labels.shape == (60000,)
    assert np.array_equal(np.bincount(labels), np.full(10, 6000))
    assert sorted(np.unique(labels_of(test)).tolist()) == list(range(10))
    # Extracted once, atomically: un-gzipped files in the torchvision layout, no temp leftovers.
    raw = sorted(os.listdir(tmp_path / "FashionMNIST" / "raw"))
    assert raw == sorted(
        [
            "train-images-idx3-ubyte",
            "train-labels-idx1-ubyte",
            "t10k-images-idx3-ubyte",
            "t10k-labels-idx1-ubyte",
        ]
    )
    # Cached per process: the same objects, not a reload.
    again = load_dataset("fashion_mnist", str(tmp_path))
    assert again[0] is train and again[1] is test


def test_fashion_mnist_extraction_and_normalisation(tmp_path: Path) -> None:
    arrays = _write_fake_fashion(tmp_path / "system", n_train=12, n_test=5, seed=0)
    train, test = load_dataset("fashion_mnist", str(tmp_path / "data"), system_dir=str(tmp_path / "system"))
    assert train.x.shape == (12, 1, 28, 28) and test.x.shape == (5, 1, 28, 28)
    expected = _expected_normalised(arrays["train-images"][:, None], "fashion_mnist")
    torch.testing.assert_close(train.x, expected)
    assert np.array_equal(labels_of(test), arrays["t10k-labels"].astype(np.int64))
    # A second process-level load reads the extracted copy, even with the system dir gone.
    clear_dataset_cache()
    for f in (tmp_path / "system").iterdir():
        f.unlink()
    train2, _ = load_dataset("fashion_mnist", str(tmp_path / "data"), system_dir=str(tmp_path / "system"))
    torch.testing.assert_close(train2.x, train.x)


def test_fashion_mnist_missing_mentions_apt_get(tmp_path: Path) -> None:
    with pytest.raises(DatasetUnavailableError) as info:
        load_dataset("fashion_mnist", str(tmp_path / "data"), system_dir=str(tmp_path / "nowhere"))
    message = str(info.value)
    assert "apt-get install dataset-fashion-mnist" in message
    assert str(tmp_path / "data" / "FashionMNIST" / "raw") in message


def test_fashion_mnist_corrupt_files(tmp_path: Path) -> None:
    system = tmp_path / "system"
    _write_fake_fashion(system, n_train=4, n_test=2, seed=1)
    (system / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x03garbage"))
    with pytest.raises(DatasetUnavailableError, match="apt-get"):
        load_dataset("fashion_mnist", str(tmp_path / "data"), system_dir=str(system))
    # Not a gzip file at all: fails during extraction, also wrapped, and no temp file is left behind.
    data2 = tmp_path / "data2"
    (system / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(DatasetUnavailableError):
        load_dataset("fashion_mnist", str(data2), system_dir=str(system))
    assert not [f for f in os.listdir(data2 / "FashionMNIST" / "raw") if f.endswith(".tmp")]


def test_one_split_or_its_labels_alone_are_the_whole_datasets(tmp_path: Path) -> None:
    arrays = _write_fake_fashion(tmp_path / "system", n_train=12, n_test=5, seed=3)
    data, system = str(tmp_path / "data"), str(tmp_path / "system")
    test = load_split("fashion_mnist", data, train=False, system_dir=system)  # decodes, writes the cache
    labels = load_labels("fashion_mnist", data, system_dir=system)  # read back from the cache
    assert np.array_equal(labels, arrays["train-labels"].astype(np.int64)) and not labels.flags.writeable
    assert load_labels("fashion_mnist", data, system_dir=system) is labels  # cached per process
    train = load_split("fashion_mnist", data, train=True, system_dir=system)
    both = load_dataset("fashion_mnist", data, system_dir=system)
    assert both[0] is train and both[1] is test  # one cache per split, shared with load_dataset
    assert np.array_equal(labels_of(train), labels)
    torch.testing.assert_close(test.x, _expected_normalised(arrays["t10k-images"][:, None], "fashion_mnist"))


def test_check_dataset_raises_what_loading_would_and_keeps_nothing(tmp_path: Path) -> None:
    system = tmp_path / "system"
    arrays = _write_fake_fashion(system, n_train=4, n_test=2, seed=1)
    check_dataset("fashion_mnist", str(tmp_path / "data"), system_dir=str(system))
    with pytest.raises(DatasetUnavailableError, match="apt-get"):
        check_dataset("fashion_mnist", str(tmp_path / "empty"), system_dir=str(tmp_path / "nowhere"))
    # A label out of range in the training split is found without any training process.
    bad = arrays["train-labels"].copy()
    bad[0] = 10
    (system / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx_bytes(bad)))
    with pytest.raises(DatasetUnavailableError, match="labels outside"):
        check_dataset("fashion_mnist", str(tmp_path / "data_bad"), system_dir=str(system))


# ----------------------------------------------------------------------------------------------------
# EMNIST (byclass) on generated IDX files in torchvision's layout


def test_emnist_byclass_generated(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    raw_dir = tmp_path / "EMNIST" / "raw"
    raw_dir.mkdir(parents=True)
    arrays = {}
    for split, n in (("train", 9), ("test", 4)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 62, size=n, dtype=np.uint8)
        labels[0] = 61  # the largest byclass label must be accepted
        (raw_dir / f"emnist-byclass-{split}-images-idx3-ubyte").write_bytes(_idx_bytes(images))
        (raw_dir / f"emnist-byclass-{split}-labels-idx1-ubyte").write_bytes(_idx_bytes(labels))
        arrays[split] = (images, labels)
    train, test = load_dataset("emnist", str(tmp_path))
    assert train.x.shape == (9, 1, 28, 28) and test.x.shape == (4, 1, 28, 28)
    assert train.x.dtype == torch.float32 and train.y.dtype == torch.int64
    # EMNIST files store glyphs transposed; the loader turns them upright.
    upright = np.ascontiguousarray(arrays["train"][0].transpose(0, 2, 1))[:, None]
    torch.testing.assert_close(train.x, _expected_normalised(upright, "emnist"))
    assert np.array_equal(labels_of(train), arrays["train"][1].astype(np.int64))
    assert int(train.y.max()) < DATASETS["emnist"].num_classes


def test_emnist_missing_says_where(tmp_path: Path) -> None:
    with pytest.raises(DatasetUnavailableError) as info:
        load_dataset("emnist", str(tmp_path))
    message = str(info.value)
    assert "emnist-byclass" in message and "dataset.download=true" in message


# ----------------------------------------------------------------------------------------------------
# CIFAR on generated pickle batches in torchvision's layout


@pytest.fixture
def _no_md5(monkeypatch: pytest.MonkeyPatch) -> None:
    # Generated batches cannot match the real files' md5 sums; keep torchvision's existence check only.
    monkeypatch.setattr(tv_cifar, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath))


def _pickle(path: Path, obj: dict[str, object]) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f)


@pytest.mark.usefixtures("_no_md5")
def test_cifar10_generated(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(3, 3 * 32 * 32), dtype=np.uint8)  # rows: R plane, G plane, B plane
        labels = rng.integers(0, 10, size=3).tolist()
        _pickle(base / name, {"data": data, "labels": labels})
        batches[name] = (data, labels)
    _pickle(base / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})

    train, test = load_dataset("cifar10", str(tmp_path))
    assert train.x.shape == (15, 3, 32, 32) and test.x.shape == (3, 3, 32, 32)
    assert train.x.dtype == torch.float32 and train.y.dtype == torch.int64
    raw = np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)]).reshape(-1, 3, 32, 32)
    # Per-channel normalisation with channels in the right order (catches an HWC/CHW mix-up).
    torch.testing.assert_close(train.x, _expected_normalised(raw, "cifar10"))
    assert labels_of(test).tolist() == batches["test_batch"][1]


@pytest.mark.usefixtures("_no_md5")
def test_cifar100_generated(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    split_data = {}
    for name, n in (("train", 6), ("test", 2)):
        data = rng.integers(0, 256, size=(n, 3 * 32 * 32), dtype=np.uint8)
        fine = rng.integers(0, 100, size=n).tolist()
        fine[0] = 99
        _pickle(base / name, {"data": data, "fine_labels": fine, "coarse_labels": [0] * n})
        split_data[name] = (data, fine)
    _pickle(base / "meta", {"fine_label_names": [f"c{i}" for i in range(100)]})

    train, test = load_dataset("cifar100", str(tmp_path))
    assert train.x.shape == (6, 3, 32, 32) and test.x.shape == (2, 3, 32, 32)
    torch.testing.assert_close(test.x, _expected_normalised(split_data["test"][0].reshape(-1, 3, 32, 32), "cifar100"))
    assert labels_of(train).tolist() == split_data["train"][1]  # fine labels, 100 classes


def test_cifar_missing_says_where(tmp_path: Path) -> None:
    with pytest.raises(DatasetUnavailableError, match="cifar-10-batches-py"):
        load_dataset("cifar10", str(tmp_path))


def test_download_only_after_local_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """download=True is passed to torchvision only when the local load failed (no network is touched)."""
    calls: list[bool] = []
    state = {"present": False}

    class FakeCIFAR10:
        def __init__(self, root: str, train: bool = True, download: bool = False) -> None:
            calls.append(download)
            if download:
                state["present"] = True  # stands in for a successful download
            if not state["present"]:
                raise RuntimeError("Dataset not found or corrupted. You can use download=True to download it")
            n = 4 if train else 2
            self.data = np.full((n, 32, 32, 3), 128, dtype=np.uint8)
            self.targets = list(range(n))

    monkeypatch.setattr(tvd, "CIFAR10", FakeCIFAR10)
    with pytest.raises(DatasetUnavailableError, match=r"dataset\.download=true"):
        load_dataset("cifar10", str(tmp_path))
    assert calls == [False]
    train, test = load_dataset("cifar10", str(tmp_path), download=True)
    # The train split: local (fails), the download of both splits, local again (decodes both). The test split is
    # loaded on its own and decoded again: this fake writes no source files for the decoded cache to key on.
    assert calls == [False, False, True, True, False, False, False, False]
    assert train.x.shape == (4, 3, 32, 32) and test.x.shape == (2, 3, 32, 32)
    # The cache entry is shared by download=True and download=False.
    assert load_dataset("cifar10", str(tmp_path))[0] is train
    assert len(calls) == 8
