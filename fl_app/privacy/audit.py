"""Statistics of a canary privacy audit of client-level DP federated learning (pure functions, numpy/scipy).

Setting. K canary clients each own a fixed random unit direction u_i ∈ R^d (:func:`canary_direction`). Each canary
is inserted into training independently with probability 1/2; the others are never inserted and serve as the
null. An inserted canary's update points along +u_i, so it moves the global model along +u_i. For every round t
the server records ⟨u_i, Δ_t⟩ with the model delta Δ_t = w_{t+1} − w_t (:func:`canary_dots`). From those numbers:

**One-run ε estimate** — G. Andrew, P. Kairouz, S. Oh, A. Oprea, H. B. McMahan, V. M. Suriyakumar, "One-shot
Empirical Privacy Estimation for Federated Learning", ICLR 2024 (arXiv 2302.03098v5).

- Test statistic when only the final model is released (§4): the cosine of each canary with the final model
  minus the initial one, cos(u_i, w_T − w_0) (:func:`final_model_statistics`).
- Test statistic when every iterate is released (§4, the all-iterates threat model): the *maximum over rounds* of
  the per-round cosine, max_t cos(u_i, Δ_t) (:func:`all_iterates_statistics`), as in the authors' released code
  (google-research/federated, ``one_shot_epe``: ``max_canary_model_delta_cosines`` for the inserted canaries and
  ``max_unseen_canary_model_delta_cosines`` for the never-inserted ones).
- ε: fit a Gaussian N(mean, std²) to the statistics of the never-inserted canaries and one to those of the
  inserted canaries, and report the ε at δ of that pair of Gaussians (§3 for the Gaussian mechanism, §4 for FL;
  :func:`estimate_epsilon`, :func:`gaussian_pair_epsilon`). The pair's ε is exact for unequal variances: the
  privacy profile δ(ε) = max over both orderings of P_Q[L > ε] − e^ε P_P[L > ε], L = log(dQ/dP) (the
  hockey-stick divergence), inverted for ε by a root finder. For equal variances it is the Gaussian-DP profile of
  Dong, Roth & Su with μ = |Δmean|/std: δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).
- Uncertainty: a percentile bootstrap that resamples each set with replacement (not in the paper, which reports
  point estimates; added so a run can say how well K canaries pin ε down).

Where this differs from the paper: for the final model the paper uses the *analytic* null N(0, 1/d) (§4: the
cosine of a uniformly random direction with any fixed vector), so that no canary has to be held out; here the null
is always fitted to the never-inserted canaries, which is what the all-iterates statistic needs anyway (the max over
rounds of T null cosines is not N(0, 1/d)) and costs K/2 of the canaries. Under the all-iterates statistic neither
set is Gaussian (a maximum of T nearly Gaussian variables); the Gaussian fit is the paper's approximation and the
resulting ε an *estimate*, not a bound.

**One-run lower bound** — T. Steinke, M. Nasr, M. Jagielski, "Privacy Auditing with One (1) Training Run",
NeurIPS 2023 (arXiv 2305.08846). The audit: m canaries, each included independently with probability 1/2; the
auditor guesses "included" on the k₊ highest scores and "excluded" on the k₋ lowest and abstains on the rest;
with r = k₊ + k₋ guesses of which v are correct, the mechanism is not (ε, δ)-DP at significance p when
P[W ≥ v] ≤ P[Binomial(r, q) ≥ v] + 2mδ · max_{1≤i≤v} P[v − i ≤ Binomial(r, q) < v] / i < p, q = e^ε/(1 + e^ε)
(the approximate-DP theorem; the p-value is computed exactly as in the paper's Appendix D code,
:func:`one_run_p_value`). For δ = 0 this is the pure-DP binomial tail. Trying several guess counts multiplies the
chances of a false certificate, so each of the n counts tried is tested at significance (1 − confidence)/n
(Bonferroni) and the largest certified ε is reported (:func:`one_run_lower_bound`). Even when every guess is
right the bound cannot exceed a ceiling set by m, δ and the confidence alone (:func:`certifiable_epsilon`): an audit
only has teeth where that ceiling is above the accountant's ε, and the ceiling grows with the number of canaries.

Which guesses (:data:`GUESS_RULES`): ``two_sided`` splits each count between the highest scores ("included") and
the lowest ("excluded"), the paper's symmetric rule; ``one_sided`` guesses "included" on the highest scores only
and abstains on the rest (k₋ = 0, which the theorem allows: it holds for any guesses that are a function of the
scores). In a federated run an inserted canary joins each round only with the sampling rate q, so a fraction
(1 − q)^T of the inserted ones never joins and scores like the null under *any* mechanism: the two-sided rule's
"excluded" guesses on the lowest scores are then partly wrong whatever the mechanism does, and its bound stays
below the accountant's ε even for a mechanism with no noise at all; the one-sided rule loses nothing to them.

**Sparse canaries**, to make many canaries affordable (:func:`sparse_canary_direction`): a unit vector supported on
s ≪ d coordinates drawn uniformly without replacement, with Gaussian values. Generating one costs O(s) draws
instead of O(d) and scoring it against r deltas O(s·r) instead of O(d·r) (``canary_dots(..., support=s)``).
Steinke et al.'s bound stays valid with them — the theorem needs only the independent insertion coins and
scores computed without looking at them, whatever the canaries are — but the analytic N(0, 1/d) null of the
final-model cosine is no longer exact (see :func:`sparse_canary_direction`): fit the null to the never-inserted
canaries, as :func:`estimate_epsilon` does by default.

Everything here is pure: the only randomness is the canary stream :func:`canary_direction` (derived from the seed
through :func:`fl_app.privacy.mechanisms.make_rng`) and the bootstrap, which takes an explicit generator.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fl_app.choices import GUESS_RULES, GuessRule
from fl_app.privacy.mechanisms import global_l2_norm, make_rng

# SciPy's special functions, root finder and binomial are imported where they are called: scipy.stats alone costs
# ~0.4 s, which every run's driver would pay on its way to starting Ray, and only an audit's evaluation uses them.

__all__ = [
    "AUDIT_STREAM",
    "GUESS_RULES",
    "SPARSE_CANARY_KEY",
    "EpsilonEstimate",
    "LowerBound",
    "all_iterates_statistics",
    "canary_direction",
    "canary_dots",
    "certifiable_epsilon",
    "default_guess_counts",
    "estimate_epsilon",
    "final_model_statistics",
    "gaussian_pair_delta",
    "gaussian_pair_epsilon",
    "one_run_lower_bound",
    "one_run_p_value",
    "sparse_canary_direction",
    "to_dense",
]

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

# Bisection on ε: after at most _MAX_DOUBLINGS doublings of the bracket and _BISECTIONS halvings the bracket is
# below 2^(_MAX_DOUBLINGS − _BISECTIONS) ≈ 1e-21, i.e. at the resolution of a float64 ε.
_MAX_DOUBLINGS = 30
_BISECTIONS = 100
# A stand-in for log 0 in root finding: the root finders only need the sign, and −inf − (−inf) would be NaN.
_LOG_ZERO = -1e4


# ------------------------------------------------------------------------------------------------------------
# Canaries and their dot products with model deltas
# ------------------------------------------------------------------------------------------------------------


def _non_negative_int(name: str, value: object) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


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


# ------------------------------------------------------------------------------------------------------------
# Test statistics (Andrew et al. §4)
# ------------------------------------------------------------------------------------------------------------


def _dots_matrix(dots: np.ndarray) -> np.ndarray:
    matrix = np.asarray(dots, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"dots must have shape (canaries, rounds), got {matrix.shape}")
    if not np.isfinite(matrix).all():
        raise ValueError("dots must be finite")
    return matrix


def _positive_finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def final_model_statistics(dots: np.ndarray, final_delta_norm: float) -> np.ndarray:
    """cos(u_i, w_T − w_0) for each canary: Σ_t dots[i, t] / ‖w_T − w_0‖ (Andrew et al. §4, final-model threat model).

    w_T − w_0 = Σ_t Δ_t, so the dot product with the final model's displacement is the sum of the per-round dots
    (summed in float64); ``final_delta_norm`` is ‖w_T − w_0‖, measured on the models themselves (the norm of the
    sum is not a function of the per-round norms).
    """
    matrix = _dots_matrix(dots)
    return matrix.sum(axis=1) / _positive_finite("final_delta_norm", final_delta_norm)


def all_iterates_statistics(dots: np.ndarray, delta_norms: np.ndarray) -> np.ndarray:
    """max_t cos(u_i, Δ_t) = max_t dots[i, t] / ‖Δ_t‖ for each canary (Andrew et al. §4, all iterates released).

    When the adversary sees every model delta, an inserted canary shows up as a large cosine in the rounds that
    included it; the paper's statistic — and the authors' code, which keeps a running ``tf.maximum`` of the
    per-round cosines — takes the maximum over rounds. The ε is then :func:`estimate_epsilon` on these values
    (one Gaussian fitted to the inserted canaries' maxima and one to the never-inserted canaries' maxima, which
    the authors' code records for this purpose): the null has to be measured, since the maximum of T null cosines
    is not N(0, 1/d).
    A round with ‖Δ_t‖ = 0 has no cosine and is rejected.
    """
    matrix = _dots_matrix(dots)
    norms = np.asarray(delta_norms, dtype=np.float64)
    if norms.shape != (matrix.shape[1],):
        raise ValueError(f"delta_norms must have shape ({matrix.shape[1]},), got {norms.shape}")
    if matrix.shape[1] == 0:
        raise ValueError("all_iterates_statistics needs at least one round")
    if not (np.isfinite(norms).all() and (norms > 0).all()):
        raise ValueError("every round's ‖Δ_t‖ must be positive and finite (a zero delta has no cosine)")
    return (matrix / norms).max(axis=1)


# ------------------------------------------------------------------------------------------------------------
# ε of a pair of Gaussians (exact privacy profile)
# ------------------------------------------------------------------------------------------------------------


def _log_interval_mass(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """log P[lo < Z < hi] for Z ~ N(0, 1), elementwise, accurate far in either tail (±inf endpoints allowed)."""
    from scipy.special import log_ndtr

    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = np.broadcast_arrays(np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64))
        # Subtract the smaller tail from the larger one in log space, on the side of 0 where both tails are small.
        left = log_ndtr(hi) + np.log1p(-np.exp(log_ndtr(lo) - log_ndtr(hi)))
        right = log_ndtr(-lo) + np.log1p(-np.exp(log_ndtr(-hi) - log_ndtr(-lo)))
        middle = np.log1p(-(np.exp(log_ndtr(lo)) + np.exp(log_ndtr(-hi))))
        result = np.where(hi <= 0, left, np.where(lo >= 0, right, middle))
        return np.where(lo < hi, result, -np.inf)


def _log_hockey_stick(
    epsilon: np.ndarray, p_mean: np.ndarray, p_std: np.ndarray, q_mean: np.ndarray, q_std: np.ndarray
) -> np.ndarray:
    """log(P_Q[L > ε] − e^ε P_P[L > ε]) with L = log(dQ/dP), P = N(p_mean, p_std²), Q = N(q_mean, q_std²).

    That difference is sup_S Q(S) − e^ε P(S), attained at S = {L > ε}. In the coordinate z = (y − p_mean)/p_std,
    P = N(0, 1), Q = N(m, s²) with m = (q_mean − p_mean)/p_std, s = q_std/p_std, and L(z) = a z² + b z + c with
    a = (1 − 1/s²)/2, b = m/s², c = −log s − m²/(2s²): S is a half-line (a = 0), the outside (a > 0) or the inside
    (a < 0) of the roots of L(z) = ε. Returns −inf where the difference is ≤ 0.
    """
    m = (q_mean - p_mean) / p_std
    s = q_std / p_std
    a = 0.5 * (1.0 - 1.0 / s**2)
    b = m / s**2
    c_eps = -np.log(s) - 0.5 * m**2 / s**2 - epsilon
    inf = np.full(np.broadcast(a, b, c_eps).shape, np.inf)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # Roots of a z² + b z + c_eps by the cancellation-free form: for |a| ≪ 1 (nearly equal variances) the near
        # root stays accurate and the far one runs off to ±inf, where it carries no mass.
        disc = b**2 - 4.0 * a * c_eps
        root = np.sqrt(np.maximum(disc, 0.0))
        half = -0.5 * (b + np.where(b >= 0, root, -root))
        near, far = c_eps / half, half / a
        r1, r2 = np.minimum(near, far), np.maximum(near, far)
        crossing = -c_eps / b  # a = 0: L(z) > ε beyond this point
    quadratic = a != 0
    two_roots = quadratic & (disc > 0)
    # S as the union of two disjoint intervals (lo1, hi1) ∪ (lo2, hi2); an empty interval has lo = hi.
    lo1 = np.select([two_roots & (a > 0), two_roots, quadratic, b > 0, b < 0], [-inf, r1, -inf, crossing, -inf], 0.0)
    hi1 = np.select(
        [two_roots & (a > 0), two_roots, quadratic & (a > 0), quadratic, b > 0, b < 0],
        [r1, r2, inf, -inf, inf, crossing],
        0.0,
    )
    lo2 = np.where(two_roots & (a > 0), r2, 0.0)
    hi2 = np.where(two_roots & (a > 0), inf, 0.0)

    log_p = np.logaddexp(_log_interval_mass(lo1, hi1), _log_interval_mass(lo2, hi2))
    log_q = np.logaddexp(
        _log_interval_mass((lo1 - m) / s, (hi1 - m) / s), _log_interval_mass((lo2 - m) / s, (hi2 - m) / s)
    )
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        gap = epsilon + log_p - log_q
        value = log_q + np.log1p(-np.exp(np.minimum(gap, 0.0)))
    return np.where((gap < 0) & np.isfinite(log_q), value, -np.inf)


def _log_privacy_profile(
    epsilon: np.ndarray, null_mean: np.ndarray, null_std: np.ndarray, alt_mean: np.ndarray, alt_std: np.ndarray
) -> np.ndarray:
    """log δ(ε) of the pair: the larger hockey-stick divergence of the two orderings (add vs remove a canary)."""
    return np.maximum(
        _log_hockey_stick(epsilon, null_mean, null_std, alt_mean, alt_std),
        _log_hockey_stick(epsilon, alt_mean, alt_std, null_mean, null_std),
    )


def _check_delta(delta: object) -> float:
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < float(delta) <= 1.0:
        raise ValueError(f"delta must be in (0, 1], got {delta!r}")
    return float(delta)


def _pair_epsilons(
    null_mean: np.ndarray, null_std: np.ndarray, alt_mean: np.ndarray, alt_std: np.ndarray, delta: float
) -> np.ndarray:
    """ε at δ of N(null) vs N(alt), elementwise over broadcast arrays: the root of the decreasing log δ(ε) − log δ,
    bracketed by doubling, then found by Brent's method for a single pair and by vectorised bisection for many
    (the bootstrap), both to float64 resolution.

    A zero std is a point mass: ε = 0 for two identical point masses (or δ = 1), +inf otherwise.
    """
    arrays = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (null_mean, null_std, alt_mean, alt_std)))
    m0, s0, m1, s1 = (np.array(x, dtype=np.float64) for x in arrays)
    if not all(np.isfinite(x).all() for x in (m0, s0, m1, s1)) or (s0 < 0).any() or (s1 < 0).any():
        raise ValueError("means must be finite and standard deviations finite and non-negative")
    result = np.zeros(m0.shape)
    if delta >= 1.0:
        return result
    degenerate = (s0 == 0) | (s1 == 0)
    identical = (m0 == m1) & (s0 == s1)
    result[degenerate & ~identical] = np.inf
    live = ~degenerate & ~identical
    if not live.any():
        return result
    m0, s0, m1, s1 = m0[live], s0[live], m1[live], s1[live]
    log_delta = math.log(delta)

    def excess(epsilon: np.ndarray) -> np.ndarray:
        return np.maximum(_log_privacy_profile(epsilon, m0, s0, m1, s1), _LOG_ZERO) - log_delta

    lo = np.zeros(m0.shape)
    hi = np.ones(m0.shape)
    search = excess(lo) > 0  # elsewhere δ(0) ≤ δ already: ε = 0
    open_ = search & (excess(hi) > 0)
    for _ in range(_MAX_DOUBLINGS):
        if not open_.any():
            break
        lo = np.where(open_, hi, lo)
        hi = np.where(open_, 2.0 * hi, hi)
        open_ = open_ & (excess(hi) > 0)
    solvable = search & ~open_
    if m0.size == 1 and solvable.all():
        # One pair: Brent's method needs ~15 evaluations where bisection needs ~55, and each costs ~1 ms of numpy
        # call overhead. The bracket [lo, hi] has δ(lo) > δ ≥ δ(hi).
        from scipy.optimize import brentq

        root = brentq(lambda e: float(excess(np.full(1, e))[0]), lo[0], hi[0], xtol=1e-15, rtol=1e-15, maxiter=500)
        hi = np.full(1, root)
    else:
        for _ in range(_BISECTIONS):
            if (hi - lo <= 4 * np.finfo(np.float64).eps * hi).all():
                break
            mid = 0.5 * (lo + hi)
            above = excess(mid) > 0
            lo = np.where(above, mid, lo)
            hi = np.where(above, hi, mid)
    eps = np.where(search, hi, 0.0)  # hi: the smallest ε found with δ(ε) ≤ δ
    eps[open_] = np.inf  # δ(2^30) still above δ: no finite ε at this resolution
    result[live] = eps
    return result


def gaussian_pair_delta(null_mean: float, null_std: float, alt_mean: float, alt_std: float, epsilon: float) -> float:
    """The privacy profile δ(ε) of N(null_mean, null_std²) vs N(alt_mean, alt_std²), both orderings.

    δ(ε) = max(H_ε(Q‖P), H_ε(P‖Q)), H_ε(Q‖P) = P_Q[L > ε] − e^ε P_P[L > ε], L = log(dQ/dP): the smallest δ for
    which telling the two apart is (ε, δ)-indistinguishable. Both standard deviations must be positive.
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not 0 <= epsilon < math.inf:
        raise ValueError(f"epsilon must be a non-negative finite number, got {epsilon!r}")
    values = [float(x) for x in (null_mean, null_std, alt_mean, alt_std)]
    if not all(math.isfinite(x) for x in values) or values[1] <= 0 or values[3] <= 0:
        raise ValueError(f"means must be finite and standard deviations positive, got {values}")
    return float(np.exp(_log_privacy_profile(np.float64(epsilon), *map(np.float64, values))))


def gaussian_pair_epsilon(null_mean: float, null_std: float, alt_mean: float, alt_std: float, delta: float) -> float:
    """ε at δ of the pair N(null_mean, null_std²) vs N(alt_mean, alt_std²) (the ε of Andrew et al. §3–4).

    The smallest ε ≥ 0 with :func:`gaussian_pair_delta` ≤ δ, found as the root of log δ(ε) − log δ (δ(ε) is
    non-increasing), to float64 resolution. Unequal variances are exact — the privacy loss is then quadratic and
    unbounded, so ε stays finite only because δ > 0. Equal variances reduce to μ-GDP with μ = |Δmean|/std.
    Symmetric in the two Gaussians, invariant under a common affine map, 0 for identical Gaussians or δ ≥ δ(0).
    """
    delta = _check_delta(delta)
    return float(_pair_epsilons(null_mean, null_std, alt_mean, alt_std, delta)[()])


# ------------------------------------------------------------------------------------------------------------
# One-run ε estimate with a bootstrap interval
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EpsilonEstimate:
    """ε estimate at ``delta`` from two sets of canary statistics, and its percentile-bootstrap interval."""

    epsilon: float
    low: float
    high: float
    null_mean: float
    null_std: float
    inserted_mean: float
    inserted_std: float
    delta: float
    confidence: float
    bootstrap: int


def _statistics(name: str, values: np.ndarray) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size < 2:
        raise ValueError(f"{name} must be a flat array of at least 2 values, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} must be finite")
    return array


def _check_confidence(confidence: object) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real) or not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(confidence)


