"""Splitting a training set over M clients (docs/running.md, "Data and models"); the only place partitioning lives.

Schemes, all deterministic from a seed:

- ``iid``: a random permutation cut into M near-equal shards.
- ``dirichlet`` (label skew): for every class, its samples are split over the M clients with proportions
  drawn from Dir(α·1_M); the whole draw is repeated until every client holds at least ``min_partition_size``
  samples. Same semantics as flwr-datasets ``DirichletPartitioner`` (without its optional self-balancing) and
  as the released DP-FedSAM code's ``dirichlet_cifar_noniid`` (which has no minimum-size retry).
- ``dirichlet_balanced``: every client gets ⌊N/M⌋ samples; client i has its own class prior π_i ~ Dir(α·1_K)
  and fills its slots by drawing classes from π_i and taking samples from that class's pool without
  replacement; when a class runs out it is removed from every prior and the priors are renormalised. This is
  the released CIFAR split and flwr-datasets ``InnerDirichletPartitioner`` (which follows FedLab's
  ``client_inner_dirichlet_partition``).

We implement these in numpy instead of calling flwr-datasets because its partitioners operate on Hugging Face
``datasets.Dataset`` objects, while our data are torchvision tensors (see ``datasets.py``); only the
semantics are reproduced, not flwr-datasets' random stream. α ∈ {0.3, 0.6} in the papers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import numpy as np

from fl_app.data.datasets import load_labels, resolve_data_dir

__all__ = [
    "SCHEMES",
    "PartitionError",
    "Scheme",
    "dirichlet_balanced_partition",
    "dirichlet_partition",
    "get_partition",
    "iid_partition",
    "partition_indices",
]

Scheme = Literal["iid", "dirichlet", "dirichlet_balanced"]


class PartitionError(ValueError):
    """A partition with the requested constraints could not be produced."""


def _check_common(num_samples: int, num_clients: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if num_samples < num_clients:
        raise ValueError(f"cannot split {num_samples} samples over {num_clients} clients")


def _check_alpha(alpha: float) -> None:
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"Dirichlet alpha must be a positive finite number, got {alpha}")


def _finish(parts: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _class_pools(labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, list[np.ndarray]]:
    """Classes present in ``labels`` and, per class, its sample indices in random order."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    classes = np.unique(labels)
    # Shuffled so that which samples of a class a client gets does not follow the file order.
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    return classes, pools


