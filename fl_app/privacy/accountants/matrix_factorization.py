"""Privacy of DP-FTRL by matrix factorization (BLT / banded Toeplitz / identity) under (k, b) participation.

The mechanism (``fl_app.privacy.mechanisms.matrix_factorization``) releases C x + z with z ~ N(0, σ² I) per round,
in units of the clip norm, where x stacks the rounds' summed clipped updates and C is lower-triangular Toeplitz.
Zero-out adjacency: a neighbouring run replaces one client's updates by zeros, which moves the input of each round it
took part in by at most the clip norm (1 here). Participation schema (k, b): each client at most k times, any two
participations ≥ b rounds apart (Choquette-Choo et al. 2023, arXiv 2306.08153, "min-sep" / b-min-separation).

The release is then the Gaussian mechanism of L2 sensitivity

    sens = max over patterns π of max_{‖u_i‖ ≤ 1} ‖Σ_{i∈π} C_{:,i} u_i‖ = max_π sqrt(Σ_{i,j∈π} (CᵀC)_{ij})

(the second form when CᵀC ≥ 0 elementwise, where aligned u_i are worst), i.e. μ-GDP with μ = sens/σ (Dong, Roth,
Su 2022), (ε, δ)-DP by the GDP conversion (``fl_app.privacy.fdp.gdp_to_epsilon``) and ρ-zCDP with ρ = μ²/2. Closed
forms of the maximum over patterns (:func:`min_separation_sensitivity`): for non-negative, non-increasing Toeplitz
coefficients π = {0, b, 2b, …} is worst (arXiv 2405.13763 Theorem 2, the source cited by jax-privacy's
``toeplitz.minsep_sensitivity_squared``; used for BLTs by McMahan, Xu, Zhang 2024, arXiv 2408.08868); for banded C
with bands ≤ b the touched columns are orthogonal. The identity (C = I, coefficients ``[1.0]``) gives sens = √k:
k compositions of the Gaussian mechanism.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from fl_app.privacy.fdp import gdp_to_delta, gdp_to_epsilon
from fl_app.privacy.mechanisms.matrix_factorization import min_separation_sensitivity_squared


def min_separation_sensitivity(
    coefs: Sequence[float] | np.ndarray, n: int, min_separation: int, max_participations: int
) -> float:
    """sens = max over patterns π (≤ k rounds among 0..n−1, pairwise ≥ b apart) of sqrt(Σ_{i,j∈π} (CᵀC)_{ij}).

    C is the n×n lower-triangular Toeplitz matrix with ``coefs`` (zero-padded / truncated to n); k is capped at ⌈n/b⌉.
    Non-negative, non-increasing coefficients: the maximum is at π = {0, b, 2b, …} (arXiv 2405.13763 Thm 2; the
    theorem behind jax-privacy's ``toeplitz.minsep_sensitivity_squared``). Other coefficients: allowed only when
    bands ≤ b (orthogonal columns, sens² = Σ_{m<k} ‖column_{mb}‖²); otherwise ValueError.
    """
    return math.sqrt(min_separation_sensitivity_squared(coefs, n, min_separation, max_participations))


def brute_force_sensitivity(C: np.ndarray, min_separation: int, max_participations: int) -> float:
    """sqrt(max over every pattern π of Σ_{i,j∈π} |(CᵀC)_{ij}|), enumerating all patterns (n ≤ 16; for tests).

    Patterns: subsets of 0..n−1 with at most k elements, pairwise ≥ b apart. Equal to the true sensitivity when
    CᵀC ≥ 0 elementwise (e.g. C with non-negative entries); otherwise an upper bound.
    """
    C = np.asarray(C, dtype=np.float64)
    if C.ndim != 2 or C.shape[0] != C.shape[1]:
        raise ValueError(f"C must be square, got shape {C.shape}")
    n = C.shape[0]
    if n > 16:
        raise ValueError(f"brute force is for n ≤ 16, got {n}")
    b, k = int(min_separation), int(max_participations)
    if b < 1 or k < 1:
        raise ValueError("min_separation and max_participations must be positive")
    gram = np.abs(C.T @ C)
    best = 0.0
    for size in range(1, min(k, n) + 1):
        for pattern in itertools.combinations(range(n), size):
            if any(j - i < b for i, j in itertools.pairwise(pattern)):
                continue
            idx = np.asarray(pattern)
            best = max(best, float(gram[np.ix_(idx, idx)].sum()))
    return math.sqrt(best)


@dataclass(frozen=True)
class MatrixFactorizationBound:
    """The privacy of the first ``rounds`` releases of a matrix-factorization mechanism (see module docstring)."""

    mu: float
    epsilon: float
    delta: float
    rho: float
    rounds: int
    sensitivity: float
    noise_multiplier: float
    min_separation: int
    max_participations: int
    factorization: str

    def describe(self) -> str:
        """Multi-line human-readable statement of the bound."""
        return "\n".join(
            [
                f"DP-FTRL by matrix factorization ({self.factorization}) after {self.rounds} rounds:",
                f"  sensitivity sens = {self.sensitivity:.6g} (clip norm 1), noise z ~ N(0, σ²I) with "
                f"σ = {self.noise_multiplier:.6g}",
                f"  μ-GDP with μ = sens/σ = {self.mu:.6g}",
                f"  => (ε, δ)-DP with ε = {self.epsilon:.6g} at δ = {self.delta:.3g}",
                f"  => ρ-zCDP with ρ = μ²/2 = {self.rho:.6g}",
                f"  participation: each client at most {self.max_participations} times, ≥ {self.min_separation} "
                "rounds apart (zero-out adjacency)",
            ]
        )


def _check_sigma(noise_multiplier: float) -> float:
    sigma = float(noise_multiplier)
    if not (math.isfinite(sigma) and sigma >= 0.0):
        raise ValueError(f"noise_multiplier must be finite and ≥ 0, got {noise_multiplier!r}")
    return sigma


def matrix_factorization_bound(
    coefs: Sequence[float] | np.ndarray,
    n: int,
    rounds: int,
    min_separation: int,
    max_participations: int,
    noise_multiplier: float,
    delta: float,
    factorization: str = "blt",
) -> MatrixFactorizationBound:
    """The privacy after the first ``rounds`` ≤ n releases.

    Sensitivity of the leading rounds×rounds block of C (participations within the first ``rounds`` rounds, k capped
    at ⌈rounds/b⌉); μ = sens/σ (Gaussian mechanism of sensitivity sens, σ per round in units of the clip norm);
    ε from μ-GDP at δ; ρ = μ²/2. σ = 0 gives μ = ε = ρ = ∞; rounds = 0 gives 0.
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int | np.integer) or not 0 <= rounds <= n:
        raise ValueError(f"rounds must be an integer in [0, n], got {rounds!r}")
    sigma = _check_sigma(noise_multiplier)
    if not 0.0 < float(delta) <= 1.0:
        raise ValueError(f"delta must be in (0, 1], got {delta!r}")
    if rounds == 0:
        sens = 0.0
        # Validate the participation arguments all the same.
        min_separation_sensitivity(coefs, 1, min_separation, max_participations)
    else:
        sens = min_separation_sensitivity(coefs, int(rounds), min_separation, max_participations)
    if sens == 0.0:
        mu = 0.0
    elif sigma == 0.0:
        mu = math.inf
    else:
        mu = sens / sigma
    epsilon = math.inf if math.isinf(mu) else gdp_to_epsilon(mu, float(delta))
    return MatrixFactorizationBound(
        mu=mu,
        epsilon=epsilon,
        delta=float(delta),
        rho=mu * mu / 2.0,
        rounds=int(rounds),
        sensitivity=sens,
        noise_multiplier=sigma,
        min_separation=int(min_separation),
        max_participations=int(max_participations),
        factorization=str(factorization),
    )


