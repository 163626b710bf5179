"""Tests for fl_app/privacy/fdp/: the GDP bounds of Sun et al. (seed 004) Thm 3 / Thm 4, the conversions of
Lemmas 3–5, the constants c and z, monotonicity and convergence of the bounds, validation and the CLI.

Every reference value is computed here independently of the module: Lemma 3 from the trade-off of N(0,1) vs
N(μ,1) with scipy.stats.norm (and mpmath at extreme points), Thm 3 / Thm 4 from the Cauchy–Schwarz value H_0 of
Appendix G.3 with Table 2's ρ_t and γ_t written out as explicit products and sums.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.stats import norm

from fl_app.core.choices import NOISY_SCHEDULES
from fl_app.privacy.fdp import (
    GDPBound,
    compose_gdp,
    continuous_constant_z,
    cyclic_constant_c,
    gdp_mu_noisy_fedavg,
    gdp_mu_noisy_fedprox,
    gdp_to_delta,
    gdp_to_epsilon,
    gdp_to_rdp,
    main,
    noisy_bound,
)

# The paper's Sec. 5 setting (Fig. 2: m = 20, K = 5, V = 10; T = 600 as in Table 5), lr = 0.01, assumed L = 1.
BASE = {"lr": 0.01, "V": 10.0, "K": 5, "m": 20, "sigma": 0.1, "L": 1.0, "T": 600}
PROX = {"V": 10.0, "m": 20, "sigma": 0.1, "L": 1.0, "alpha": 2.0, "T": 600, "lr": 0.01}

# ε for μ = 1, δ = 1e-5: 200 bisection steps on Lemma 3's δ(ε) in mpmath with 60 significant digits gave
# ε = 4.377178095681224627650116 (δ(ε) = 1e-5 to all printed digits).
PINNED_EPS_MU1_DELTA1E5 = 4.377178095681224627650116


def fedavg(schedule: str, **overrides: float) -> float:
    return gdp_mu_noisy_fedavg(schedule, **{**BASE, **overrides})  # type: ignore[arg-type]


def fedprox(**overrides: float) -> float:
    return gdp_mu_noisy_fedprox(**{**PROX, **overrides})  # type: ignore[arg-type]


def harmonic(n: int) -> float:
    return math.fsum(1.0 / k for k in range(1, n + 1))


def strictly_increasing(values: list[float]) -> bool:
    return bool(np.all(np.diff(values) > 0))


def strictly_decreasing(values: list[float]) -> bool:
    return bool(np.all(np.diff(values) < 0))


# ------------------------------------------------------------------------------------------------------------
# Lemma 3: μ-GDP ⇒ (ε, δ(ε))-DP
# ------------------------------------------------------------------------------------------------------------

LEMMA3_POINTS = [(0.1, 0.05), (0.5, 0.0), (0.5, 0.3), (1.0, 1.0), (1.0, 3.0), (2.0, 0.5), (3.0, 5.0), (4.0, 2.0)]


def _hockey_stick(mu: float, eps: float, t: float) -> float:
    """P[N(μ,1) > t] − e^ε P[N(0,1) > t]: the privacy-loss excess of the rejection region S = {x > t}."""
    return float(norm.sf(t, loc=mu) - math.exp(eps) * norm.sf(t))


@pytest.mark.parametrize(("mu", "eps"), LEMMA3_POINTS)
def test_lemma3_matches_direct_tradeoff_of_two_gaussians(mu: float, eps: float) -> None:
    # The likelihood ratio of N(μ,1) vs N(0,1) is monotone in x, so the optimal S are half-lines {x > t};
    # maximize over t numerically (grid, then a bounded scalar search) and at the analytic optimum ε/μ + μ/2.
    grid = np.linspace(-10.0, 15.0, 25_001)
    values = norm.sf(grid, loc=mu) - math.exp(eps) * norm.sf(grid)
    t_grid = float(grid[int(np.argmax(values))])
    refined = minimize_scalar(
        lambda t: -_hockey_stick(mu, eps, t),
        bounds=(t_grid - 0.01, t_grid + 0.01),
        method="bounded",
        options={"xatol": 1e-12},
    )
    numeric = max(-float(refined.fun), float(values.max()))
    analytic_t = eps / mu + mu / 2.0
    analytic = _hockey_stick(mu, eps, analytic_t)

    delta = gdp_to_delta(mu, eps)
    assert delta == pytest.approx(numeric, abs=1e-9, rel=1e-9)
    assert delta == pytest.approx(analytic, abs=1e-12, rel=1e-9)
    assert abs(refined.x - analytic_t) < 1e-4  # the numeric optimum is the analytic threshold
    assert 0.0 <= delta < 1.0


@pytest.mark.parametrize("mu", [0.01, 0.5, 1.0, 3.0, 10.0])
def test_lemma3_at_epsilon_zero_is_total_variation(mu: float) -> None:
    assert gdp_to_delta(mu, 0.0) == pytest.approx(2.0 * norm.cdf(mu / 2.0) - 1.0, rel=1e-12)


@pytest.mark.parametrize(("mu", "eps"), [(40.0, 30.0), (0.5, 6.0), (2.0, 25.0), (20.0, 150.0), (0.05, 0.2)])
def test_lemma3_is_accurate_where_the_naive_formula_is_not(mu: float, eps: float) -> None:
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 80
    m_mu, m_eps = mp.mpf(mu), mp.mpf(eps)
    exact = mp.ncdf(-m_eps / m_mu + m_mu / 2) - mp.exp(m_eps) * mp.ncdf(-m_eps / m_mu - m_mu / 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gdp_to_delta(mu, eps) == pytest.approx(float(exact), rel=1e-9)


def test_lemma3_extremes_do_not_overflow() -> None:
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        assert gdp_to_delta(1.0, 800.0) == 0.0  # e^800 overflows a double; δ is ~e^{-320000}
        assert gdp_to_delta(100.0, 1.0) == pytest.approx(1.0, abs=1e-12)
        assert gdp_to_delta(1e-8, 1e-3) == 0.0 or gdp_to_delta(1e-8, 1e-3) < 1e-300
    assert gdp_to_delta(0.0, 0.0) == 0.0
    assert gdp_to_delta(0.0, 2.0) == 0.0


def test_lemma3_delta_decreases_in_epsilon_and_increases_in_mu() -> None:
    eps = np.linspace(0.0, 20.0, 81)
    assert strictly_decreasing([gdp_to_delta(2.0, float(e)) for e in eps])
    assert strictly_increasing([gdp_to_delta(float(mu), 1.0) for mu in np.linspace(0.1, 8.0, 60)])


# ------------------------------------------------------------------------------------------------------------
# Inverse of Lemma 3: ε(δ)
# ------------------------------------------------------------------------------------------------------------

ROUND_TRIP = [(0.05, 1e-2), (0.3, 1e-3), (1.0, 1e-5), (2.0, 1e-6), (5.0, 1e-10), (10.0, 1e-5), (1.0, 1e-300)]


@pytest.mark.parametrize(("mu", "delta"), ROUND_TRIP)
def test_epsilon_inverts_delta(mu: float, delta: float) -> None:
    eps = gdp_to_epsilon(mu, delta)
    assert eps > 0.0
    assert gdp_to_delta(mu, eps) == pytest.approx(delta, rel=1e-8)


@pytest.mark.parametrize(("mu", "eps"), [(0.3, 0.01), (1.0, 0.5), (1.0, 4.0), (3.0, 10.0), (8.0, 60.0)])
def test_delta_inverts_epsilon(mu: float, eps: float) -> None:
    assert gdp_to_epsilon(mu, gdp_to_delta(mu, eps)) == pytest.approx(eps, rel=1e-8)


def test_pinned_epsilon_mu1_delta1e5() -> None:
    eps = gdp_to_epsilon(1.0, 1e-5)
    assert round(eps, 4) == 4.3772
    assert eps == pytest.approx(PINNED_EPS_MU1_DELTA1E5, abs=1e-9)


def test_epsilon_is_zero_when_delta_reaches_delta_at_zero() -> None:
    mu = 0.5
    delta0 = 2.0 * norm.cdf(mu / 2.0) - 1.0  # ≈ 0.197
    assert gdp_to_epsilon(mu, delta0) == 0.0
    assert gdp_to_epsilon(mu, 0.5) == 0.0
    assert gdp_to_epsilon(mu, 1.0) == 0.0
    assert gdp_to_epsilon(0.0, 1e-5) == 0.0
    assert 0.0 < gdp_to_epsilon(mu, delta0 * 0.999) < 1e-2


def test_epsilon_monotone() -> None:
    assert strictly_increasing([gdp_to_epsilon(float(mu), 1e-5) for mu in np.linspace(0.1, 10.0, 50)])
    assert strictly_decreasing([gdp_to_epsilon(2.0, float(d)) for d in np.geomspace(1e-12, 1e-2, 30)])


@pytest.mark.parametrize("delta", [0.0, -1e-5, 1.5, float("nan")])
def test_epsilon_rejects_bad_delta(delta: float) -> None:
    with pytest.raises(ValueError, match="delta"):
        gdp_to_epsilon(1.0, delta)


def test_conversions_reject_negative_inputs() -> None:
    with pytest.raises(ValueError, match="mu"):
        gdp_to_delta(-0.1, 1.0)
    with pytest.raises(ValueError, match="epsilon"):
        gdp_to_delta(1.0, -1.0)
    with pytest.raises(ValueError, match="mu"):
        gdp_to_epsilon(float("inf"), 1e-5)


# ------------------------------------------------------------------------------------------------------------
# Lemma 4 (RDP) and Lemma 5 (composition)
# ------------------------------------------------------------------------------------------------------------


def test_lemma4_rdp() -> None:
    assert gdp_to_rdp(2.0, 3.0) == pytest.approx(6.0)
    assert gdp_to_rdp(0.5, 32.0) == pytest.approx(4.0)
    assert gdp_to_rdp(0.0, 2.0) == 0.0
    for order in (1.0, 0.5, 0.0):
        with pytest.raises(ValueError, match="order"):
            gdp_to_rdp(1.0, order)


def test_lemma5_composition() -> None:
    assert compose_gdp([3.0, 4.0]) == pytest.approx(5.0, rel=1e-15)
    for k in (1, 2, 10, 600):
        assert compose_gdp([0.7] * k) == pytest.approx(0.7 * math.sqrt(k), rel=1e-12)
    assert compose_gdp([]) == 0.0
    assert compose_gdp(np.array([1.0, 2.0, 2.0])) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        compose_gdp([1.0, -0.5])


def test_composition_then_conversion_is_conversion_of_composed_mu() -> None:
    mus = [0.3, 0.4, 1.2]  # √(0.09 + 0.16 + 1.44) = 1.3
    composed = compose_gdp(mus)
    assert composed == pytest.approx(1.3, rel=1e-14)
    for eps in (0.0, 0.5, 2.0):
        assert gdp_to_delta(composed, eps) == pytest.approx(_hockey_stick(1.3, eps, eps / 1.3 + 0.65), rel=1e-9)
    # RDP composes additively at a fixed order: Lemma 4 applied to the composed μ gives the sum.
    for order in (1.5, 2.0, 16.0):
        assert gdp_to_rdp(composed, order) == pytest.approx(sum(gdp_to_rdp(mu, order) for mu in mus), rel=1e-13)


# ------------------------------------------------------------------------------------------------------------
# The constants c (Thm 3b) and z (Thm 3d)
# ------------------------------------------------------------------------------------------------------------


def test_cyclic_constant_c() -> None:
    cs = []
    for K in range(1, 200):
        c = cyclic_constant_c(K)
        assert c * math.log(K + 1) == pytest.approx(harmonic(K), rel=1e-14)  # Σ_{k<K} 1/(k+1) = c ln(K+1)
        assert 1.0 <= c < 1.543  # the paper's stated range
        cs.append(c)
    assert cs[0] == pytest.approx(1.0 / math.log(2.0), rel=1e-15)
    assert strictly_decreasing(cs)
    assert cyclic_constant_c(10**7) == pytest.approx(1.0, abs=0.04)


@pytest.mark.parametrize("K", [1, 2, 3, 5, 10, 50])
def test_continuous_constant_z_bounds_every_round(K: int) -> None:
    z = continuous_constant_z(K)
    assert z > 1.0
    assert z == pytest.approx(harmonic(K) / math.log(2.0), rel=1e-14)
    for t in range(3000):
        accumulation = math.fsum(1.0 / (t * K + k + 1) for k in range(K))
        assert accumulation <= z * math.log((t + 2) / (t + 1)) * (1 + 1e-12), t
    assert math.fsum(1.0 / (k + 1) for k in range(K)) == pytest.approx(z * math.log(2.0), rel=1e-14)  # t = 0 tight


def test_harmonic_number_is_continuous_across_its_two_evaluations() -> None:
    # H_n is summed exactly up to n = 100000 and taken from the digamma function above.
    ln2 = math.log(2.0)
    step = continuous_constant_z(100_001) * ln2 - continuous_constant_z(100_000) * ln2
    assert step == pytest.approx(1.0 / 100_001, rel=1e-6)


# ------------------------------------------------------------------------------------------------------------
# Theorem 3 / Theorem 4 against Appendix G.3 with Table 2 written out
# ------------------------------------------------------------------------------------------------------------


def _h0(rhos: list[float], gammas: list[float]) -> float:
    """H_0 = (Σ_t P_t γ_t)² / Σ_t P_t², P_t = Π_{j=t+1}^{T-1} ρ_j (last display of Appendix G.3)."""
    T = len(rhos)
    P = [math.prod(rhos[t + 1 :]) for t in range(T)]
    return math.fsum(p * g for p, g in zip(P, gammas, strict=True)) ** 2 / math.fsum(p * p for p in P)


@pytest.mark.parametrize("T", [1, 2, 3, 7, 50])
def test_constant_schedule_is_eq15_and_the_h0_solution(T: int) -> None:
    lr, V, K, m, sigma, L = 0.05, 2.0, 4, 30, 0.2, 3.0
    mu = gdp_mu_noisy_fedavg("constant", lr=lr, V=V, K=K, m=m, sigma=sigma, L=L, T=T)
    rho = (1 + lr * L) ** K
    # Eq. (15) as printed.
    printed = 2 * lr * V * K / (math.sqrt(m) * sigma) * math.sqrt((rho + 1) / (rho - 1) * (rho**T - 1) / (rho**T + 1))
    # Table 2: ρ_t = (1 + lr·L)^K, γ_t = 2·lr·V·K/m; Theorem 1: μ = √m/σ · √H_0.
    derived = math.sqrt(m) / sigma * math.sqrt(_h0([rho] * T, [2 * lr * V * K / m] * T))
    assert mu == pytest.approx(printed, rel=1e-12)
    assert mu == pytest.approx(derived, rel=1e-12)
    if T == 1:  # one Gaussian release of sensitivity γ_0 with noise std σ/√m
        assert mu == pytest.approx(math.sqrt(m) / sigma * 2 * lr * V * K / m, rel=1e-14)


@pytest.mark.parametrize("T", [1, 2, 5, 40])
def test_cyclic_schedule_is_eq16_and_the_h0_solution(T: int) -> None:
    lr, V, K, m, sigma, L = 0.1, 1.5, 8, 12, 0.05, 2.0
    mu = gdp_mu_noisy_fedavg("cyclic", lr=lr, V=V, K=K, m=m, sigma=sigma, L=L, T=T)
    c = harmonic(K) / math.log(K + 1)
    rho = (1 + K) ** (c * lr * L)
    prefactor = 2 * c * V * math.log(K + 1) / (math.sqrt(m) * sigma)
    printed = prefactor * math.sqrt((rho + 1) / (rho - 1) * (rho**T - 1) / (rho**T + 1))
    derived = math.sqrt(m) / sigma * math.sqrt(_h0([rho] * T, [2 * c * V * math.log(K + 1) / m] * T))
    assert mu == pytest.approx(printed, rel=1e-12)
    assert mu == pytest.approx(derived, rel=1e-12)


@pytest.mark.parametrize("T", [1, 2, 10, 300])
def test_stagewise_and_continuous_bound_the_composition_and_h0(T: int) -> None:
    lr, V, K, m, sigma, L = 0.02, 3.0, 6, 25, 0.3, 1.5
    scale = math.sqrt(m) / sigma
    # Stage-wise (Table 2): ρ_t = (1 + lr·L/(t+1))^K, γ_t = 2·lr·V·K/(m(t+1)).
    rhos = [(1 + lr * L / (t + 1)) ** K for t in range(T)]
    gammas = [2 * lr * V * K / (m * (t + 1)) for t in range(T)]
    mu = gdp_mu_noisy_fedavg("stagewise", lr=lr, V=V, K=K, m=m, sigma=sigma, L=L, T=T)
    assert mu == pytest.approx(2 * lr * V * K / (math.sqrt(m) * sigma) * math.sqrt(2 - 1 / T), rel=1e-14)
    composition = scale * math.sqrt(math.fsum(g * g for g in gammas))
    assert mu >= composition * (1 - 1e-14)
    assert composition >= scale * math.sqrt(_h0(rhos, gammas)) * (1 - 1e-14)
    if T == 1:
        assert mu == pytest.approx(composition, rel=1e-14)
    else:
        assert mu > composition  # Eq. (17) is strict for T ≥ 2
    # Continuous (Table 2): ρ_t = ((t+2)/(t+1))^{z·lr·L}, γ_t = 2zV/m · ln((t+2)/(t+1)) (no lr, as printed).
    z = harmonic(K) / math.log(2.0)
    rhos = [((t + 2) / (t + 1)) ** (z * lr * L) for t in range(T)]
    gammas = [2 * z * V / m * math.log((t + 2) / (t + 1)) for t in range(T)]
    mu = gdp_mu_noisy_fedavg("continuous", lr=lr, V=V, K=K, m=m, sigma=sigma, L=L, T=T)
    assert mu == pytest.approx(2 * z * V / (math.sqrt(m) * sigma) * math.sqrt(2 - 1 / T), rel=1e-14)
    composition = scale * math.sqrt(math.fsum(g * g for g in gammas))
    assert mu >= composition * (1 - 1e-14)
    assert composition >= scale * math.sqrt(_h0(rhos, gammas)) * (1 - 1e-14)


@pytest.mark.parametrize("T", [1, 2, 6, 30])
def test_fedprox_is_eq19_and_the_h0_solution(T: int) -> None:
    V, m, sigma, L, alpha, lr = 4.0, 10, 0.5, 0.7, 1.9, 0.3
    mu = gdp_mu_noisy_fedprox(V=V, m=m, sigma=sigma, L=L, alpha=alpha, T=T, lr=lr)
    r = alpha / (alpha - L)
    printed = 2 * V / (math.sqrt(m) * alpha * sigma) * math.sqrt((2 * alpha - L) / L * (1 - 2 / (r**T + 1)))
    # Table 2: ρ_t = α/(α − L), γ_t = 2V/(mα).
    derived = math.sqrt(m) / sigma * math.sqrt(_h0([r] * T, [2 * V / (m * alpha)] * T))
    assert mu == pytest.approx(printed, rel=1e-12)
    assert mu == pytest.approx(derived, rel=1e-12)


def test_pinned_values_of_the_paper_setting() -> None:
    # Stage-wise, Sec. 5 setting: 2·0.01·10·5/(√20·0.1)·√(2 − 1/600).
    assert fedavg("stagewise") == pytest.approx(3.16095977, rel=1e-8)
    # FedProx α = 2, L = 1, T = 600 (saturated): 2·10/(√20·2·0.1)·√3.
    assert fedprox() == pytest.approx(20 / (math.sqrt(20) * 0.2) * math.sqrt(3.0), rel=1e-12)


# ------------------------------------------------------------------------------------------------------------
# Monotonicity
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", NOISY_SCHEDULES)
def test_fedavg_increases_in_V_and_K(schedule: str) -> None:
    assert strictly_increasing([fedavg(schedule, V=float(v)) for v in np.geomspace(0.01, 100.0, 25)])
    assert strictly_increasing([fedavg(schedule, K=k) for k in range(1, 60)])


@pytest.mark.parametrize("schedule", NOISY_SCHEDULES)
def test_fedavg_decreases_in_m_and_sigma(schedule: str) -> None:
    assert strictly_decreasing([fedavg(schedule, m=m) for m in range(1, 300, 7)])
    assert strictly_decreasing([fedavg(schedule, sigma=float(s)) for s in np.geomspace(1e-3, 10.0, 25)])


@pytest.mark.parametrize("schedule", NOISY_SCHEDULES)
def test_fedavg_nondecreasing_in_T(schedule: str) -> None:
    assert strictly_increasing([fedavg(schedule, T=t) for t in range(1, 200)])
    long = [fedavg(schedule, T=t) for t in (200, 10**3, 10**4, 10**6, 10**9)]
    assert bool(np.all(np.diff(long) >= 0))


@pytest.mark.parametrize("schedule", ["constant", "cyclic"])
def test_fedavg_printed_bound_decreases_in_L(schedule: str) -> None:
    # NOT "increases in L": in Eqs. (15)/(16) L enters only through ρ, and
    # ((ρ+1)/(ρ−1))·((ρ^T−1)/(ρ^T+1)) = tanh(T·lnρ/2)/tanh(lnρ/2) falls from T (ρ → 1) to 1 (ρ → ∞) for T ≥ 2.
    Ls = np.geomspace(0.01, 50.0, 30)
    assert strictly_decreasing([fedavg(schedule, L=float(L)) for L in Ls])
    assert strictly_decreasing([fedavg(schedule, L=float(L), T=2) for L in Ls])
    at_one = [fedavg(schedule, L=float(L), T=1) for L in Ls]  # a single round: the Gaussian mechanism, no L
    assert max(at_one) == pytest.approx(min(at_one), rel=1e-12)
    # Small L recovers plain composition of T equal rounds: μ → √T · μ(T=1).
    assert fedavg(schedule, L=1e-9, T=100) == pytest.approx(10 * fedavg(schedule, L=1e-9, T=1), rel=1e-6)


@pytest.mark.parametrize("schedule", ["stagewise", "continuous"])
def test_fedavg_decaying_schedules_do_not_depend_on_L(schedule: str) -> None:
    values = {fedavg(schedule, L=float(L)) for L in (0.01, 1.0, 100.0)}
    assert len(values) == 1


def test_fedprox_monotone() -> None:
    assert strictly_increasing([fedprox(V=float(v)) for v in np.geomspace(0.01, 100.0, 25)])
    assert strictly_decreasing([fedprox(m=m) for m in range(1, 300, 7)])
    assert strictly_decreasing([fedprox(sigma=float(s)) for s in np.geomspace(1e-3, 10.0, 25)])
    assert strictly_decreasing([fedprox(alpha=float(a)) for a in np.linspace(1.01, 60.0, 40)])
    assert strictly_decreasing([fedprox(alpha=float(a), T=3) for a in np.linspace(1.01, 60.0, 40)])
    # As for Thm 3(a), L enters Eq. (19) so that the printed μ decreases in L (T ≥ 2) and is L-free at T = 1.
    Ls = np.linspace(0.05, 1.95, 30)
    assert strictly_decreasing([fedprox(L=float(L)) for L in Ls])
    at_one = [fedprox(L=float(L), T=1) for L in Ls]
    assert max(at_one) == pytest.approx(min(at_one), rel=1e-12)
    assert strictly_increasing([fedprox(T=t) for t in range(1, 40)])
    assert bool(np.all(np.diff([fedprox(T=t) for t in (40, 10**3, 10**6, 10**9)]) >= 0))
    # No dependence on K or lr (within the theorem's conditions).
    assert fedprox(lr=1e-4) == fedprox(lr=0.99)


# ------------------------------------------------------------------------------------------------------------
# Convergence as T → ∞
# ------------------------------------------------------------------------------------------------------------


def test_fedprox_converges_to_closed_form_limit() -> None:
    V, m, sigma, L, alpha = PROX["V"], PROX["m"], PROX["sigma"], PROX["L"], PROX["alpha"]
    limit = 2 * V / (math.sqrt(m) * alpha * sigma) * math.sqrt((2 * alpha - L) / L)
    series = [fedprox(T=t) for t in (1, 2, 5, 10, 100, 10**3, 10**6, 10**9)]
    assert all(mu <= limit * (1 + 1e-14) for mu in series)
    assert fedprox(T=10**6) - fedprox(T=10**3) <= 1e-12 * limit
    assert fedprox(T=10**6) == pytest.approx(limit, rel=1e-12)
    # A slowly saturating case (ρ = α/(α−L) close to 1) is still bounded by its limit and approaches it.
    slow = {"alpha": 100.0, "L": 1.0}
    slow_limit = 2 * V / (math.sqrt(m) * 100.0 * sigma) * math.sqrt(199.0)
    assert fedprox(**slow, T=10**3) < fedprox(**slow, T=10**4) <= slow_limit * (1 + 1e-14)
    assert fedprox(**slow, T=10**6) == pytest.approx(slow_limit, rel=1e-12)


def test_constant_lr_fedavg_converges_to_closed_form_limit() -> None:
    lr, V, K, m, sigma, L = (BASE[k] for k in ("lr", "V", "K", "m", "sigma", "L"))
    rho = (1 + lr * L) ** K
    limit = 2 * lr * V * K / (math.sqrt(m) * sigma) * math.sqrt((rho + 1) / (rho - 1))
    series = [fedavg("constant", T=t) for t in (1, 10, 100, 10**3, 10**6, 10**9)]
    assert all(mu <= limit * (1 + 1e-14) for mu in series)
    assert fedavg("constant", T=10**6) == pytest.approx(limit, rel=1e-12)
    assert fedavg("constant", T=10**6) - fedavg("constant", T=10**3) <= 1e-12 * limit
    # "Convergent" vs plain composition of T rounds: the printed bound stays ~6.4x the one-round μ.
    assert limit / fedavg("constant", T=1) == pytest.approx(math.sqrt((rho + 1) / (rho - 1)), rel=1e-12)
    assert fedavg("constant", T=10**6) < 1e-2 * math.sqrt(10**6) * fedavg("constant", T=1)


def test_decaying_schedules_converge() -> None:
    for schedule in ("stagewise", "continuous"):
        limit = fedavg(schedule, T=1) * math.sqrt(2.0)  # √(2 − 1/T) → √2
        assert fedavg(schedule, T=10**9) < limit
        assert fedavg(schedule, T=10**9) == pytest.approx(limit, rel=1e-9)
    c = harmonic(BASE["K"]) / math.log(BASE["K"] + 1)
    rho = (1 + BASE["K"]) ** (c * BASE["lr"] * BASE["L"])
    assert fedavg("cyclic", T=10**9) == pytest.approx(fedavg("cyclic", T=1) * math.sqrt((rho + 1) / (rho - 1)))


# ------------------------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_fedprox_requires_alpha_above_L(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha > L"):
        fedprox(alpha=alpha, L=1.0)


@pytest.mark.parametrize("lr", [1.0, 1.5])
def test_fedprox_requires_lr_below_inverse_gap(lr: float) -> None:
    with pytest.raises(ValueError, match=r"lr < 1/\(alpha - L\)"):
        fedprox(alpha=2.0, L=1.0, lr=lr)
    assert fedprox(alpha=2.0, L=1.0, lr=0.999) > 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("sigma", 0.0),
        ("sigma", -0.1),
        ("sigma", float("nan")),
        ("K", 0),
        ("K", 2.5),
        ("K", True),
        ("T", 0),
        ("T", -3),
        ("m", 0),
        ("m", 0.5),
        ("V", 0.0),
        ("V", float("inf")),
        ("L", 0.0),
        ("lr", -0.01),
        ("lr", "0.1"),
    ],
)
@pytest.mark.parametrize("schedule", NOISY_SCHEDULES)
def test_fedavg_rejects_bad_parameters(schedule: str, name: str, value: object) -> None:
    with pytest.raises(ValueError, match=name):
        fedavg(schedule, **{name: value})


@pytest.mark.parametrize(("name", "value"), [("sigma", 0.0), ("T", 0), ("m", 0.0), ("alpha", -1.0), ("V", -1.0)])
def test_fedprox_rejects_bad_parameters(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=name):
        fedprox(**{name: value})


def test_integral_floats_are_accepted_as_counts() -> None:
    assert fedavg("constant", K=5.0, T=600.0) == fedavg("constant")
    assert fedavg("constant", m=20.0) == fedavg("constant")
    assert fedavg("constant", K=np.int64(5)) == fedavg("constant")


def test_unknown_schedule_and_algorithm() -> None:
    with pytest.raises(ValueError, match="schedule"):
        gdp_mu_noisy_fedavg("linear", **BASE)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="algorithm"):
        noisy_bound("fedsgd", "constant", **BASE, delta=1e-5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alpha"):
        noisy_bound("noisy_fedprox", "constant", **BASE, delta=1e-5)
    with pytest.raises(ValueError, match="delta"):
        noisy_bound("noisy_fedavg", "constant", **BASE, delta=1.0)


# ------------------------------------------------------------------------------------------------------------
# GDPBound / noisy_bound
# ------------------------------------------------------------------------------------------------------------


def test_noisy_bound_fedavg() -> None:
    bound = noisy_bound("noisy_fedavg", "stagewise", **BASE, delta=1e-5, alpha=5.0)
    assert isinstance(bound, GDPBound)
    assert bound.algorithm == "noisy_fedavg" and bound.schedule == "stagewise"
    assert bound.mu == fedavg("stagewise")
    assert gdp_to_delta(bound.mu, bound.epsilon) == pytest.approx(1e-5, rel=1e-8)
    assert bound.parameters["L"] == 1.0 and bound.parameters["T"] == 600
    assert "alpha" not in bound.parameters  # ignored for FedAvg
    text = bound.describe()
    assert "L = 1 (smoothness; an assumption, not measured)" in text
    assert "Eq. (17)" in text and f"{bound.mu:.6g}" in text and f"{bound.epsilon:.6g}" in text
    with pytest.raises(dataclasses.FrozenInstanceError):
        bound.mu = 0.0  # type: ignore[misc]


def test_noisy_bound_fedprox_and_rounds_so_far() -> None:
    per_round = [
        noisy_bound("noisy_fedprox", "constant", **{**BASE, "T": t}, delta=1e-5, alpha=2.0) for t in range(1, 30)
    ]
    assert strictly_increasing([b.mu for b in per_round])
    assert strictly_increasing([b.epsilon for b in per_round])
    last = per_round[-1]
    assert last.parameters["alpha"] == 2.0 and last.parameters["L"] == 1.0
    assert "Eq. (19)" in last.describe()
    assert "L = 1 (smoothness; an assumption, not measured)" in last.describe()
    assert noisy_bound("noisy_fedavg", "constant", **BASE, delta=1e-5).parameters["L"] == 1.0


# ------------------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------------------


def _printed(out: str, key: str) -> float:
    line = next(line for line in out.splitlines() if line.startswith(f"{key} = "))
    return float(line.split("=", 1)[1])


def test_cli_fedavg(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--algorithm",
        "noisy_fedavg",
        "--schedule",
        "stagewise",
        "--V",
        "10",
        "--K",
        "5",
        "--m",
        "20",
        "--sigma",
        "0.1",
        "--L",
        "1",
        "--T",
        "600",
        "--lr",
        "0.01",
        "--delta",
        "1e-5",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert _printed(out, "mu") == pytest.approx(fedavg("stagewise"), rel=1e-5)
    assert _printed(out, "epsilon") == pytest.approx(gdp_to_epsilon(fedavg("stagewise"), 1e-5), rel=1e-5)
    assert _printed(out, "delta") == pytest.approx(1e-5)
    assert "L = 1 (smoothness; an assumption, not measured)" in out


def test_cli_fedprox_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--algorithm", "noisy_fedprox", "--alpha", "2", "--L", "0.5", "--T", "50"]) == 0
    out = capsys.readouterr().out
    expected = gdp_mu_noisy_fedprox(V=10.0, m=20, sigma=0.1, L=0.5, alpha=2.0, T=50, lr=0.01)
    assert _printed(out, "mu") == pytest.approx(expected, rel=1e-5)
    assert "L = 0.5 (smoothness; an assumption, not measured)" in out

    assert main(["--algorithm", "noisy_fedprox", "--alpha", "0.5"]) == 2
    assert "alpha > L" in capsys.readouterr().err
    assert main(["--algorithm", "noisy_fedprox"]) == 2
    assert "alpha" in capsys.readouterr().err
    assert main(["--sigma", "0"]) == 2
    assert "sigma" in capsys.readouterr().err


def test_cli_defaults_and_module_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fl_app.privacy.fdp"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert _printed(proc.stdout, "mu") == pytest.approx(fedavg("stagewise"), rel=1e-5)  # defaults = BASE
    assert "(smoothness; an assumption, not measured)" in proc.stdout