def estimate_epsilon(
    null_stats: np.ndarray,
    inserted_stats: np.ndarray,
    delta: float,
    *,
    rng: np.random.Generator,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    known_null: tuple[float, float] | None = None,
) -> EpsilonEstimate:
    """Andrew et al.'s ε estimate: one Gaussian fitted to each set of statistics, then the ε at δ of the pair.

    The fits are the sample mean and the sample standard deviation (ddof = 1). The interval is a percentile
    bootstrap: ``bootstrap`` times, each set is resampled with replacement (independently, keeping its size), refit
    and turned into an ε, all resamples at once; ``low``/``high`` are the lower/upper order statistics at
    (1 ∓ confidence)/2. It describes the sampling error of the K canaries, not a guarantee: the estimate is neither
    an upper nor a lower bound on the mechanism's ε. At small δ it is biased upwards for small sets, because any
    sampled mismatch of the two stds reads as a leak in the tails (about +10–15% at δ = 1e-5 with ~1000 canaries
    per set and equal true variances), and the percentile interval inherits that bias. ``bootstrap = 0`` skips
    the interval (low = high = epsilon).
    All randomness comes from ``rng``.

    ``known_null = (mean, std)`` replaces the fitted null by a known one (``null_stats`` are then ignored): the paper's
    analytic N(0, 1/d) for the final-model statistic (§4), exact for a direction drawn independently of the
    model; only the inserted set is fitted and resampled, which removes half of the estimate's sampling noise.
    """
    inserted = _statistics("inserted_stats", inserted_stats)
    null = _statistics("null_stats", null_stats) if known_null is None else np.asarray(known_null, dtype=np.float64)
    delta = _check_delta(delta)
    confidence = _check_confidence(confidence)
    bootstrap = _non_negative_int("bootstrap", bootstrap)
    if known_null is None:
        null_mean, null_std = float(null.mean()), float(null.std(ddof=1))
    else:
        null_mean, null_std = (float(v) for v in known_null)
        if not (math.isfinite(null_mean) and math.isfinite(null_std) and null_std > 0):
            raise ValueError(f"known_null must be a finite (mean, std > 0), got {known_null}")
    inserted_mean, inserted_std = float(inserted.mean()), float(inserted.std(ddof=1))
    epsilon = float(_pair_epsilons(null_mean, null_std, inserted_mean, inserted_std, delta)[()])
    low = high = epsilon
    if bootstrap > 0:
        if known_null is None:
            null_draws = null[rng.integers(0, null.size, size=(bootstrap, null.size))]
            null_means, null_stds = null_draws.mean(axis=1), null_draws.std(axis=1, ddof=1)
        else:
            null_means, null_stds = np.full(bootstrap, null_mean), np.full(bootstrap, null_std)
        inserted_draws = inserted[rng.integers(0, inserted.size, size=(bootstrap, inserted.size))]
        replicas = _pair_epsilons(
            null_means,
            null_stds,
            inserted_draws.mean(axis=1),
            inserted_draws.std(axis=1, ddof=1),
            delta,
        )
        tail = (1.0 - confidence) / 2.0
        # Order statistics rather than interpolation: replicas can be +inf (a resample of identical values).
        low = float(np.quantile(replicas, tail, method="lower"))
        high = float(np.quantile(replicas, 1.0 - tail, method="higher"))
    return EpsilonEstimate(
        epsilon=epsilon,
        low=low,
        high=high,
        null_mean=null_mean,
        null_std=null_std,
        inserted_mean=inserted_mean,
        inserted_std=inserted_std,
        delta=delta,
        confidence=confidence,
        bootstrap=bootstrap,
    )


