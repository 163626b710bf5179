"""Lower-triangular Toeplitz matrices by their coefficients: workloads, inverses, the noise error of a factorization,
its sensitivity under (k, b) participation and the loss the optimisers minimise (see the package docstring)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.signal import lfilter

# ------------------------------------------------------------------------------------------------------------
# Toeplitz basics
# ------------------------------------------------------------------------------------------------------------


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return int(n)


def _check_momentum(momentum: float) -> float:
    momentum = float(momentum)
    if not (math.isfinite(momentum) and 0.0 <= momentum < 1.0):
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    return momentum


def _as_coefs(coefs: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(coefs, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"coefficients must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("coefficients must be finite")
    if arr[0] == 0.0:
        raise ValueError("the leading coefficient c_0 must be non-zero (C must be invertible)")
    return arr


def _pad(coefs: np.ndarray, n: int) -> np.ndarray:
    """The first n coefficients, zero-padded."""
    out = np.zeros(n, dtype=np.float64)
    m = min(n, coefs.size)
    out[:m] = coefs[:m]
    return out


def workload_coefficients(n: int, momentum: float = 0.0) -> np.ndarray:
    """Toeplitz coefficients a_0..a_{n−1} of the workload A.

    momentum 0: prefix sums, a_j = 1 (server SGD, w_t = w_0 + η Σ_{s≤t} x̂_s). Heavy-ball momentum β
    (v ← βv + x̂; w ← w + ηv): a_j = Σ_{i≤j} β^i = (1 − β^{j+1})/(1 − β).
    """
    n = _check_n(n)
    beta = _check_momentum(momentum)
    if beta == 0.0:
        return np.ones(n, dtype=np.float64)
    return (1.0 - beta ** np.arange(1, n + 1, dtype=np.float64)) / (1.0 - beta)


def toeplitz_matrix(coefs: Sequence[float] | np.ndarray, n: int) -> np.ndarray:
    """The n×n lower-triangular Toeplitz matrix M[i, j] = c_{i−j} (i ≥ j), coefs zero-padded / truncated to n."""
    n = _check_n(n)
    c = _pad(np.asarray(coefs, dtype=np.float64).ravel(), n)
    idx = np.arange(n)
    diff = idx[:, None] - idx[None, :]
    return np.where(diff >= 0, c[np.clip(diff, 0, n - 1)], 0.0)


def inverse_coefficients(coefs: Sequence[float] | np.ndarray, n: int) -> np.ndarray:
    """Toeplitz coefficients of C⁻¹ (n of them) for lower-triangular Toeplitz C with coefs (c_0 ≠ 0).

    Forward substitution on C w = e_0 (w_t = (δ_t − Σ_{j≥1} c_j w_{t−j}) / c_0), run as the IIR filter 1/C(x).
    """
    n = _check_n(n)
    c = _as_coefs(coefs)[:n]
    impulse = np.zeros(n, dtype=np.float64)
    impulse[0] = 1.0
    return np.asarray(lfilter([1.0], c, impulse), dtype=np.float64)


def _noise_coefficients(inverse: np.ndarray, momentum: float) -> np.ndarray:
    """Toeplitz coefficients of B = A C⁻¹ given those of C⁻¹ (A: prefix sums with momentum)."""
    if momentum == 0.0:
        return np.cumsum(inverse)
    # A(x) = 1 / ((1 − x)(1 − βx)) = 1 / (1 − (1 + β)x + βx²).
    return np.asarray(lfilter([1.0], [1.0, -(1.0 + momentum), momentum], inverse), dtype=np.float64)


def _mse_from_inverse(inverse: np.ndarray, momentum: float) -> float:
    n = inverse.size
    b = _noise_coefficients(inverse, momentum)
    # Row t of the Toeplitz B has squared norm Σ_{j≤t} b_j²; the mean over t weights b_j² by (n − j)/n.
    weights = (n - np.arange(n, dtype=np.float64)) / n
    return float(np.dot(b * b, weights))


def mean_squared_error(coefs: Sequence[float] | np.ndarray, n: int, momentum: float = 0.0) -> float:
    """MSE(C) = (1/n) Σ_{t<n} ‖row_t(A C⁻¹)‖²: the mean per-round variance of the workload's noise for σ = 1."""
    n = _check_n(n)
    momentum = _check_momentum(momentum)
    return _mse_from_inverse(inverse_coefficients(coefs, n), momentum)


