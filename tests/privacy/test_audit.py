"""Tests for fl_app/privacy/audit/: canary directions and dot products, the test statistics and ε estimate of
Andrew et al. (ICLR 2024, arXiv 2302.03098) and the one-run lower bound of Steinke, Nasr & Jagielski (NeurIPS 2023,
arXiv 2305.08846).

Reference values are computed here independently of the module: the Gaussian-DP profile from scipy.stats.norm and
a root finder, the unequal-variance privacy profile by numerical integration of max(0, q − e^ε p), the pure-DP
bound from scipy.stats.binom, and the approximate-DP p-value from a plain loop transcription of the theorem.
End to end, the audit runs on the bare Gaussian mechanism (released vector = Σ inserted canaries + N(0, σ² I)),
whose ε is known in closed form.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import binom, chisquare, norm

from fl_app.privacy.audit import (
    AUDIT_STREAM,
    SPARSE_CANARY_KEY,
    EpsilonEstimate,
    all_iterates_statistics,
    canary_direction,
    canary_dots,
    certifiable_epsilon,
    default_guess_counts,
    estimate_epsilon,
    final_model_statistics,
    gaussian_pair_delta,
    gaussian_pair_epsilon,
    one_run_lower_bound,
    one_run_p_value,
    sparse_canary_direction,
    to_dense,
)
from fl_app.privacy.mechanisms import make_rng

SEED = 12345


# ------------------------------------------------------------------------------------------------------------
# Independent references
# ------------------------------------------------------------------------------------------------------------


def gdp_delta(mu: float, eps: float) -> float:
    """Gaussian-DP privacy profile (Dong, Roth & Su): δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)."""
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


def gdp_epsilon(mu: float, delta: float) -> float:
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    return float(brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, 200.0, xtol=1e-14, rtol=1e-14))


def integrated_delta(m0: float, s0: float, m1: float, s1: float, eps: float) -> float:
    """max over both orderings of ∫ max(0, q − e^ε p) dy, by the trapezoid rule on a fine grid."""
    lo = min(m0 - 40 * s0, m1 - 40 * s1)
    hi = max(m0 + 40 * s0, m1 + 40 * s1)
    y = np.linspace(lo, hi, 2_000_001)
    p, q = norm.pdf(y, m0, s0), norm.pdf(y, m1, s1)
    return max(
        float(np.trapezoid(np.maximum(0.0, q - math.exp(eps) * p), y)),
        float(np.trapezoid(np.maximum(0.0, p - math.exp(eps) * q), y)),
    )


def loop_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """The approximate-DP p-value as a plain loop: P[Bin(r,q) ≥ v] + 2mδ max_i P[v−i ≤ Bin(r,q) < v]/i."""
    q = math.exp(eps) / (1 + math.exp(eps))
    tail = sum(binom.pmf(k, r, q) for k in range(v, r + 1))
    alpha = 0.0
    for i in range(1, v + 1):
        alpha = max(alpha, sum(binom.pmf(k, r, q) for k in range(v - i, v)) / i)
    return min(1.0, tail + 2 * m * delta * alpha)


# ------------------------------------------------------------------------------------------------------------
# Canary directions and dot products
# ------------------------------------------------------------------------------------------------------------


def test_canary_direction_is_a_deterministic_float32_unit_vector_from_the_audit_stream() -> None:
    assert AUDIT_STREAM == 9_001
    u = canary_direction(SEED, 3, 50_000)
    assert u.dtype == np.float32 and u.shape == (50_000,)
    assert abs(float(np.linalg.norm(u.astype(np.float64))) - 1.0) < 1e-6
    assert np.array_equal(u, canary_direction(SEED, 3, 50_000))
    # Pins the stream: float32 standard normals from make_rng(seed, AUDIT_STREAM, index), normalised in float64.
    draws = make_rng(SEED, AUDIT_STREAM, 3).standard_normal(50_000, dtype=np.float32).astype(np.float64)
    assert np.array_equal(u, (draws / np.linalg.norm(draws)).astype(np.float32))
    # Different index or seed: a different, nearly orthogonal direction (|cos| ~ 1/√d ≈ 0.0045).
    for other in (canary_direction(SEED, 4, 50_000), canary_direction(SEED + 1, 3, 50_000)):
        assert abs(float(np.dot(u.astype(np.float64), other))) < 0.03
    with pytest.raises(ValueError):
        canary_direction(SEED, -1, 10)
    with pytest.raises(ValueError):
        canary_direction(SEED, 0, 0)


def test_canary_dots_matches_a_direct_dot_product() -> None:
    d = 30_000
    rng = np.random.default_rng(0)
    vectors = [rng.standard_normal(d).astype(np.float32) * scale for scale in (1.0, 1e-3, 50.0)]
    vectors[1] += 1e-3  # a common offset: the float32 product must not lose it to cancellation
    indices = [0, 7, 3, 7]
    dots = canary_dots(SEED, indices, vectors)
    assert dots.shape == (4, 3) and dots.dtype == np.float64
    for row, index in enumerate(indices):
        u = canary_direction(SEED, index, d).astype(np.float64)
        for col, vector in enumerate(vectors):
            exact = float(np.dot(u, vector.astype(np.float64)))
            # Relative to the null spread ‖v‖/√d of such a dot product.
            assert abs(dots[row, col] - exact) < 1e-5 * float(np.linalg.norm(vector)) / math.sqrt(d)
    assert canary_dots(SEED, [], vectors).shape == (0, 3)
    assert canary_dots(SEED, [1, 2], []).shape == (2, 0)
    with pytest.raises(ValueError):
        canary_dots(SEED, [0], [np.zeros(5, np.float32), np.zeros(6, np.float32)])
    with pytest.raises(ValueError):
        canary_dots(SEED, [0], [np.zeros((2, 3), np.float32)])


def test_dense_canary_dots_are_unchanged_by_the_sparse_option() -> None:
    """``support=None`` is the dense path, bit for bit: float32 canary times the float32 (d, r) matrix."""
    d = 20_000
    rng = np.random.default_rng(4)
    vectors = [rng.standard_normal(d).astype(np.float32) for _ in range(2)]
    matrix = np.stack(vectors, axis=1)
    dots = canary_dots(SEED, [5, 0], vectors)
    assert np.array_equal(dots, canary_dots(SEED, [5, 0], vectors, support=None))
    for row, index in enumerate([5, 0]):
        assert np.array_equal(dots[row], (canary_direction(SEED, index, d) @ matrix).astype(np.float64))


# Sparse canaries: a reference transcription of the sampling rule, with a Python set.


def reference_sparse_direction(seed: int, index: int, size: int, support: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw integers in batches of the number still missing until ``support`` distinct ones are held (sparse
    case), or numpy's sampling without replacement (2·support > size); then float32 normals, normalised in float64."""
    rng = make_rng(seed, AUDIT_STREAM, index, SPARSE_CANARY_KEY)
    if 2 * support > size:
        chosen = set(rng.choice(size, support, replace=False, shuffle=False).tolist())
    else:
        chosen = set()
        while len(chosen) < support:
            chosen.update(rng.integers(0, size, support - len(chosen), dtype=np.int64).tolist())
    draws = rng.standard_normal(support, dtype=np.float32).astype(np.float64)
    return np.array(sorted(chosen), dtype=np.int64), (draws / np.linalg.norm(draws)).astype(np.float32)


