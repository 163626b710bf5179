"""The optimisers of the BLT and banded factorizations: deterministic L-BFGS-B over the loss of the toeplitz module
(see the package docstring)."""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize
from scipy.signal import lfilter

from fl_app.privacy.mechanisms.matrix_factorization.streaming import BLT
from fl_app.privacy.mechanisms.matrix_factorization.toeplitz import (
    _banded_sens_sq,
    _check_momentum,
    _check_participation,
    _minsep_sens_sq_monotone,
    _mse_from_inverse,
    sqrt_prefix_coefficients,
)


def _blt_polys(theta: np.ndarray, omega: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """C(x) = p(x)/q(x) in ascending powers: q = Π(1 − ω_i x), p = q + Σ_i θ_i x Π_{j≠i}(1 − ω_j x)."""
    q = np.array([1.0])
    for w in omega:
        q = np.convolve(q, [1.0, -w])
    p = q.copy()
    for i, t in enumerate(theta):
        others = np.array([1.0])
        for j, w in enumerate(omega):
            if j != i:
                others = np.convolve(others, [1.0, -w])
        p[1:] += t * others
    return p, q


def _blt_log_loss(theta: np.ndarray, omega: np.ndarray, n: int, b: int, k: int, momentum: float) -> float:
    powers = omega[None, :] ** np.arange(n - 1, dtype=np.float64)[:, None]
    c = np.concatenate(([1.0], powers @ theta))
    sens_sq = _minsep_sens_sq_monotone(c, b, k)
    p, q = _blt_polys(theta, omega)
    impulse = np.zeros(n, dtype=np.float64)
    impulse[0] = 1.0
    inverse = np.asarray(lfilter(q, p, impulse), dtype=np.float64)  # C⁻¹(x) = q(x)/p(x)
    mse = _mse_from_inverse(inverse, momentum)
    value = math.log(sens_sq) + math.log(mse)
    return value if math.isfinite(value) else 1e300


#: Upper bounds of the unconstrained parameters, chosen so that the open domain survives float64 rounding.
#: ω = 1/(1 + e^{−v}) rounds to exactly 1.0 once e^{−v} < 2^−53 (v ≳ 36.74): v ≤ 36 keeps ω ≤ 1 − 2^−52 < 1.
#: Σθ = S/(e^{−top} + S), 1 ≤ S ≤ d ≤ 8 (the config's largest d), rounds to 1.0 once e^{−top} < S·2^−53: u ≤ 34
#: keeps e^{−top} ≥ 1.7e-15 > 8·2^−53, so Σθ < 1 as well. The lower bounds (−40) only approach 0, which is allowed.
_LOGIT_BOUNDS_THETA = (-40.0, 34.0)
_LOGIT_BOUNDS_OMEGA = (-40.0, 36.0)


def _blt_from_params(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """θ_i = e^{u_i} / (1 + Σ_j e^{u_j}) (θ > 0, Σθ < 1), ω_i = 1 / (1 + e^{−v_i}) (0 < ω < 1)."""
    d = x.size // 2
    u, v = x[:d], x[d:]
    top = max(0.0, float(np.max(u)))
    eu = np.exp(u - top)
    theta = eu / (math.exp(-top) + eu.sum())
    omega = np.empty(d)
    pos = v >= 0
    omega[pos] = 1.0 / (1.0 + np.exp(-v[pos]))
    ev = np.exp(v[~pos])
    omega[~pos] = ev / (1.0 + ev)
    return theta, omega


def _params_from_blt(theta: np.ndarray, omega: np.ndarray) -> np.ndarray:
    rest = 1.0 - theta.sum()
    return np.concatenate((np.log(theta / rest), np.log(omega / (1.0 - omega))))


def optimize_blt(
    n: int,
    min_separation: int,
    max_participations: int,
    buffers: int = 3,
    momentum: float = 0.0,
) -> BLT:
    """The BLT with ``buffers`` buffers minimising :func:`loss` (sens² under (k, b) × mean squared error).

    Search space: θ_i > 0, 0 < ω_i < 1 and Σθ_i < 1, reparametrised (θ by a softmax with an extra zero logit, ω by
    a sigmoid) with box bounds on the logits that keep ω < 1 and Σθ < 1 after float64 rounding (an optimum that
    wants a decay of exactly 1, a buffer that never forgets, gets the largest ω < 1 instead of one the BLT
    refuses). There the coefficients are positive and non-increasing (c_1 = Σθ < 1 = c_0,
    and each c_j = Σθ_i ω_i^{j−1} decreases in j), which the min-separation sensitivity formula needs; the
    constraint Σθ < 1 is necessary for this (θ > 0, ω ∈ (0,1) alone allow c_1 > c_0). They also keep C(x) free of
    zeros in the closed unit disk (Re C(x) ≥ 1 − Σθ_i/(1 + ω_i) > 0), so C⁻¹'s coefficients decay and the
    loss is evaluated stably by IIR filtering.

    Minimises log(loss) by L-BFGS-B with central finite differences from a fixed set of starts (decays spread
    geometrically towards 1 at two scales of n); deterministic. ``buffers = 0`` returns the identity.
    """
    n, b, k = _check_participation(n, min_separation, max_participations)
    momentum = _check_momentum(momentum)
    if isinstance(buffers, bool) or not isinstance(buffers, int | np.integer) or buffers < 0:
        raise ValueError(f"buffers must be a non-negative integer, got {buffers!r}")
    d = int(buffers)
    if d == 0 or n == 1:
        return BLT(output_scale=(0.0,) * d, buf_decay=(0.0,) * d)  # C = I

    def objective(x: np.ndarray) -> float:
        theta, omega = _blt_from_params(x)
        return _blt_log_loss(theta, omega, n, b, k, momentum)

    starts: list[np.ndarray] = []
    for span in (1.0, 0.5):
        # Time constants 1/(1 − ω) spread log-uniformly over [1.5, n^span]; θ sums to 1/2 (c_1 = 1/2, as for √A).
        top = max(2.0, float(n) ** span)
        taus = np.geomspace(1.5, top, d) if d > 1 else np.array([max(2.0, top / 4.0)])
        theta = np.full(d, 0.5 / d) * (np.linspace(1.5, 0.5, d) if d > 1 else np.ones(1))
        starts.append(_params_from_blt(theta, 1.0 - 1.0 / taus))

    best_x: np.ndarray | None = None
    best_f = math.inf
    for x0 in starts:
        result = minimize(
            objective,
            x0,
            method="L-BFGS-B",
            jac="3-point",
            bounds=[_LOGIT_BOUNDS_THETA] * d + [_LOGIT_BOUNDS_OMEGA] * d,
            options={"maxiter": 300, "ftol": 1e-12, "gtol": 1e-8},
        )
        value = float(result.fun)
        if value < best_f - 1e-12:
            best_f, best_x = value, np.asarray(result.x)
    assert best_x is not None
    theta, omega = _blt_from_params(best_x)
    order = np.argsort(-omega, kind="stable")  # jax-privacy's canonical order: decays decreasing
    return BLT(output_scale=tuple(theta[order]), buf_decay=tuple(omega[order]))


def optimize_banded(
    n: int,
    bands: int,
    min_separation: int,
    max_participations: int,
    momentum: float = 0.0,
) -> np.ndarray:
    """Coefficients c_0..c_{bands−1} (c_0 = 1) of the banded Toeplitz C minimising :func:`loss`.

    Requires bands ≤ min_separation: then two columns touched by one client do not overlap, sens² = Σ over its
    participations of the column norms², maximal (column norms are non-increasing in the column index) for the
    earliest pattern 0, b, 2b, …: k·Σc_j² when those columns are not truncated by the end. The coefficients are
    free (any sign); L-BFGS-B with central finite differences on log(loss), started from the truncated square root
    of the prefix sums; deterministic. bands = 1 is the identity.
    """
    n, b, k = _check_participation(n, min_separation, max_participations)
    momentum = _check_momentum(momentum)
    if isinstance(bands, bool) or not isinstance(bands, int | np.integer) or bands < 1:
        raise ValueError(f"bands must be a positive integer, got {bands!r}")
    bands = int(bands)
    if bands > b:
        raise ValueError(f"bands ({bands}) must be ≤ min_separation ({b}) for the orthogonal-column sensitivity")
    bands = min(bands, n)
    if bands == 1:
        return np.ones(1)
    impulse = np.zeros(n, dtype=np.float64)
    impulse[0] = 1.0

    def objective(x: np.ndarray) -> float:
        c = np.concatenate(([1.0], x))
        inverse = np.asarray(lfilter([1.0], c, impulse), dtype=np.float64)
        if not np.all(np.isfinite(inverse)):
            return 1e300
        value = math.log(_banded_sens_sq(c, n, b, k)) + math.log(_mse_from_inverse(inverse, momentum))
        return value if math.isfinite(value) else 1e300

    x0 = sqrt_prefix_coefficients(bands)[1:]
    result = minimize(
        objective, x0, method="L-BFGS-B", jac="3-point", options={"maxiter": 2000, "ftol": 1e-14, "gtol": 1e-10}
    )
    best = result.x if result.fun <= objective(x0) else x0
    return np.concatenate(([1.0], np.asarray(best, dtype=np.float64)))