# ------------------------------------------------------------------------------------------------------------
# One-run lower bound (Steinke, Nasr & Jagielski)
# ------------------------------------------------------------------------------------------------------------


def _check_rule(rule: object) -> GuessRule:
    if rule not in GUESS_RULES:
        raise ValueError(f"rule must be one of {GUESS_RULES}, got {rule!r}")
    return rule  # type: ignore[return-value]


def _split_guesses(count: int, rule: GuessRule) -> tuple[int, int]:
    """(guesses "inserted" on the highest scores, guesses "not inserted" on the lowest) of ``count`` guesses."""
    if rule == "one_sided":
        return count, 0
    return (count + 1) // 2, count // 2


@dataclass(frozen=True)
class LowerBound:
    """A statistically valid lower bound on ε: unless an event of probability ≤ 1 − ``confidence`` (over the
    canaries' random insertion and the mechanism's noise) occurred, the mechanism is not (ε', delta)-DP for any
    ε' ≤ ``epsilon`` (when ``epsilon`` > 0).

    ``guesses``/``correct`` are r and v of the guess count that certified ``epsilon`` (``positive_guesses`` of them
    "inserted" on the highest scores, ``negative_guesses`` "not inserted" on the lowest); ``tried`` lists every
    guess count tested, each at ``significance`` = (1 − confidence)/len(tried) (Bonferroni).
    """

    epsilon: float
    guesses: int
    correct: int
    positive_guesses: int
    negative_guesses: int
    canaries: int
    delta: float
    confidence: float
    tried: tuple[int, ...]
    significance: float
    rule: GuessRule = "two_sided"


