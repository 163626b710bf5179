"""Tests for fl_app.data.partition (docs/running.md, "Data and models"): determinism, disjointness, coverage, skew."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import fl_app.data.partition as partition_mod
from fl_app.data.partition import (
    SCHEMES,
    PartitionError,
    dirichlet_balanced_partition,
    dirichlet_partition,
    get_partition,
    iid_partition,
    partition_indices,
)

NUM_CLASSES = 10
LABELS = np.repeat(np.arange(NUM_CLASSES), 300)  # 3000 samples, balanced classes
ALL_SCHEMES = sorted(SCHEMES)


def _max_class_fraction(parts: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean over clients of the share of the client's most frequent class (1/K = no skew, 1 = one class)."""
    return float(np.mean([np.bincount(labels[p], minlength=NUM_CLASSES).max() / len(p) for p in parts]))


def _assert_well_formed(parts: list[np.ndarray], num_samples: int) -> None:
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1
        assert np.all(np.diff(p) > 0), "each client's indices are sorted and distinct"
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined), "clients are disjoint"
    assert joined.min() >= 0 and joined.max() < num_samples


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_deterministic_per_seed(scheme: str) -> None:
    a = partition_indices(scheme, LABELS, 20, 0.5, seed=7)
    b = partition_indices(scheme, LABELS, 20, 0.5, seed=7)
    c = partition_indices(scheme, LABELS, 20, 0.5, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("scheme", ALL_SCHEMES)
def test_disjoint_sorted_and_global_rng_untouched(scheme: str) -> None:
    state = np.random.get_state()
    parts = partition_indices(scheme, LABELS, 30, 0.3, seed=1)
    after = np.random.get_state()
    assert state[0] == after[0] and np.array_equal(state[1], after[1]) and state[2:] == after[2:]
    assert len(parts) == 30
    _assert_well_formed(parts, len(LABELS))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_covers_all_indices(scheme: str) -> None:
    parts = partition_indices(scheme, LABELS, 25, 0.3, seed=2)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))


def test_iid_sizes_balanced() -> None:
    parts = iid_partition(1003, 10, np.random.default_rng(0))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1003
    # Roughly uniform label mix: no client is dominated by one class.
    assert _max_class_fraction(partition_indices("iid", LABELS, 10, 0.0, 0), LABELS) < 0.2


@pytest.mark.parametrize("scheme", ["dirichlet", "dirichlet_balanced"])
def test_small_alpha_is_more_skewed(scheme: str) -> None:
    skewed = _max_class_fraction(partition_indices(scheme, LABELS, 20, 0.1, seed=3), LABELS)
    mild = _max_class_fraction(partition_indices(scheme, LABELS, 20, 10.0, seed=3), LABELS)
    assert skewed > 0.4 and mild < 0.25 and skewed > 2 * mild


def test_dirichlet_balanced_equal_sizes() -> None:
    labels = np.random.default_rng(0).integers(0, NUM_CLASSES, size=1007)
    parts = dirichlet_balanced_partition(labels, 10, 0.3, np.random.default_rng(1))
    assert [len(p) for p in parts] == [100] * 10  # ⌊1007/10⌋ each; 7 samples left over
    _assert_well_formed(parts, len(labels))


def test_dirichlet_balanced_handles_exhausted_classes() -> None:
    # Priors are ~50/50 but class 0 has only 5 samples: it runs out early and the priors are renormalised.
    labels = np.array([0] * 5 + [1] * 995)
    parts = dirichlet_balanced_partition(labels, 10, 100.0, np.random.default_rng(0))
    assert [len(p) for p in parts] == [100] * 10
    assert sum(int((labels[p] == 0).sum()) for p in parts) == 5
    _assert_well_formed(parts, len(labels))


def test_dirichlet_min_partition_size_respected() -> None:
    parts = dirichlet_partition(LABELS, 50, 0.5, np.random.default_rng(4), min_partition_size=20)
    assert min(len(p) for p in parts) >= 20
    _assert_well_formed(parts, len(LABELS))


def test_dirichlet_gives_up_with_clear_error() -> None:
    with pytest.raises(PartitionError, match="after 3 redraws"):
        dirichlet_partition(LABELS, 500, 0.01, np.random.default_rng(0), min_partition_size=5, max_retries=3)
    with pytest.raises(PartitionError):
        dirichlet_partition(LABELS, 10, 1.0, np.random.default_rng(0), min_partition_size=301)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="unknown partition scheme"):
        partition_indices("shards", LABELS, 10, 0.5, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alpha"):
        partition_indices("dirichlet", LABELS, 10, 0.0, 0)
    with pytest.raises(ValueError, match="cannot split"):
        partition_indices("iid", LABELS[:5], 10, 0.5, 0)


@pytest.fixture
def fake_dataset(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str | None]]]:
    """Replace load_labels inside partition.py by a tiny in-memory dataset's labels; records the calls."""
    calls: list[tuple[str, str | None]] = []

    def fake_labels(name: str, data_dir: str | None = None) -> np.ndarray:
        calls.append((name, data_dir))
        return LABELS.copy()

    monkeypatch.setattr(partition_mod, "load_labels", fake_labels)
    partition_mod._cached_partitions.cache_clear()
    yield calls
    partition_mod._cached_partitions.cache_clear()


def test_get_partition_cached_and_consistent(fake_dataset: list[tuple[str, str | None]], tmp_path: Path) -> None:
    args = ("fake", str(tmp_path), "dirichlet", 20, 0.5, 11)
    first = get_partition(*args, partition_id=3)
    again = get_partition(*args, partition_id=3)
    other = get_partition(*args, partition_id=4)
    assert again is first, "the full partition is computed once and reused"
    assert len(fake_dataset) == 1, "labels loaded once for all partition ids"
    expected = partition_indices("dirichlet", LABELS, 20, 0.5, 11)
    assert np.array_equal(first, expected[3]) and np.array_equal(other, expected[4])
    assert not first.flags.writeable, "cached arrays are shared, so read-only"
    with pytest.raises(ValueError, match="partition_id"):
        get_partition(*args, partition_id=20)


def test_get_partition_iid_ignores_alpha(fake_dataset: list[tuple[str, str | None]], tmp_path: Path) -> None:
    a = get_partition("fake", str(tmp_path), "iid", 10, 0.1, 0, partition_id=0)
    b = get_partition("fake", str(tmp_path), "iid", 10, 5.0, 0, partition_id=0)
    assert a is b
