"""Conversions of a μ-GDP guarantee (Sun et al., seed paper 004, Appendix E, Lemmas 3–5; Dong, Roth & Su 2022):
Lemma 3, Eq. (20), μ-GDP ⇒ (ε, δ(ε))-DP and its inverse ε(δ); Lemma 4, μ-GDP ⇒ (ζ, ζμ²/2)-RDP; Lemma 5,
T_G(μ_1) ⊗ … ⊗ T_G(μ_n) = T_G(√Σμ_i²).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from scipy.special import log_ndtr, ndtri

from fl_app.privacy.fdp.checks import _nonnegative, _positive


def _log_gdp_delta(mu: float, epsilon: float) -> float:
    """log δ(ε) of Lemma 3 for μ > 0, evaluated in log space: δ = e^a (1 − e^{b−a}) with
    a = log Φ(−ε/μ + μ/2), b = ε + log Φ(−ε/μ − μ/2) (b < a whenever δ > 0)."""
    a = float(log_ndtr(-epsilon / mu + mu / 2.0))
    b = epsilon + float(log_ndtr(-epsilon / mu - mu / 2.0))
    diff = b - a
    if diff >= 0.0:  # δ underflows relative to Φ(·): numerically zero
        return -math.inf
    return a + math.log(-math.expm1(diff))


def gdp_to_delta(mu: float, epsilon: float) -> float:
    """δ(ε) such that a μ-GDP mechanism is (ε, δ(ε))-DP, Lemma 3, Eq. (20):

        δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2).

    Evaluated with ``scipy.special.log_ndtr`` in log space, so large ε or μ neither overflow nor lose the
    difference; μ = 0 gives 0.

    Raises:
        ValueError: mu < 0 or epsilon < 0 (the lemma is stated for ε ≥ 0), or either not finite.
    """
    mu = _nonnegative("mu", mu)
    epsilon = _nonnegative("epsilon", epsilon)
    if mu == 0.0:
        return 0.0
    return math.exp(_log_gdp_delta(mu, epsilon))


def gdp_to_epsilon(mu: float, delta: float) -> float:
    """The smallest ε ≥ 0 with δ(ε) ≤ delta for a μ-GDP mechanism: the inverse of :func:`gdp_to_delta`.

    δ(ε) decreases strictly from δ(0) = 2Φ(μ/2) − 1; if ``delta`` ≥ δ(0) the answer is 0.0. Otherwise the root of
    log δ(ε) = log delta is found by Brent's method on [0, ε_hi] with ε_hi = μ(μ/2 − Φ^{-1}(delta)) + 1, where
    δ(ε_hi) ≤ Φ(Φ^{-1}(delta) − 1/μ) < delta.

    Raises:
        ValueError: mu < 0 or not finite, or delta outside (0, 1].
    """
    mu = _nonnegative("mu", mu)
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 < float(delta) <= 1.0:
        raise ValueError(f"delta must be in (0, 1], got {delta!r}")
    delta = float(delta)
    if mu == 0.0 or delta >= gdp_to_delta(mu, 0.0):
        return 0.0
    log_delta = math.log(delta)

    def excess(eps: float) -> float:
        value = _log_gdp_delta(mu, eps)
        return (value if math.isfinite(value) else -1e4) - log_delta

    # Imported here: scipy.optimize costs ~0.25 s that a run's driver would otherwise pay before starting Ray.
    from scipy.optimize import brentq

    hi = mu * (mu / 2.0 - float(ndtri(delta))) + 1.0
    return float(brentq(excess, 0.0, hi, xtol=1e-15, rtol=1e-15, maxiter=500))


def gdp_to_rdp(mu: float, order: float) -> float:
    """RDP ε at order ζ of a μ-GDP mechanism, Lemma 4: μ-GDP ⇒ (ζ, ζμ²/2)-RDP for every ζ > 1.

    Raises:
        ValueError: mu < 0 or order ≤ 1.
    """
    mu = _nonnegative("mu", mu)
    order = _positive("order", order)
    if order <= 1.0:
        raise ValueError(f"RDP order must be > 1 (Lemma 4), got {order!r}")
    return 0.5 * order * mu * mu


def compose_gdp(mus: Sequence[float]) -> float:
    """μ of the composition of μ_i-GDP mechanisms, Lemma 5: T_G(μ_1) ⊗ … ⊗ T_G(μ_n) = T_G(√Σμ_i²).

    An empty sequence composes to 0 (perfect privacy).

    Raises:
        ValueError: some μ_i < 0 or not finite.
    """
    values = [_nonnegative(f"mus[{i}]", mu) for i, mu in enumerate(mus)]
    return math.hypot(*values) if values else 0.0