def one_run_p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """p-value of ``correct`` or more right guesses out of ``guesses`` if the mechanism were (ε, δ)-DP.

    Steinke, Nasr & Jagielski (approximate-DP theorem; Appendix D code): with m = ``canaries`` each included
    independently with probability 1/2, r = ``guesses``, v = ``correct``, q = e^ε/(1 + e^ε),

        p = P[Binomial(r, q) ≥ v] + 2mδ · max_{1≤i≤v} P[v − i ≤ Binomial(r, q) < v] / i,

    capped at 1. For δ = 0 this is the pure-DP binomial tail.
    """
    m = _non_negative_int("canaries", canaries)
    r = _non_negative_int("guesses", guesses)
    v = _non_negative_int("correct", correct)
    if not v <= r <= m:
        raise ValueError(f"need correct <= guesses <= canaries, got {v}, {r}, {m}")
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not epsilon >= 0:
        raise ValueError(f"epsilon must be non-negative, got {epsilon!r}")
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    from scipy.special import expit
    from scipy.stats import binom

    q = float(expit(epsilon))
    tail = float(binom.sf(v - 1, r, q))
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    below = np.cumsum(binom.pmf(np.arange(v - 1, -1, -1), r, q))  # below[i-1] = P[v − i ≤ Bin < v]
    alpha = float(np.max(below / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def _certified_epsilon(canaries: int, guesses: int, correct: int, delta: float, significance: float) -> float:
    """The largest ε (to ~1e-12) whose p-value is below ``significance``; 0 if not even ε = 0 is rejected.

    Bisection keeps p(lo) < significance ≤ p(hi), so the returned lo is always itself a rejected hypothesis —
    the bound is valid whether or not p is monotone in ε.
    """
    if one_run_p_value(canaries, guesses, correct, 0.0, delta) >= significance:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(canaries, guesses, correct, hi, delta) < significance:
        lo, hi = hi, 2.0 * hi  # terminates: at ε ≳ 37, q rounds to 1 and p = 1
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if one_run_p_value(canaries, guesses, correct, mid, delta) < significance:
            lo = mid
        else:
            hi = mid
    return lo


def default_guess_counts(canaries: int) -> tuple[int, ...]:
    """The guess counts tried by default: m, m/2, m/4, … (halving, rounded down) while ≥ 10, at least one.

    A geometric grid covers both regimes — a strong signal certifies most with many guesses, a weak one only on
    the few most extreme scores — at a Bonferroni price of about log₂(m/10) + 1 tests.
    """
    m = _non_negative_int("canaries", canaries)
    counts = [m]
    while counts[-1] // 2 >= 10:
        counts.append(counts[-1] // 2)
    return tuple(count for count in counts if count > 0)


def _guess_counts(canaries: int, guesses: Sequence[int] | None) -> tuple[int, ...]:
    """The distinct guess counts to try (default :func:`default_guess_counts`), each checked to be in [1, m]."""
    counts = default_guess_counts(canaries) if guesses is None else tuple(dict.fromkeys(guesses))
    for count in counts:
        if _non_negative_int("guess count", count) == 0 or count > canaries:
            raise ValueError(f"guess counts must be in [1, {canaries}], got {count!r}")
    if not counts:
        raise ValueError("guesses must name at least one guess count")
    return counts


def certifiable_epsilon(
    canaries: int,
    delta: float,
    confidence: float = 0.95,
    *,
    guesses: Sequence[int] | None = None,
    rule: GuessRule = "two_sided",
) -> float:
    """The ceiling of :func:`one_run_lower_bound` with m = ``canaries``: the ε it certifies when every guess is right.

    Steinke, Nasr & Jagielski's bound depends on the scores only through the number v of right guesses out of
    each count r tried; with perfect separation (the ⌈m/2⌉ inserted canaries all score above the ⌊m/2⌋ others)
    every two-sided count gets v = r (a one-sided count v = min(r, ⌈m/2⌉): past the inserted canaries its guesses
    are wrong), and the result is max_r of the largest ε whose p-value (:func:`one_run_p_value`) is below
    (1 − confidence)/n, n the number of counts (``guesses``, default :func:`default_guess_counts`).
    This is what the audit can certify at best with m canaries, δ and that confidence, however strong the signal:
    a bound can only show that the accountant's ε is violated where this ceiling is above it. At δ = 0 it is
    logit(((1 − confidence)/n)^(1/m)), growing like log m. It shrinks as δ grows, through the p-value's 2mδ term —
    at a *fixed* δ, more canaries eventually certify less (m = 50,000 at δ = 1e-3 certifies nothing) — so δ must
    shrink like 1/m for the ceiling to keep growing, as the audit's default δ_LB = min(δ, 0.01/m) does
    (2mδ ≤ 0.02): 3.05, 4.57, 5.89, 7.44, 8.98 at m = 100, 500, 2000, 10⁴, 5·10⁴.

    It is exactly ``one_run_lower_bound(scores, inserted, delta, confidence=confidence, guesses=guesses,
    rule=rule).epsilon`` for perfectly separated scores with ⌈m/2⌉ inserted; it does not look at any scores and costs
    one bisection per guess count (~1 s at m = 50,000 with the default counts).

    Perfect separation needs every inserted canary to leave a trace. One that was inserted but never joined a
    round (a fraction (1 − q)^T of them when each round samples canaries at rate q: 28% at q = 0.1, T = 12) is
    indistinguishable from a never-inserted one under any mechanism, so the "not inserted" guesses on the lowest
    scores are wrong for some of them and the bound a two-sided run can reach is lower than this ceiling; the
    one-sided rule does not guess on the lowest scores and keeps it up to the number of canaries that joined
    (bench/audit_power_k.py simulates that case).
    """
    m = _non_negative_int("canaries", canaries)
    if m == 0:
        raise ValueError("certifiable_epsilon needs at least one canary")
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    confidence = _check_confidence(confidence)
    rule = _check_rule(rule)
    counts = _guess_counts(m, guesses)
    significance = (1.0 - float(confidence)) / len(counts)
    inserted = (m + 1) // 2
    certified = []
    for count in counts:
        positive, negative = _split_guesses(int(count), rule)
        right = min(positive, inserted) + min(negative, m - inserted)
        certified.append(_certified_epsilon(m, int(count), right, float(delta), significance))
    return max(certified)


def one_run_lower_bound(
    scores: np.ndarray,
    inserted: np.ndarray,
    delta: float,
    *,
    confidence: float = 0.95,
    guesses: Sequence[int] | None = None,
    rule: GuessRule = "two_sided",
) -> LowerBound:
    """Steinke, Nasr & Jagielski's one-run lower bound on ε at ``delta`` from canary scores.

    Higher score means "inserted". For each guess count r the auditor guesses "inserted" on the ⌈r/2⌉ highest
    scores and "not inserted" on the ⌊r/2⌋ lowest (``rule="two_sided"``), or "inserted" on the r highest
    (``rule="one_sided"``), and abstains on the rest; v counts the right guesses and :func:`one_run_p_value`
    tests (ε, δ)-DP. Every count in ``guesses`` (default
    :func:`default_guess_counts`) is tested at significance (1 − confidence)/n, n the number of distinct counts
    (Bonferroni), and the largest certified ε is returned, so the result is a valid lower bound with probability
    ≥ ``confidence``. 0.0 means nothing could be certified.

    Validity needs what the theorem assumes: each canary was inserted independently with probability 1/2 (m, the
    number of scores, is the number of such canaries, all of them, not only the inserted ones), and the scores
    are computed from the released models without looking at who was inserted. Ties in the scores are broken
    by canary position, which does not depend on the insertion either.
    """
    score = np.asarray(scores, dtype=np.float64)
    truth = np.asarray(inserted)
    if score.ndim != 1 or score.size == 0:
        raise ValueError(f"scores must be a non-empty flat array, got shape {score.shape}")
    if not np.isfinite(score).all():
        raise ValueError("scores must be finite")
    if truth.shape != score.shape or truth.dtype != np.bool_:
        raise ValueError(f"inserted must be a bool array of shape {score.shape}, got {truth.dtype} {truth.shape}")
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    confidence = _check_confidence(confidence)
    rule = _check_rule(rule)
    m = score.size
    counts = _guess_counts(m, guesses)
    significance = (1.0 - float(confidence)) / len(counts)

    order = np.argsort(score, kind="stable")  # ascending; stable: ties keep canary order
    ranked = truth[order]
    # correct_low[k] = right "not inserted" guesses among the k lowest; correct_high[k] = right "inserted" among
    # the k highest.
    correct_low = np.concatenate([[0], np.cumsum(~ranked)])
    correct_high = np.concatenate([[0], np.cumsum(ranked[::-1])])

    best: tuple[float, int, int, int, int] | None = None
    for count in counts:
        positive, negative = _split_guesses(int(count), rule)
        right = int(correct_high[positive] + correct_low[negative])
        epsilon = _certified_epsilon(m, int(count), right, float(delta), significance)
        if best is None or epsilon > best[0]:
            best = (epsilon, int(count), right, positive, negative)
    assert best is not None
    epsilon, count, right, positive, negative = best
    return LowerBound(
        epsilon=epsilon,
        guesses=count,
        correct=right,
        positive_guesses=positive,
        negative_guesses=negative,
        canaries=m,
        delta=float(delta),
        confidence=float(confidence),
        tried=tuple(int(c) for c in counts),
        significance=significance,
        rule=rule,
    )