@pytest.mark.parametrize(("size", "support"), [(50_000, 300), (100, 50), (100, 80), (7, 7), (10, 1)])
def test_sparse_canary_direction_is_a_deterministic_unit_vector_on_support_distinct_coordinates(
    size: int, support: int
) -> None:
    indices, values = sparse_canary_direction(SEED, 3, size, support)
    assert indices.dtype == np.int64 and values.dtype == np.float32
    assert indices.shape == values.shape == (support,)
    assert np.all(np.diff(indices) > 0) and indices[0] >= 0 and indices[-1] < size  # sorted, distinct, in range
    assert abs(float(np.linalg.norm(values.astype(np.float64))) - 1.0) < 1e-6
    again = sparse_canary_direction(SEED, 3, size, support)
    assert np.array_equal(indices, again[0]) and np.array_equal(values, again[1])
    # Pins the stream and the sampling rule ((100, 50) always repeats draws: the rejection loop runs).
    reference = reference_sparse_direction(SEED, 3, size, support)
    assert np.array_equal(indices, reference[0]) and np.array_equal(values, reference[1])
    if support == size:
        assert np.array_equal(indices, np.arange(size))


def test_sparse_canaries_differ_across_indices_seeds_and_from_the_dense_canary() -> None:
    size, support = 50_000, 300
    indices, values = sparse_canary_direction(SEED, 3, size, support)
    for other_indices, _ in (
        sparse_canary_direction(SEED, 4, size, support),
        sparse_canary_direction(SEED + 1, 3, size, support),
    ):
        # Two random 300-subsets of 50,000 share ~1.8 coordinates.
        assert np.intersect1d(indices, other_indices).size < 15
    # The sparse stream is not the dense one: SeedSequence ignores a trailing 0 (which would replay the dense
    # canary's draws), not the non-zero key word.
    assert SPARSE_CANARY_KEY != 0
    dense_draws = make_rng(SEED, AUDIT_STREAM, 3).standard_normal(support, dtype=np.float32)
    assert np.array_equal(make_rng(SEED, AUDIT_STREAM, 3, 0).standard_normal(support, dtype=np.float32), dense_draws)
    leading = (dense_draws / np.linalg.norm(dense_draws.astype(np.float64))).astype(np.float32)
    assert not np.allclose(values, leading) and abs(float(np.dot(values, leading))) < 0.3
    dense = canary_direction(SEED, 3, size)
    assert abs(float(np.dot(values.astype(np.float64), dense[indices]))) < 0.05  # ~N(0, 1/d): unrelated
    for bad in ((SEED, 3, size, 0), (SEED, 3, 10, 11), (SEED, -1, 10, 2), (SEED, 3, 10, 2.0), (SEED, 3, 10, True)):
        with pytest.raises(ValueError):
            sparse_canary_direction(*bad)  # type: ignore[arg-type]