def calibrate_matrix_factorization(
    target_epsilon: float,
    delta: float,
    coefs: Sequence[float] | np.ndarray,
    n: int,
    min_separation: int,
    max_participations: int,
) -> float:
    """The smallest σ with ε(σ) ≤ ``target_epsilon`` at δ after n rounds (to ~1e-9 relative, on the budget side).

    σ = sens/μ*, μ* the root of δ_μ(target ε) = δ for μ-GDP (δ_μ(ε) increases in μ).
    """
    target = float(target_epsilon)
    if not (math.isfinite(target) and target > 0.0):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    delta = float(delta)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    sens = min_separation_sensitivity(coefs, n, min_separation, max_participations)

    def excess(log_mu: float) -> float:
        value = gdp_to_delta(math.exp(log_mu), target)
        return (math.log(value) if value > 0.0 else -1e4) - math.log(delta)

    lo, hi = math.log(1e-8), math.log(1.0)
    while excess(hi) < 0.0:
        lo, hi = hi, hi + 1.0
    while excess(lo) > 0.0:
        lo, hi = lo - 5.0, lo
    mu_star = math.exp(brentq(excess, lo, hi, xtol=1e-14, rtol=1e-13, maxiter=500))
    sigma = sens / mu_star
    # Budget side: nudge σ up until the forward computation confirms ε(σ) ≤ target.
    for _ in range(60):
        if gdp_to_epsilon(sens / sigma, delta) <= target:
            return sigma
        sigma *= 1.0 + 1e-12 * 2.0**_
    raise RuntimeError("calibration failed to meet the target")  # pragma: no cover


__all__ = [
    "MatrixFactorizationBound",
    "brute_force_sensitivity",
    "calibrate_matrix_factorization",
    "matrix_factorization_bound",
    "min_separation_sensitivity",
]
