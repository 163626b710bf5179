"""ε at δ of a pair of Gaussians N(null) vs N(alt), exactly (Andrew et al., ICLR 2024, §3–4): the privacy profile
δ(ε) = max over both orderings of P_Q[L > ε] − e^ε P_P[L > ε], L = log(dQ/dP) (the hockey-stick divergence),
inverted for ε by a root finder. For equal variances it is the Gaussian-DP profile of Dong, Roth & Su with
μ = |Δmean|/std: δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from fl_app.privacy.audit.checks import _check_delta

# SciPy's special functions, root finder and binomial are imported where they are called: scipy.stats alone costs
# ~0.4 s, which every run's driver would pay on its way to starting Ray, and only an audit's evaluation uses them.

# Bisection on ε: after at most _MAX_DOUBLINGS doublings of the bracket and _BISECTIONS halvings the bracket is
# below 2^(_MAX_DOUBLINGS − _BISECTIONS) ≈ 1e-21, i.e. at the resolution of a float64 ε.
_MAX_DOUBLINGS = 30
_BISECTIONS = 100
# A stand-in for log 0 in root finding: the root finders only need the sign, and −inf − (−inf) would be NaN.
_LOG_ZERO = -1e4


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