def test_sparse_coordinates_are_uniform() -> None:
    """Every coordinate equally likely (chi-square), in the rejection regime that always repeats draws."""
    size, support, canaries = 100, 50, 4_000
    counts = np.zeros(size)
    for index in range(canaries):
        counts[sparse_canary_direction(SEED, index, size, support)[0]] += 1
    assert counts.sum() == canaries * support
    assert chisquare(counts).pvalue > 1e-4
    # And a coordinate's value is symmetric around 0: the sign of the first value is a fair coin.
    signs = [sparse_canary_direction(SEED, index, size, support)[1][0] > 0 for index in range(1_000)]
    assert 430 < sum(signs) < 570


def test_to_dense_places_the_values_and_nothing_else() -> None:
    indices, values = sparse_canary_direction(SEED, 2, 1_000, 40)
    dense = to_dense(indices, values, 1_000)
    assert dense.dtype == np.float32 and dense.shape == (1_000,)
    assert np.array_equal(dense[indices], values) and np.count_nonzero(dense) == 40
    assert abs(float(np.linalg.norm(dense.astype(np.float64))) - 1.0) < 1e-6
    assert np.array_equal(to_dense(np.array([], np.int64), np.array([], np.float32), 3), np.zeros(3, np.float32))
    with pytest.raises(ValueError):
        to_dense(np.array([0, 3]), np.array([1.0, 2.0]), 3)  # out of range
    with pytest.raises(ValueError):
        to_dense(np.array([1, 1]), np.array([1.0, 2.0]), 3)  # repeated
    with pytest.raises(ValueError):
        to_dense(np.array([-1]), np.array([1.0]), 3)
    with pytest.raises(ValueError):
        to_dense(np.array([0, 1]), np.array([1.0]), 3)
    with pytest.raises(TypeError):
        to_dense(np.array([0.0]), np.array([1.0]), 3)