def min_separation_sensitivity_squared(
    coefs: Sequence[float] | np.ndarray, n: int, min_separation: int, max_participations: int
) -> float:
    """sens² = max over participation patterns π of Σ_{i,j∈π} (CᵀC)_{ij} for the n×n lower-triangular Toeplitz C.

    π: at most k rounds among 0..n−1, pairwise ≥ b apart (k capped at ⌈n/b⌉); zero-out adjacency, each participation
    moves its round's input by at most 1 (the clip norm). Two closed forms:

    - coefficients (first n) non-negative and non-increasing: the maximum is at π = {0, b, 2b, …} (arXiv 2405.13763
      Theorem 2, the source jax-privacy's ``toeplitz.minsep_sensitivity_squared`` cites; used by arXiv 2408.08868),
      sens² = ‖Σ_{m<k} column_{mb}‖²;
    - otherwise, if the last non-zero coefficient has index < b (bands ≤ b): columns touched by one client are
      orthogonal, sens² = Σ_{m<k} ‖column_{mb}‖² (column norms are non-increasing in the index).

    Raises ValueError for any other coefficients (no closed form; the maximum over patterns is then a hard problem).
    """
    n, b, k = _check_participation(n, min_separation, max_participations)
    c = _pad(_as_coefs(coefs), n)
    # Non-increasing up to rounding (1e-15·c_0), so that BLTs with a decay within float64 of 1 are accepted.
    if c[0] > 0 and np.all(c >= 0) and np.all(np.diff(c) <= 1e-15 * c[0]):
        return _minsep_sens_sq_monotone(c, b, k)
    nonzero = np.flatnonzero(c)
    bands = int(nonzero[-1]) + 1
    if bands <= b:
        return _banded_sens_sq(c[:bands], n, b, k)
    raise ValueError(
        "min-separation sensitivity needs non-negative, non-increasing coefficients or bands ≤ min_separation; got "
        f"{bands} bands > min_separation {b} and coefficients {c[: min(n, 8)].tolist()}…"
    )


def loss(
    coefs: Sequence[float] | np.ndarray,
    n: int,
    min_separation: int,
    max_participations: int,
    momentum: float = 0.0,
) -> float:
    """sens²(C under (k, b), n rounds) × MSE(C): the objective both optimisers minimise (module docstring)."""
    sens_sq = min_separation_sensitivity_squared(coefs, n, min_separation, max_participations)
    return sens_sq * mean_squared_error(coefs, n, momentum)


def sqrt_prefix_coefficients(n: int) -> np.ndarray:
    """c_j = binom(2j, j) / 4^j, the coefficients of (1 − x)^{−1/2}: C = √A for the prefix sums (C² = A).

    Fichtenberger, Henzinger, Upadhyay 2023; computed by the recurrence c_j = c_{j−1} (2j − 1) / (2j).
    """
    n = _check_n(n)
    j = np.arange(1, n, dtype=np.float64)
    return np.concatenate(([1.0], np.cumprod((2.0 * j - 1.0) / (2.0 * j))))


# ------------------------------------------------------------------------------------------------------------
# Fast loss for the optimisers (O(n·d) per evaluation)
# ------------------------------------------------------------------------------------------------------------


def _effective_k(n: int, min_separation: int, max_participations: int) -> int:
    return min(max_participations, -(-n // min_separation))


def _minsep_sens_sq_monotone(c: np.ndarray, b: int, k: int) -> float:
    """sens² for non-negative non-increasing coefficients: ‖Σ_{m<k} column_{mb}‖² (jax-privacy's cumsum trick)."""
    n = c.size
    rows = -(-n // b)
    padded = np.zeros(rows * b, dtype=np.float64)
    padded[:n] = c
    cs = np.cumsum(padded.reshape(rows, b), axis=0)
    if k < rows:
        cs[k:] = cs[k:] - cs[:-k].copy()
    u = cs.ravel()[:n]
    return float(np.dot(u, u))


def _banded_sens_sq(c: np.ndarray, n: int, b: int, k: int) -> float:
    """sens² for bands ≤ b: Σ_{m<k} ‖column_{mb}‖², ‖column_i‖² = Σ_{j < min(bands, n − i)} c_j²."""
    csq = np.cumsum(c * c)
    total = 0.0
    for m in range(k):
        i = m * b
        total += float(csq[min(c.size, n - i) - 1])
    return total


def _check_participation(n: int, min_separation: int, max_participations: int) -> tuple[int, int, int]:
    n = _check_n(n)
    for name, value in (("min_separation", min_separation), ("max_participations", max_participations)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return n, int(min_separation), _effective_k(n, int(min_separation), int(max_participations))
