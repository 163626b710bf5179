"""The constants c (Thm 3(b)) and z (Thm 3(d)) of Sun et al., "Convergent Differential Privacy Analysis for General
Federated Learning" (theorems, equations and appendices cited by the paper's own numbers),
Appendix G.2:

- c = H_K / ln(K+1), H_K = Σ_{k=1}^K 1/k: the paper's "c ln(K+1)" approximation of Σ_{k=0}^{K-1} 1/(k+1)
  (Eq. (27)), taken exactly (1 ≤ c ≤ 1/ln 2; the paper states 1 ≤ c < 1.543).
- z = H_K / ln 2: the smallest constant with Σ_{k=0}^{K-1} 1/(tK+k+1) ≤ z·ln((t+2)/(t+1)) for every round
  t ≥ 0 (the ratio is largest at t = 0).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import digamma

from fl_app.privacy.fdp.checks import _count


def _harmonic(n: int) -> float:
    """H_n = Σ_{k=1}^n 1/k (exact summation for small n, ψ(n+1) + γ otherwise)."""
    if n <= 100_000:
        return math.fsum(1.0 / k for k in range(1, n + 1))
    return float(digamma(n + 1.0) + np.euler_gamma)


def cyclic_constant_c(K: int) -> float:
    """c of Thm 3(b): Σ_{k=0}^{K-1} 1/(k+1) = c·ln(K+1), i.e. c = H_K / ln(K+1) (Eq. (27)).

    1 ≤ c ≤ 1/ln 2 ≈ 1.4427 (the paper states 1 ≤ c < 1.543, the maximum of its upper bound (1 + ln K)/ln(K+1)).
    """
    K = _count("K", K)
    return _harmonic(K) / math.log(K + 1.0)


def continuous_constant_z(K: int) -> float:
    """z of Thm 3(d): the constant with Σ_{k=0}^{K-1} 1/(tK+k+1) ≤ z·ln((t+2)/(t+1)) for every round t ≥ 0.

    The paper sets the accumulation term to z·ln((t+2)/(t+1)) "to include the term at t = 0" with z > 1
    a constant; the ratio is largest at t = 0, so the smallest valid constant is z = H_K / ln 2.
    """
    K = _count("K", K)
    return _harmonic(K) / math.log(2.0)