def test_sparse_canary_dots_match_the_densified_direction() -> None:
    d, support = 30_000, 500
    rng = np.random.default_rng(0)
    vectors = [rng.standard_normal(d).astype(np.float32) * scale for scale in (1.0, 1e-3, 50.0)]
    vectors[1] += 1e-3
    indices = [0, 7, 3, 7]
    dots = canary_dots(SEED, indices, vectors, support=support)
    assert dots.shape == (4, 3) and dots.dtype == np.float64
    for row, index in enumerate(indices):
        u = to_dense(*sparse_canary_direction(SEED, index, d, support), d).astype(np.float64)
        for col, vector in enumerate(vectors):
            exact = float(np.dot(u, vector.astype(np.float64)))
            assert abs(dots[row, col] - exact) < 1e-5 * float(np.linalg.norm(vector)) / math.sqrt(d)
    # Not the dense canaries' dot products.
    assert not np.allclose(dots, canary_dots(SEED, indices, vectors), rtol=0.1)
    assert canary_dots(SEED, [], vectors, support=support).shape == (0, 3)
    assert canary_dots(SEED, [1, 2], [], support=support).shape == (2, 0)
    # support = d: every coordinate, still the sparse stream.
    full = canary_dots(SEED, [1], vectors[:1], support=d)
    assert full[0, 0] == pytest.approx(
        float(to_dense(*sparse_canary_direction(SEED, 1, d, d), d) @ vectors[0]), rel=1e-4
    )
    for bad in (0, d + 1, -1, 2.5, True):
        with pytest.raises(ValueError):
            canary_dots(SEED, [0], vectors, support=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        canary_dots(SEED, [0], [np.zeros(5, np.float32), np.zeros(6, np.float32)], support=2)


def test_a_sparse_canary_of_support_1000_at_paper_cnn_size_costs_under_a_fiftieth_of_a_dense_one() -> None:
    """O(support), not O(size): timed side by side with the dense canary, in this process, best of three.

    Measured on the 2-core development machine: ~0.1 ms a sparse canary (10,000 in ~1 s) against ~25 ms a dense
    one, a ratio of ~250; any step linear in d = 1,663,370 (even one np.zeros(d)) would bring it under 50. The
    ratio, not a wall-clock bound, is asserted: a shared CI machine slows both sides alike.
    """
    size, support, sparse_count, dense_count = 1_663_370, 1_000, 1_000, 10

    def seconds_each(draw: object, count: int) -> float:
        start = time.perf_counter()
        for index in range(count):
            draw(index)  # type: ignore[operator]
        return (time.perf_counter() - start) / count

    sparse, dense = [], []
    for _ in range(3):  # interleaved, so that a busy moment slows both
        sparse.append(seconds_each(lambda i: sparse_canary_direction(SEED, i, size, support), sparse_count))
        dense.append(seconds_each(lambda i: canary_direction(SEED, i, size), dense_count))
    ratio = min(dense) / min(sparse)
    print(f"sparse {min(sparse) * 1e3:.3f} ms, dense {min(dense) * 1e3:.1f} ms a canary: {ratio:.0f}x")
    assert ratio > 50


# ------------------------------------------------------------------------------------------------------------
# Test statistics
# ------------------------------------------------------------------------------------------------------------


def test_final_model_statistic_is_the_cosine_with_the_summed_deltas() -> None:
    dots = np.array([[1.0, 4.0], [3.0, -2.0]])
    assert final_model_statistics(dots, 5.0) == pytest.approx([1.0, 0.2])
    # Against an explicit cosine: the deltas' dot products sum to the dot product with w_T − w_0.
    rng = np.random.default_rng(1)
    deltas = [rng.standard_normal(2_000).astype(np.float32) for _ in range(3)]
    total = np.sum([delta.astype(np.float64) for delta in deltas], axis=0)
    cos = final_model_statistics(canary_dots(SEED, [0, 1], deltas), float(np.linalg.norm(total)))
    for i in (0, 1):
        u = canary_direction(SEED, i, 2_000).astype(np.float64)
        assert cos[i] == pytest.approx(float(u @ total) / float(np.linalg.norm(total)), abs=1e-7)
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            final_model_statistics(dots, bad)


def test_all_iterates_statistic_is_the_max_over_rounds_of_the_per_round_cosine() -> None:
    dots = np.array([[1.0, 4.0], [3.0, -2.0]])
    # Per-round cosines [[0.5, 1.0], [1.5, -0.5]].
    assert all_iterates_statistics(dots, np.array([2.0, 4.0])) == pytest.approx([1.0, 1.5])
    with pytest.raises(ValueError):
        all_iterates_statistics(dots, np.array([2.0, 0.0]))
    with pytest.raises(ValueError):
        all_iterates_statistics(dots, np.array([2.0]))
    with pytest.raises(ValueError):
        all_iterates_statistics(np.array([[1.0, math.nan]]), np.array([1.0, 1.0]))


# ------------------------------------------------------------------------------------------------------------
# ε of a pair of Gaussians
# ------------------------------------------------------------------------------------------------------------

# (μ, δ, ε) with ε = the Gaussian-DP ε, pinned to 1e-12 relative (also fl_app.privacy.fdp.gdp_to_epsilon's value).
GDP_POINTS = [
    (0.5, 1e-5, 1.9930914044151213),
    (1.0, 1e-5, 4.377178095681223),
    (2.0, 1e-3, 7.581279924570119),
    (0.3, 1e-2, 0.4623130206304835),
]


@pytest.mark.parametrize(("mu", "delta", "pinned"), GDP_POINTS)
def test_equal_variances_give_the_gaussian_dp_epsilon(mu: float, delta: float, pinned: float) -> None:
    reference = gdp_epsilon(mu, delta)
    assert reference == pytest.approx(pinned, rel=1e-10)
    # Any common location and scale: only μ = |Δmean|/std matters.
    for mean, std in ((0.0, 1.0), (3.0, 2.0), (-1e-3, 1e-4)):
        assert gaussian_pair_epsilon(mean, std, mean + mu * std, std, delta) == pytest.approx(reference, rel=1e-9)
    # Nearly equal variances take the quadratic path and must agree with the linear one.
    assert gaussian_pair_epsilon(0.0, 1.0, mu, 1.0 + 1e-12, delta) == pytest.approx(reference, rel=1e-8)
    assert gaussian_pair_delta(0.0, 1.0, mu, 1.0, reference) == pytest.approx(delta, rel=1e-9)


@pytest.mark.parametrize(("m1", "s1", "delta"), [(1.0, 1.3, 1e-3), (0.5, 0.8, 1e-5), (0.0, 1.5, 1e-3)])
def test_unequal_variances_solve_the_integrated_privacy_profile(m1: float, s1: float, delta: float) -> None:
    eps = gaussian_pair_epsilon(0.0, 1.0, m1, s1, delta)
    assert eps > 0
    assert integrated_delta(0.0, 1.0, m1, s1, eps) == pytest.approx(delta, rel=1e-4)
    assert gaussian_pair_delta(0.0, 1.0, m1, s1, 0.5 * eps) == pytest.approx(
        integrated_delta(0.0, 1.0, m1, s1, 0.5 * eps), rel=1e-4
    )
    # Unequal variances leak more than the equal-variance pair with the same mean gap.
    assert eps > gaussian_pair_epsilon(0.0, 1.0, m1, 1.0, delta)


def test_pair_epsilon_is_symmetric_zero_for_identical_and_increasing_in_the_gap() -> None:
    for args in ((0.0, 1.0, 0.7, 1.0), (0.0, 1.0, 0.7, 1.2), (2.0, 0.5, -1.0, 0.3)):
        m0, s0, m1, s1 = args
        assert gaussian_pair_epsilon(m0, s0, m1, s1, 1e-5) == pytest.approx(
            gaussian_pair_epsilon(m1, s1, m0, s0, 1e-5), rel=1e-12
        )
    assert gaussian_pair_epsilon(0.3, 2.0, 0.3, 2.0, 1e-5) == 0.0
    assert gaussian_pair_epsilon(0.0, 1.0, 1e-7, 1.0, 1e-5) == 0.0  # δ(0) = 2Φ(μ/2) − 1 < δ
    gaps = np.linspace(0.05, 3.0, 12)
    for s1 in (1.0, 1.1):
        eps = [gaussian_pair_epsilon(0.0, 1.0, gap, s1, 1e-5) for gap in gaps]
        assert np.all(np.diff(eps) > 0)
    assert gaussian_pair_epsilon(0.0, 0.0, 1.0, 1.0, 1e-5) == math.inf
    with pytest.raises(ValueError):
        gaussian_pair_epsilon(0.0, -1.0, 1.0, 1.0, 1e-5)
    for bad in (0.0, 1.5, math.nan):
        with pytest.raises(ValueError):
            gaussian_pair_epsilon(0.0, 1.0, 1.0, 1.0, bad)


# ------------------------------------------------------------------------------------------------------------
# ε estimate
# ------------------------------------------------------------------------------------------------------------


def test_estimate_epsilon_fits_each_set_and_bootstraps_with_the_given_generator_only() -> None:
    data = np.random.default_rng(3)
    null, inserted = data.normal(0.0, 1.0, 800), data.normal(0.8, 1.1, 700)
    global_state = np.random.get_state()
    first = estimate_epsilon(null, inserted, 1e-5, rng=np.random.default_rng(7), bootstrap=300)
    assert np.random.get_state()[1].tolist() == global_state[1].tolist()
    assert isinstance(first, EpsilonEstimate)
    assert first == estimate_epsilon(null, inserted, 1e-5, rng=np.random.default_rng(7), bootstrap=300)
    assert first.null_mean == pytest.approx(null.mean()) and first.null_std == pytest.approx(null.std(ddof=1))
    assert first.inserted_mean == pytest.approx(inserted.mean())
    assert first.inserted_std == pytest.approx(inserted.std(ddof=1))
    assert first.epsilon == gaussian_pair_epsilon(
        first.null_mean, first.null_std, first.inserted_mean, first.inserted_std, 1e-5
    )
    assert first.low < first.epsilon < first.high
    wider = estimate_epsilon(null, inserted, 1e-5, rng=np.random.default_rng(7), bootstrap=300, confidence=0.99)
    assert wider.low <= first.low and wider.high >= first.high
    bare = estimate_epsilon(null, inserted, 1e-5, rng=np.random.default_rng(7), bootstrap=0)
    assert bare.low == bare.epsilon == bare.high == first.epsilon
    with pytest.raises(ValueError):
        estimate_epsilon(null[:1], inserted, 1e-5, rng=np.random.default_rng(7))


# ------------------------------------------------------------------------------------------------------------
# One-run lower bound
# ------------------------------------------------------------------------------------------------------------


def _separated(m: int) -> tuple[np.ndarray, np.ndarray]:
    inserted = np.arange(m) % 2 == 0
    return inserted + 1e-3 * np.arange(m), inserted


@pytest.mark.parametrize("r", [20, 100, 200])
def test_all_correct_guesses_give_the_pure_dp_binomial_bound(r: int) -> None:
    scores, inserted = _separated(200)
    bound = one_run_lower_bound(scores, inserted, 0.0, guesses=[r])
    assert (bound.guesses, bound.correct, bound.positive_guesses, bound.negative_guesses) == (r, r, r // 2, r // 2)
    # P[Binomial(r, q) ≥ r] = q^r = 0.05 at the bound: ε = log(q/(1 − q)).
    q = brentq(lambda x: binom.sf(r - 1, r, x) - 0.05, 0.5, 1 - 1e-15, xtol=1e-15)
    assert bound.epsilon == pytest.approx(math.log(q / (1 - q)), abs=1e-9)


def test_pinned_pure_dp_value() -> None:
    scores, inserted = _separated(200)
    # logit(0.05^(1/100)).
    assert one_run_lower_bound(scores, inserted, 0.0, guesses=[100]).epsilon == pytest.approx(3.4929654311, abs=1e-9)


@pytest.mark.parametrize(("m", "r", "v", "eps", "delta"), [(200, 100, 90, 1.0, 1e-3), (1000, 40, 35, 0.5, 1e-4)])
def test_p_value_matches_the_approximate_dp_theorem(m: int, r: int, v: int, eps: float, delta: float) -> None:
    assert one_run_p_value(m, r, v, eps, delta) == pytest.approx(loop_p_value(m, r, v, eps, delta), rel=1e-10)
    assert one_run_p_value(m, r, v, eps, 0.0) == pytest.approx(binom.sf(v - 1, r, 1 / (1 + math.exp(-eps))))


def test_delta_and_extra_guess_counts_only_lower_the_bound() -> None:
    scores, inserted = _separated(200)
    pure = one_run_lower_bound(scores, inserted, 0.0, guesses=[100]).epsilon
    approx = one_run_lower_bound(scores, inserted, 1e-3, guesses=[100])
    assert 0 < approx.epsilon < pure
    # The certified ε is rejected at its significance: p-value just below (1 − confidence).
    assert one_run_p_value(200, 100, 100, approx.epsilon, 1e-3) < 0.05
    assert one_run_p_value(200, 100, 100, approx.epsilon + 1e-6, 1e-3) >= 0.05
    # Bonferroni: three counts are each tested at 0.05/3.
    several = one_run_lower_bound(scores, inserted, 1e-3, guesses=[100, 50, 20])
    assert several.tried == (100, 50, 20) and several.significance == pytest.approx(0.05 / 3)
    alone = one_run_lower_bound(scores, inserted, 1e-3, guesses=[100], confidence=1 - 0.05 / 3)
    assert several.epsilon == alone.epsilon < approx.epsilon


def test_guesses_take_the_highest_and_lowest_scores_and_abstain_in_between() -> None:
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    inserted = np.array([True, False, True, False, False, True])
    bound = one_run_lower_bound(scores, inserted, 0.0, guesses=[4])
    # "in" on 5 (right) and 4 (wrong); "out" on 1 (right) and 0 (wrong).
    assert (bound.correct, bound.epsilon) == (2, 0.0)
    assert one_run_lower_bound(scores, inserted, 0.0, guesses=[1]).correct == 1
    assert default_guess_counts(1000) == (1000, 500, 250, 125, 62, 31, 15)
    assert default_guess_counts(5) == (5,)
    with pytest.raises(ValueError):
        one_run_lower_bound(scores, inserted.astype(int), 0.0)
    with pytest.raises(ValueError):
        one_run_lower_bound(scores, inserted, 0.0, guesses=[7])


def test_random_scores_certify_nothing_in_most_seeds() -> None:
    bounds = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        bounds.append(one_run_lower_bound(rng.normal(size=1000), rng.random(1000) < 0.5, 1e-5).epsilon)
    assert sum(bound == 0.0 for bound in bounds) >= 18
    assert max(bounds) < 0.5


@pytest.mark.parametrize("m", [20, 21, 200, 1001])
@pytest.mark.parametrize(("delta", "confidence"), [(0.0, 0.95), (1e-4, 0.95), (1e-3, 0.9)])
def test_certifiable_epsilon_is_the_lower_bound_of_perfectly_separated_scores(
    m: int, delta: float, confidence: float
) -> None:
    rng = np.random.default_rng(m)
    inserted = rng.permutation(np.arange(m) < (m + 1) // 2)  # ⌈m/2⌉ inserted, in random positions
    scores = rng.normal(size=m) + 100.0 * inserted  # every inserted canary above every other
    ceiling = certifiable_epsilon(m, delta, confidence)
    assert ceiling == one_run_lower_bound(scores, inserted, delta, confidence=confidence).epsilon
    assert ceiling == certifiable_epsilon(m, delta, confidence, guesses=default_guess_counts(m))
    # An imperfect ranking certifies no more.
    noisy = rng.normal(size=m) + 2.0 * inserted
    assert one_run_lower_bound(noisy, inserted, delta, confidence=confidence).epsilon <= ceiling


@pytest.mark.parametrize("m", [20, 500, 5000])
def test_pure_dp_ceiling_is_the_bonferroni_binomial_tail(m: int) -> None:
    """δ = 0, all r = m guesses right: P[Bin(m, q) = m] = q^m = (1 − confidence)/n, n the counts tried."""
    n = len(default_guess_counts(m))
    q = (0.05 / n) ** (1 / m)
    assert certifiable_epsilon(m, 0.0) == pytest.approx(math.log(q / (1 - q)), abs=1e-9)


def test_no_outcome_rejects_an_epsilon_above_the_ceiling() -> None:
    m, delta = 40, 1e-3
    ceiling = certifiable_epsilon(m, delta)
    counts = default_guess_counts(m)
    significance = 0.05 / len(counts)
    for count in counts:
        for right in range(count + 1):
            for above in (1e-6, 0.1, 1.0):
                assert one_run_p_value(m, count, right, ceiling + above, delta) >= significance


# (K, δ_LB = 0.01/K, ceiling): the audit's default lower-bound δ; the accountant's ε of CPU Table IV (σ = 0.95,
# q = 0.1, 12 rounds, Poisson, RDP) at those δ is 3.80, 4.23 and 4.73.
CEILINGS = [(500, 2e-5, 4.572666468255193), (2000, 5e-6, 5.888899119308917), (10000, 1e-6, 7.440627968986519)]


def test_pinned_ceilings_grow_with_the_number_of_canaries() -> None:
    values = [certifiable_epsilon(m, delta) for m, delta, _ in CEILINGS]
    assert values == pytest.approx([pinned for _, _, pinned in CEILINGS], rel=1e-9)
    assert np.all(np.diff(values) > 0)
    # At a fixed δ the 2mδ term bites: δ must shrink with m for the ceiling to grow.
    assert [certifiable_epsilon(2000, delta) for delta in (0.0, 1e-5, 1e-3, 1e-2)] == pytest.approx(
        [5.975272624131321, 5.780681866614032, 0.8794196624412507, 0.0], rel=1e-9
    )
    with pytest.raises(ValueError):
        certifiable_epsilon(0, 1e-5)
    with pytest.raises(ValueError):
        certifiable_epsilon(100, 1.0)
    with pytest.raises(ValueError):
        certifiable_epsilon(100, 1e-5, confidence=1.0)
    with pytest.raises(ValueError):
        certifiable_epsilon(100, 1e-5, guesses=[101])


def test_one_sided_guesses_take_only_the_highest_scores() -> None:
    scores = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0])
    inserted = np.array([True, False, True, False, False, True])
    bound = one_run_lower_bound(scores, inserted, 0.0, guesses=[3], rule="one_sided")
    # "in" on 5 (right), 4 (wrong), 3 (right); no "out" guess, so the inserted 0 at the bottom costs nothing.
    assert (bound.positive_guesses, bound.negative_guesses, bound.correct, bound.rule) == (3, 0, 2, "one_sided")
    two = one_run_lower_bound(scores, inserted, 0.0, guesses=[3])
    assert (two.positive_guesses, two.negative_guesses, two.correct, two.rule) == (2, 1, 1, "two_sided")
    with pytest.raises(ValueError, match="rule"):
        one_run_lower_bound(scores, inserted, 0.0, rule="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rule"):
        certifiable_epsilon(100, 1e-5, rule="top")  # type: ignore[arg-type]


def test_one_sided_random_scores_certify_nothing_in_most_seeds() -> None:
    """Validity does not depend on the rule: under the null the one-sided bound is 0 in ≥ 18 of 20 seeds."""
    bounds = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        scores, inserted = rng.normal(size=1000), rng.random(1000) < 0.5
        bounds.append(one_run_lower_bound(scores, inserted, 1e-5, rule="one_sided").epsilon)
    assert sum(bound == 0.0 for bound in bounds) >= 18
    assert max(bounds) < 0.5


@pytest.mark.parametrize("m", [20, 21, 200, 1001])
@pytest.mark.parametrize("delta", [0.0, 1e-4])
def test_one_sided_certifiable_epsilon_is_the_bound_of_perfectly_separated_scores(m: int, delta: float) -> None:
    rng = np.random.default_rng(m)
    inserted = rng.permutation(np.arange(m) < (m + 1) // 2)
    scores = rng.normal(size=m) + 100.0 * inserted
    ceiling = certifiable_epsilon(m, delta, rule="one_sided")
    assert ceiling == one_run_lower_bound(scores, inserted, delta, rule="one_sided").epsilon
    # With every canary separable the two-sided rule guesses twice as often and certifies more.
    assert ceiling < certifiable_epsilon(m, delta)


def test_canaries_that_never_joined_cost_the_two_sided_rule_and_not_the_one_sided() -> None:
    """The reason the app guesses one-sided (audit.guess_rule): an inserted canary that never joined a round scores
    like the null under any mechanism. Here 28% of the inserted never joined ((1 − q)^T at q = 0.1, T = 12) and the
    joined ones all stand out: K = 2,000 at δ_LB = 5e-6, where CPU Table IV's accountant says 4.23."""
    rng = np.random.default_rng(0)
    inserted = rng.random(2000) < 0.5
    joined = inserted & (rng.random(2000) < 1 - 0.9**12)
    scores = rng.normal(size=2000) + 100.0 * joined
    one = one_run_lower_bound(scores, inserted, 5e-6, rule="one_sided").epsilon
    two = one_run_lower_bound(scores, inserted, 5e-6, rule="two_sided").epsilon
    assert two < 2.0 < 4.23 < one


# ------------------------------------------------------------------------------------------------------------
# End to end: the bare Gaussian mechanism (no training), ρ = Σ_{inserted} u_i + N(0, σ² I)
# ------------------------------------------------------------------------------------------------------------

D = 20_000
DELTA = 1e-5


@functools.cache
def _one_release(canaries: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float, float, float]:
    """Insertion mask, and the canaries' dot products with the canary sum S and with a unit noise draw z, so that
    the release for any σ is S + σz and its dots are linear in σ."""
    rng = np.random.default_rng(2024)
    inserted = rng.random(canaries) < 0.5
    total = np.zeros(D, dtype=np.float64)
    for index in np.flatnonzero(inserted):
        total += canary_direction(SEED, int(index), D)
    noise = rng.standard_normal(D)
    dots = canary_dots(SEED, range(canaries), [total.astype(np.float32), noise.astype(np.float32)])
    return inserted, dots[:, 0], dots[:, 1], float(total @ total), float(total @ noise), float(noise @ noise)


def _release_statistics(canaries: int, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    inserted, dot_total, dot_noise, tt, tn, nn = _one_release(canaries)
    norm_release = math.sqrt(tt + 2 * sigma * tn + sigma**2 * nn)
    cos = final_model_statistics((dot_total + sigma * dot_noise)[:, None], norm_release)
    return cos, inserted


def test_gaussian_mechanism_estimate_recovers_the_analytic_epsilon_and_the_lower_bound_stays_below() -> None:
    mu = 0.7
    sigma = 1 / mu
    analytic = gdp_epsilon(mu, DELTA)  # 2.9097
    cos, inserted = _release_statistics(2000, sigma)
    estimate = estimate_epsilon(cos[~inserted], cos[inserted], DELTA, rng=np.random.default_rng(5), bootstrap=300)
    # The fitted pair: a mean gap of 1/‖ρ‖ and a spread of sqrt(σ² + n/d)/‖ρ‖ in both sets (the n/d comes from the
    # other inserted canaries, nearly orthogonal but not quite), i.e. μ_eff = 1/sqrt(σ² + n/d) ≈ 0.992 μ.
    mu_fit = (estimate.inserted_mean - estimate.null_mean) / estimate.null_std
    mu_eff = 1 / math.sqrt(sigma**2 + inserted.sum() / D)
    assert mu_fit == pytest.approx(mu_eff, rel=0.1)
    assert estimate.inserted_std / estimate.null_std == pytest.approx(1.0, abs=0.1)
    # Tolerance: with ~1000 canaries per set the sampled std ratio is off by ~3%, which at δ = 1e-5 moves ε up
    # (any variance mismatch leaks in the tails): over seeds the estimate's 5–95% range is about 0.95–1.45 × ε.
    assert 0.8 * analytic <= estimate.epsilon <= 1.5 * analytic
    assert estimate.low <= estimate.epsilon <= estimate.high
    bound = one_run_lower_bound(cos, inserted, DELTA)
    assert 0.0 < bound.epsilon <= analytic


def test_the_analytic_null_of_the_final_model_fits_only_the_inserted_set() -> None:
    """Andrew et al. §4: the cosine of a never-inserted direction with the final model is N(0, 1/d) exactly; with
    that null (``known_null``) the estimate still recovers ε, and the fitted null set no longer matters."""
    mu = 0.7
    analytic = gdp_epsilon(mu, DELTA)
    cos, inserted = _release_statistics(2000, 1 / mu)
    null = (0.0, 1 / math.sqrt(D))
    known = estimate_epsilon(cos[~inserted], cos[inserted], DELTA, rng=np.random.default_rng(5), bootstrap=300,
                             known_null=null)  # fmt: skip
    assert (known.null_mean, known.null_std) == null
    assert 0.8 * analytic <= known.epsilon <= 1.5 * analytic
    assert known.low <= known.epsilon <= known.high
    other = estimate_epsilon(cos[:3], cos[inserted], DELTA, rng=np.random.default_rng(5), bootstrap=300,
                             known_null=null)  # fmt: skip
    assert other == known
    with pytest.raises(ValueError, match="known_null"):
        estimate_epsilon(cos[~inserted], cos[inserted], DELTA, rng=np.random.default_rng(5), known_null=(0.0, 0.0))


def test_noise_off_is_caught_by_the_lower_bound() -> None:
    cos, inserted = _release_statistics(1000, 0.0)
    bound = one_run_lower_bound(cos, inserted, DELTA)
    assert bound.epsilon > 3.0
    # The same canaries with the noise on certify far less.
    noisy_cos, _ = _release_statistics(1000, 1 / 0.7)
    assert one_run_lower_bound(noisy_cos, inserted, DELTA).epsilon < 2.0


@pytest.mark.parametrize("q", [1.0, 0.5])
def test_several_rounds_all_iterates_estimate_stays_below_the_composed_epsilon(q: float) -> None:
    canaries, rounds, sigma = 1000, 4, 2.0
    composed = gdp_epsilon(math.sqrt(rounds) / sigma, DELTA)  # μ√T = 1: 4.3772
    rng = np.random.default_rng(99)
    audited = rng.random(canaries) < 0.5
    # An audited canary takes part in each round independently with probability q; the others never do.
    takes_part = audited[:, None] & (rng.random((canaries, rounds)) < q)
    releases = sigma * rng.standard_normal((rounds, D))
    for index in np.flatnonzero(audited):
        releases[takes_part[index]] += canary_direction(SEED, int(index), D)
    deltas = [release.astype(np.float32) for release in releases]
    dots = canary_dots(SEED, range(canaries), deltas)
    norms = np.array([np.linalg.norm(delta.astype(np.float64)) for delta in deltas])
    stats = all_iterates_statistics(dots, norms)
    all_iterates = estimate_epsilon(stats[~audited], stats[audited], DELTA, rng=rng, bootstrap=0)
    assert 0.0 < all_iterates.epsilon <= composed
    final = final_model_statistics(dots, float(np.linalg.norm(releases.sum(axis=0))))
    final_estimate = estimate_epsilon(final[~audited], final[audited], DELTA, rng=rng, bootstrap=0)
    if q == 1.0:
        # Every round repeats the same canaries: w_T − w_0 = T·Σu + N(0, Tσ² I) is exactly μ√T-GDP, so the
        # final-model estimate recovers the composed ε (same tolerance as the single release).
        assert 0.8 * composed <= final_estimate.epsilon <= 1.5 * composed
    else:
        assert final_estimate.epsilon <= composed
