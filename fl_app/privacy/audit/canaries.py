"""The canaries and their dot products with model deltas.

K canary clients each own a fixed random unit direction u_i ∈ R^d (:func:`canary_direction`: dense, uniform on
the sphere, drawn from ``make_rng(seed, AUDIT_STREAM, i)``); for every round t the server records ⟨u_i, Δ_t⟩
with the model delta Δ_t = w_{t+1} − w_t (:func:`canary_dots`). **Sparse canaries**
(:func:`sparse_canary_direction`) make many canaries affordable: a unit vector on s ≪ d coordinates drawn
uniformly without replacement, with Gaussian values, O(s) to draw and O(s·r) to score against r deltas instead
of O(d) and O(d·r). Steinke, Nasr & Jagielski's lower bound (NeurIPS 2023) stays valid with them; the analytic
N(0, 1/d) null of the final-model cosine of Andrew et al. (ICLR 2024, §4) is no longer exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fl_app.privacy.audit.checks import _non_negative_int
from fl_app.privacy.mechanisms import global_l2_norm, make_rng

#: Purpose key of the canary streams: canary i draws from ``make_rng(seed, AUDIT_STREAM, i)``, apart from every
#: sampling, noise and mask stream. The key is reserved for the directions: numpy's SeedSequence ignores trailing
#: zero words, so (seed, AUDIT_STREAM, i, 0, …) *is* canary i's stream, and any other draw keyed
#: (seed, AUDIT_STREAM, j, …) would replay canary j's bits (and, for the insertion coin, tie it to a public vector).
#: The one other key under it is canary i's *sparse* direction, (seed, AUDIT_STREAM, i, SPARSE_CANARY_KEY).
AUDIT_STREAM: int = 9_001

#: Trailing key word of the sparse directions: :func:`sparse_canary_direction` draws from
#: ``make_rng(seed, AUDIT_STREAM, i, SPARSE_CANARY_KEY)``. It must not be 0 — SeedSequence ignores trailing zero
#: words, so (seed, AUDIT_STREAM, i, 0) is the dense canary i's stream — and any non-zero word gives a stream
#: independent of the dense one (SeedSequence hashes the whole key). The sparse and the dense canary i are thus
#: different, independent vectors; a run uses one kind or the other.
SPARSE_CANARY_KEY: int = 1


def canary_direction(seed: int, index: int, size: int) -> np.ndarray:
    """Canary ``index``'s direction: a float32 unit vector of length ``size``, uniform on the sphere.

    Coordinates are standard normals drawn in float32 from ``make_rng(seed, AUDIT_STREAM, index)``; the norm is
    accumulated and the division done in float64, then the result is cast to float32 (‖u‖ = 1 up to float32
    rounding, |‖u‖ − 1| ≲ 1e-7). Float32 draws cut the cost of the dominant step by ~40% and perturb the direction
    by a relative 6e-8 per coordinate, far below anything an audit can resolve. The dtype is part of the canary's
    identity: the same (seed, index, size) drawn in float64 would be a different vector.
    """
    seed = _non_negative_int("seed", seed)
    index = _non_negative_int("index", index)
    size = _non_negative_int("size", size)
    if size == 0:
        raise ValueError("a canary direction needs size >= 1")
    draws = make_rng(seed, AUDIT_STREAM, index).standard_normal(size, dtype=np.float32)
    norm = global_l2_norm([draws])
    # dtype=float64 computes each quotient in float64 and rounds once to float32, without a float64 copy of u.
    return np.divide(draws, norm, out=np.empty(size, dtype=np.float32), dtype=np.float64, casting="same_kind")


def _distinct_coordinates(rng: np.random.Generator, size: int, support: int) -> np.ndarray:
    """``support`` distinct integers of [0, size), a uniformly random subset, sorted, as int64.

    Sparse case (2·support ≤ size): draw ``support`` integers uniformly *with* replacement, drop the repeats, draw as
    many as are missing, and so on until ``support`` distinct values are held; each round keeps a fraction
    ≥ 1 − support/size ≥ 1/2 of its draws, so the expected work is O(support) draws plus the sorts, whatever size
    is (at size = 1.66M and support = 1000 about 0.3 repeats are expected: one extra round for a quarter of the
    canaries). The result is a uniform subset: every step treats all values alike (it only looks at which draws
    repeat), so its law is invariant under any permutation of [0, size), and it always has exactly ``support``
    elements. Dense case: numpy's sampling without replacement (a partial shuffle, O(size), then O(support) anyway).
    """
    if 2 * support > size:
        return np.sort(rng.choice(size, support, replace=False, shuffle=False).astype(np.int64, copy=False))
    chosen = np.sort(rng.integers(0, size, support, dtype=np.int64))
    while True:
        fresh = np.empty(chosen.size, dtype=np.bool_)
        fresh[0] = True
        np.not_equal(chosen[1:], chosen[:-1], out=fresh[1:])
        missing = support - int(np.count_nonzero(fresh))
        if missing == 0:
            return chosen
        chosen = np.sort(np.concatenate([chosen[fresh], rng.integers(0, size, missing, dtype=np.int64)]))


def sparse_canary_direction(seed: int, index: int, size: int, support: int) -> tuple[np.ndarray, np.ndarray]:
    """Canary ``index``'s *sparse* direction in R^``size``, ``(indices, values)``: a unit vector on ``support`` coords.

    ``indices`` (int64, sorted, distinct, in [0, size)) is a uniformly random ``support``-subset of the coordinates
    (:func:`_distinct_coordinates`: O(support) draws, not O(size)); ``values`` (float32) are standard normals drawn
    after them, normalised in float64 to ‖values‖ = 1 and cast to float32, exactly as :func:`canary_direction`
    does with its d draws (|‖u‖ − 1| ≲ 1e-7). All draws come from ``make_rng(seed, AUDIT_STREAM, index,
    SPARSE_CANARY_KEY)``: a stream of its own, independent of the dense canary ``index`` (see
    :data:`SPARSE_CANARY_KEY`). ``support`` and ``size`` are part of the canary's identity. Measured on the 2-core
    development machine: ~0.1 ms a canary at support = 1000, d = 1.66M (10,000 canaries in ~1 s), against
    ~25 ms for a dense one. :func:`to_dense` gives the d-vector a canary client inserts.

    The sparse direction is *not* uniform on the sphere. Its cosine with a fixed vector v still has mean 0 and
    variance exactly 1/d (the law of u is invariant under coordinate permutations and sign flips, so
    E[u_i u_j] = δ_ij/d), but it is a scale mixture of Gaussians, not N(0, 1/d): its tails depend on how v's mass
    is spread (excess kurtosis ≈ 3(d·Σv_i⁴/‖v‖⁴ − 1)/support to first order), heavier the more v is
    concentrated on few coordinates. The analytic null N(0, 1/d) that Andrew et al. use for the final-model
    statistic is therefore not exact for sparse canaries: fit the null to the never-inserted canaries
    (``estimate_epsilon`` without ``known_null``). Steinke et al.'s lower bound is unaffected: it holds for any
    canaries, as long as their insertion coins are independent and the scores do not look at them.
    """
    seed = _non_negative_int("seed", seed)
    index = _non_negative_int("index", index)
    size = _non_negative_int("size", size)
    support = _non_negative_int("support", support)
    if not 1 <= support <= size:
        raise ValueError(f"a sparse canary needs 1 <= support <= size, got support={support}, size={size}")
    rng = make_rng(seed, AUDIT_STREAM, index, SPARSE_CANARY_KEY)
    coordinates = _distinct_coordinates(rng, size, support)
    draws = rng.standard_normal(support, dtype=np.float32)
    norm = global_l2_norm([draws])
    values = np.divide(draws, norm, out=np.empty(support, dtype=np.float32), dtype=np.float64, casting="same_kind")
    return coordinates, values


def to_dense(indices: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """The float32 vector of length ``size`` that is ``values`` at ``indices`` and 0 elsewhere.

    For the canary client, which inserts the full d-vector of a :func:`sparse_canary_direction`. ``indices``
    must be distinct integers in [0, size) (a repeated index would silently keep only one of its values).
    """
    size = _non_negative_int("size", size)
    coordinates = np.asarray(indices)
    weights = np.asarray(values)
    if coordinates.ndim != 1 or weights.shape != coordinates.shape:
        raise ValueError(f"indices and values must be flat and of one length, got {coordinates.shape}, {weights.shape}")
    if coordinates.size and not np.issubdtype(coordinates.dtype, np.integer):
        raise TypeError(f"indices must be integers, got dtype {coordinates.dtype}")
    if coordinates.size and (coordinates.min() < 0 or coordinates.max() >= size):
        raise ValueError(f"indices must lie in [0, {size})")
    if np.unique(coordinates).size != coordinates.size:
        raise ValueError("indices must be distinct")
    dense = np.zeros(size, dtype=np.float32)
    dense[coordinates.astype(np.int64, copy=False)] = weights
    return dense


def canary_dots(
    seed: int, indices: Sequence[int], vectors: Sequence[np.ndarray], *, support: int | None = None
) -> np.ndarray:
    """⟨u_i, v_r⟩ for each canary i in ``indices`` and each flat vector v_r: shape (len(indices), len(vectors)).

    The vectors (normally float32 model deltas Δ_t, all of the same length d) are stacked once into a (d, r)
    float32 matrix; the canaries are then generated one at a time with :func:`canary_direction` — the very vectors
    the canary clients insert — and each is multiplied with the whole matrix, so at no point are all K × d canary
    coordinates held. The products run in float32 BLAS (measured error ~1e-8 of the null spread ‖v‖/√d at
    d = 1.7M) and are returned in float64.

    Cost, per canary (measured at d = 1.7M on one core): ~25 ms to generate it (d float32 normal draws, the
    dominant term, then a float64 norm and division) and ~3 ms per vector for the product. K = 1000 canaries
    against r = 1 delta take ~30 s of CPU, against r = 10 ~60 s: generation is paid once per call whatever r, so
    score all pending rounds in one call. Memory: the (d, r) matrix (4·d·r bytes) plus one canary and its draws
    (8·d bytes).

    ``support=s`` scores the *sparse* canaries :func:`sparse_canary_direction` (seed, i, d, s) instead (``None``:
    the dense ones above, unchanged): each canary's s values are multiplied with the s rows ``matrix[indices]``
    it covers, in float32 BLAS as well — O(s·r) a canary instead of O(d·r). Measured at d = 1.66M, s = 1000,
    r = 12 on the 2-core development machine: ~0.1 ms to generate a canary and ~0.1–0.2 ms to gather its rows
    and multiply (random rows of the 80 MB matrix: memory latency, not arithmetic — gathering a block of canaries
    at once was no faster), so 10,000 canaries in ~3 s instead of ~6 min dense and 50,000 in ~13 s
    (bench/audit_power_k.py). The same canary set must be used to insert and to score: a dense and a sparse
    canary i are different vectors.
    """
    seed = _non_negative_int("seed", seed)
    canaries = [_non_negative_int("index", index) for index in indices]
    if support is not None and _non_negative_int("support", support) == 0:
        raise ValueError("support must be >= 1 (None scores the dense canaries)")
    arrays = [np.asarray(vector) for vector in vectors]
    if not arrays:
        return np.zeros((len(canaries), 0), dtype=np.float64)
    size = arrays[0].size
    for vector in arrays:
        if vector.ndim != 1 or vector.size != size:
            raise ValueError(f"vectors must be flat and of one length, got shapes {[a.shape for a in arrays]}")
        if not np.issubdtype(vector.dtype, np.floating):
            raise TypeError(f"vectors must be floating point, got dtype {vector.dtype}")
    matrix = np.stack(arrays, axis=1).astype(np.float32, copy=False)
    dots = np.empty((len(canaries), len(arrays)), dtype=np.float64)
    if support is None:
        for row, index in enumerate(canaries):
            dots[row] = canary_direction(seed, index, size) @ matrix
        return dots
    if support > size:
        raise ValueError(f"support must be <= the vectors' length {size}, got {support}")
    for row, index in enumerate(canaries):
        coordinates, values = sparse_canary_direction(seed, index, size, support)
        dots[row] = values @ matrix[coordinates]
    return dots