def iid_partition(num_samples: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Random permutation cut into ``num_clients`` shards whose sizes differ by at most one."""
    _check_common(num_samples, num_clients)
    return _finish(np.array_split(rng.permutation(num_samples), num_clients))


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_partition_size: int = 1,
    max_retries: int = 100,
) -> list[np.ndarray]:
    """Label-skew split: each class divided over the clients with proportions ~ Dir(α·1_M).

    The whole assignment is redrawn (from the same generator, so still deterministic) until every client
    has at least ``min_partition_size`` samples; :class:`PartitionError` after ``max_retries`` redraws.
    Small α with many clients makes empty clients likely (e.g. α = 0.1, M = 500 on Fashion-MNIST).
    """
    labels = np.asarray(labels)
    _check_common(len(labels), num_clients)
    _check_alpha(alpha)
    if min_partition_size * num_clients > len(labels):
        raise PartitionError(
            f"min_partition_size={min_partition_size} × {num_clients} clients exceeds {len(labels)} samples"
        )
    _, pools = _class_pools(labels, rng)
    sizes = np.zeros(num_clients, dtype=np.int64)
    for _attempt in range(max_retries + 1):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for pool in pools:
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            # Cut points from the cumulative proportions, as flwr-datasets and the released code do.
            cuts = (np.cumsum(proportions)[:-1] * len(pool)).astype(np.int64)
            for client, chunk in enumerate(np.split(pool, cuts)):
                parts[client].append(chunk)
        sizes = np.array([sum(len(c) for c in p) for p in parts])
        if sizes.min() >= min_partition_size:
            return _finish([np.concatenate(p) for p in parts])
    raise PartitionError(
        f"dirichlet partition: after {max_retries} redraws some client still had fewer than "
        f"{min_partition_size} samples (last draw: min {int(sizes.min())}, "
        f"{int((sizes < min_partition_size).sum())} clients short) with alpha={alpha}, "
        f"num_clients={num_clients}, {len(labels)} samples. "
        "Raise alpha, lower num_clients or min_partition_size, or use scheme dirichlet_balanced."
    )


def _fill_order(num_clients: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Sequence of client ids in which slots are filled: each step picks a uniformly random non-full client.

    Equivalent in law to the sequential loop of flwr-datasets / FedLab (draw a client uniformly, reject it if
    full), vectorised: draw blocks of uniform ids and keep an id only while its client still has room.
    """
    filled = np.zeros(num_clients, dtype=np.int64)
    out: list[np.ndarray] = []
    remaining = num_clients * size
    while remaining:
        draws = rng.integers(0, num_clients, size=max(2 * remaining, 4 * num_clients))
        # Rank of each draw among earlier draws of the same client in this block.
        order = np.argsort(draws, kind="stable")
        sorted_draws = draws[order]
        rank_sorted = np.arange(len(draws)) - np.searchsorted(sorted_draws, sorted_draws, side="left")
        rank = np.empty_like(rank_sorted)
        rank[order] = rank_sorted
        kept = draws[filled[draws] + rank < size]
        out.append(kept)
        filled += np.bincount(kept, minlength=num_clients)
        remaining -= len(kept)
    return np.concatenate(out)


_BLOCK = 1 << 16


def _renormalise(priors: np.ndarray, available: np.ndarray) -> np.ndarray:
    """Zero exhausted classes and renormalise each row; rows left with no mass become uniform.

    A row can lose all its mass when small α put (numerically) everything on exhausted classes; flwr-datasets
    would divide by zero there, we fall back to uniform over the remaining classes.
    """
    p = priors * available
    sums = p.sum(axis=1, keepdims=True)
    uniform = np.broadcast_to(available / available.sum(), p.shape)
    return np.where(sums > 0, p / np.where(sums > 0, sums, 1.0), uniform)


def dirichlet_balanced_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Equal-size split (⌊N/M⌋ each) with a per-client label prior π_i ~ Dir(α·1_K).

    Slots are filled one at a time by a uniformly random non-full client, which draws a class from its prior
    and takes the next sample of that class's shuffled pool. An exhausted class is removed from all priors
    (renormalised). The N − M⌊N/M⌋ leftover samples are not assigned.

    Vectorised by epochs between class exhaustions: all pending slots draw a class at once; the prefix before
    the first over-subscribed draw is accepted, that class is removed, and the rest is redrawn. This has the
    same law as the sequential algorithm because each step's class draw depends only on the set of
    exhausted classes at that step.
    """
    labels = np.asarray(labels)
    _check_common(len(labels), num_clients)
    _check_alpha(alpha)
    classes, pools = _class_pools(labels, rng)
    num_classes = len(classes)
    size = len(labels) // num_clients
    priors = rng.dirichlet(np.full(num_classes, alpha), size=num_clients)
    clients = _fill_order(num_clients, size, rng)

    left = np.array([len(p) for p in pools], dtype=np.int64)
    cdf = np.cumsum(_renormalise(priors, (left > 0).astype(np.float64)), axis=1)
    chosen = np.empty(len(clients), dtype=np.int64)
    start = 0
    while start < len(clients):
        # Bounded blocks keep the steps × classes temporaries small (EMNIST: 700k steps × 62 classes).
        pending = clients[start : start + _BLOCK]
        u = rng.random(len(pending))
        # Inverse-CDF class draw per step; the clip guards u above a row's float sum (1 - 1e-16).
        cls = np.minimum((u[:, None] >= cdf[pending]).sum(axis=1), num_classes - 1)
        # First step that asks for more samples of a class than are left.
        stop = len(pending)
        for c in np.flatnonzero(np.bincount(cls, minlength=num_classes) > left):
            stop = min(stop, int(np.flatnonzero(cls == c)[left[c]]))
        chosen[start : start + stop] = cls[:stop]
        left -= np.bincount(cls[:stop], minlength=num_classes)
        start += stop
        if stop < len(pending):
            cdf = np.cumsum(_renormalise(priors, (left > 0).astype(np.float64)), axis=1)

    # The k-th draw of class c takes the k-th sample of c's shuffled pool.
    sample = np.empty(len(chosen), dtype=np.int64)
    for c in range(num_classes):
        steps = np.flatnonzero(chosen == c)
        sample[steps] = pools[c][: len(steps)]
    # Every client has exactly `size` slots, so grouping the steps by client is a stable sort + reshape.
    by_client = sample[np.argsort(clients, kind="stable")].reshape(num_clients, size)
    return _finish(list(by_client))


_PartitionFn = Callable[[np.ndarray, int, float, np.random.Generator], list[np.ndarray]]

# Uniform signature per scheme, so dispatch is a lookup and a new scheme is one entry.
SCHEMES: dict[str, _PartitionFn] = {
    "iid": lambda labels, m, _alpha, rng: iid_partition(len(labels), m, rng),
    "dirichlet": lambda labels, m, alpha, rng: dirichlet_partition(labels, m, alpha, rng),
    "dirichlet_balanced": lambda labels, m, alpha, rng: dirichlet_balanced_partition(labels, m, alpha, rng),
}


def partition_indices(
    scheme: Scheme,
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed: int,
) -> list[np.ndarray]:
    """Partition the indices of ``labels`` by ``scheme``, deterministically in ``seed``.

    ``alpha`` is ignored for ``iid``.

    Returns one sorted int64 index array per client; the arrays are disjoint.
    """
    try:
        fn = SCHEMES[scheme]
    except KeyError:
        raise ValueError(f"unknown partition scheme {scheme!r}; known: {sorted(SCHEMES)}") from None
    # A private generator: partitioning must not consume or depend on any global RNG state.
    return fn(np.asarray(labels), num_clients, alpha, np.random.default_rng(seed))


@functools.cache  # = lru_cache(maxsize=None); all partitions computed once per process
def _cached_partitions(
    dataset_name: str, data_dir: str, scheme: Scheme, num_clients: int, alpha: float, seed: int, num_samples: int
) -> tuple[np.ndarray, ...]:
    labels = load_labels(dataset_name, data_dir)  # the labels alone: no process holds images it does not train on
    parts = partition_indices(scheme, labels[: num_samples or len(labels)], num_clients, alpha, seed)
    for p in parts:
        p.setflags(write=False)  # shared by every caller in the process
    return tuple(parts)


def get_partition(
    dataset_name: str,
    data_dir: str | None,
    scheme: Scheme,
    num_clients: int,
    alpha: float,
    seed: int,
    partition_id: int,
    num_samples: int | None = None,
) -> np.ndarray:
    """Training-set indices (sorted int64, read-only) of client ``partition_id``.

    The full partition is computed once per process for a given key and cached, so each simulated client
    costs an index lookup. ``alpha`` is normalised out of the key for ``iid``. ``num_samples`` restricts the
    partitioned training set to its first ``num_samples`` examples (small, fast runs); None = all.
    """
    if not 0 <= partition_id < num_clients:
        raise ValueError(f"partition_id {partition_id} outside [0, {num_clients})")
    key_alpha = 0.0 if scheme == "iid" else float(alpha)
    parts = _cached_partitions(
        dataset_name, resolve_data_dir(data_dir), scheme, int(num_clients), key_alpha, int(seed), int(num_samples or 0)
    )
    return parts[partition_id]
