"""f-DP / Gaussian-DP bound calculator for Noisy-FedAvg and Noisy-FedProx (seed paper 004).

Paper: Y. Sun, Q. Zhang, L. Shen, D. Tao, "Convergent Differential Privacy Analysis for General Federated
Learning" (``/work/shared/papers/004_c0a88d0365c26a19.txt``; line numbers below refer to that text). Implemented,
as pinned down by ``SPEC.md`` §7 and ``SPEC_BASELINES.md`` (Noisy-FedAvg / Noisy-FedProx):

- Theorem 3 (a)–(d), Eqs. (15)–(18): the GDP parameter μ of Noisy-FedAvg after T rounds for the constant,
  cyclically decaying, stage-wise decaying and continuously decaying learning-rate schedules
  (:func:`gdp_mu_noisy_fedavg`);
- Theorem 4, Eq. (19): μ of Noisy-FedProx, α > L, η < 1/(α − L) (:func:`gdp_mu_noisy_fedprox`);
- Lemma 3, Eq. (20): μ-GDP ⇒ (ε, δ(ε))-DP (:func:`gdp_to_delta`) and its inverse ε(δ) (:func:`gdp_to_epsilon`);
- Lemma 4: μ-GDP ⇒ (ζ, ζμ²/2)-RDP (:func:`gdp_to_rdp`);
- Lemma 5: T_G(μ_1) ⊗ … ⊗ T_G(μ_n) = T_G(√Σμ_i²) (:func:`compose_gdp`).

Notation. The paper writes its learning-rate constant as μ (η_{k,t} = μ, μ/(k+1), μ/(t+1), μ/(tK+k+1)), which
clashes with the GDP parameter μ. Here the learning-rate constant is ``lr`` and ``mu`` is always the GDP parameter.
V is the per-step gradient clipping norm, K the local steps per round, m the number of clients averaged per round,
σ the *absolute* std of the Gaussian noise each client adds to its uploaded model (not a noise multiplier), T the
rounds so far, L the smoothness constant of every local objective (Assumption 1). L cannot be measured from a run:
it is an assumption supplied by the user, and :meth:`GDPBound.describe` always prints it as such.

Where the theorem reads "T(w_T; w'_T) ≥ T_G(s)" or "> T_G(s)", the value returned is s: the released model is at
least s-GDP (smaller s is stronger privacy).

Constants c and z (Appendix G.2, "Cyclically / Continuously decaying learning rates"):

- c (Thm 3b): the paper bounds Σ_{k=0}^{K-1} 1/(k+1) between ln(K+1) and 1 + ln K (Eq. (27), line 718) and then
  "approximate[s] this term to c ln(K+1) where c is a scaled constant ... 1 ≤ c < 1.543 for any K ≥ 1"
  (line 720). We take that definition exactly: c = H_K / ln(K+1), H_K = Σ_{k=1}^K 1/k (c = 1/ln 2 at K = 1,
  c → 1 as K → ∞; the 1.543 is the maximum of the upper bound (1 + ln K)/ln(K+1)).
- z (Thm 3d): the paper bounds Σ_{k=0}^{K-1} 1/(tK+k+1) and "let[s] it be z ln((t+2)/(t+1)) to include the term
  at t = 0 ... z > 1 is a constant for any K > 1" (line 748). A single constant valid for every round t ≥ 0 must
  be at least sup_t Σ_k 1/(tK+k+1) / ln((t+2)/(t+1)), which is attained at t = 0, so z = H_K / ln 2 (the
  smallest such constant; > 1 for every K ≥ 1). ``tests/privacy/test_fdp.py`` checks the inequality for all t.

Deviations of the printed paper from its own derivation (implemented as printed; see also the report):

- Eqs. (16) and (18) (and Table 2's γ_t for these schedules) carry no learning-rate factor, although Lemma 7
  (Eq. (25)) gives γ_t = (2V/m) Σ_k η_{k,t} and the text says Σ_k η_{k,t} = c·lr·ln(K+1) (line 720). The printed
  bounds are therefore 1/lr times the derived ones: more conservative (larger μ) whenever lr ≤ 1. Eq. (18) does not
  depend on lr or L at all, and Eq. (17) does not depend on L.
- Table 1 prints the denominators as √(mσ) and √(mασ); Eqs. (15)–(19) have √m·σ and √m·α·σ. The equations, which
  follow from Theorem 1 (√m/σ) and Table 2 (γ_t ∝ 1/m, 1/(mα)), are used.
- Eqs. (15), (16), (19) come from the Cauchy–Schwarz value H_0 = (Σ_t P_t γ_t)² / Σ_t P_t², P_t = Π_{j>t} ρ_j
  (Appendix G.3, lines 895–903). Its equality case needs λ_{t+1} ∝ P_t / (ρ_t‖w_t − w̃_t‖ + γ_t), which exceeds 1
  when ρ_t > 1 (always so here: ρ_t = (1+lr·L)^K, (1+K)^{c·lr·L}, α/(α−L)), whereas the interpolation requires
  0 ≤ λ_t ≤ 1 (Eq. (9), line 148). With λ constrained to [0, 1] the minimum of Eq. (13) for expansive ρ is the plain
  composition value Σ_t γ_t² (λ ≡ 1), which grows with T. So these "convergent" values are the paper's formulas,
  not a bound this module can vouch for; a side effect is that they *decrease* as L grows (for T ≥ 2), because a
  larger ρ concentrates the Cauchy–Schwarz weights on the last round. Eqs. (17) and (18) are instead obtained from
  H_0 ≤ Σ_t γ_t² ≤ γ_0²(2 − 1/T), i.e. they are composition bounds and do not have this problem.
- Theorem 4 assumes only lr < 1/(α − L), but Lemma 9 uses 1 − lr·α ≥ 0 (line 793), i.e. lr ≤ 1/α; only the
  theorem's stated condition is enforced.

Everything here is pure math on Python floats (numpy/scipy only); no global state.
"""

from __future__ import annotations

import argparse
import math
import numbers
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy.special import digamma, log_ndtr, ndtri

from fl_app.choices import NOISY_SCHEDULES, NoisySchedule

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "GDPBound",
    "compose_gdp",
    "continuous_constant_z",
    "cyclic_constant_c",
    "gdp_mu_noisy_fedavg",
    "gdp_mu_noisy_fedprox",
    "gdp_to_delta",
    "gdp_to_epsilon",
    "gdp_to_rdp",
    "main",
    "noisy_bound",
]

Algorithm = Literal["noisy_fedavg", "noisy_fedprox"]
ALGORITHMS: tuple[str, ...] = ("noisy_fedavg", "noisy_fedprox")

_EQUATION = {
    ("noisy_fedavg", "constant"): "Thm 3(a), Eq. (15)",
    ("noisy_fedavg", "cyclic"): "Thm 3(b), Eq. (16)",
    ("noisy_fedavg", "stagewise"): "Thm 3(c), Eq. (17)",
    ("noisy_fedavg", "continuous"): "Thm 3(d), Eq. (18)",
}
_SCHEDULE_FORM = {
    "constant": "eta = lr",
    "cyclic": "eta = lr/(k+1)",
    "stagewise": "eta = lr/(t+1)",
    "continuous": "eta = lr/(tK+k+1)",
}


# ------------------------------------------------------------------------------------------------------------
# Validation helpers
# ------------------------------------------------------------------------------------------------------------


def _positive(name: str, value: Any) -> float:
    """``value`` as a float that is finite and > 0, else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a positive real number, got {value!r}")
    x = float(value)
    if not math.isfinite(x) or x <= 0.0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return x


def _at_least_one(name: str, value: Any) -> float:
    """``value`` as a float that is finite and ≥ 1 (m: clients averaged; need not be an integer, e.g. m = qM)."""
    x = _positive(name, value)
    if x < 1.0:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
    return x


def _count(name: str, value: Any) -> int:
    """``value`` as an int ≥ 1 (integral floats such as 600.0 are accepted), else ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    integral = isinstance(value, numbers.Integral) or (
        isinstance(value, numbers.Real) and math.isfinite(float(value)) and float(value).is_integer()
    )
    if not integral or int(value) < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _nonnegative(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a non-negative real number, got {value!r}")
    x = float(value)
    if not math.isfinite(x) or x < 0.0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    return x


def _harmonic(n: int) -> float:
    """H_n = Σ_{k=1}^n 1/k (exact summation for small n, ψ(n+1) + γ otherwise)."""
    if n <= 100_000:
        return math.fsum(1.0 / k for k in range(1, n + 1))
    return float(digamma(n + 1.0) + np.euler_gamma)


# ------------------------------------------------------------------------------------------------------------
# The paper's constants c and z
# ------------------------------------------------------------------------------------------------------------


def cyclic_constant_c(K: int) -> float:
    """c of Thm 3(b): Σ_{k=0}^{K-1} 1/(k+1) = c·ln(K+1), i.e. c = H_K / ln(K+1) (Eq. (27) and line 720).

    1 ≤ c ≤ 1/ln 2 ≈ 1.4427 (the paper states 1 ≤ c < 1.543, the maximum of its upper bound (1 + ln K)/ln(K+1)).
    """
    K = _count("K", K)
    return _harmonic(K) / math.log(K + 1.0)


def continuous_constant_z(K: int) -> float:
    """z of Thm 3(d): the constant with Σ_{k=0}^{K-1} 1/(tK+k+1) ≤ z·ln((t+2)/(t+1)) for every round t ≥ 0.

    The paper (line 748) sets the accumulation term to z·ln((t+2)/(t+1)) "to include the term at t = 0" with z > 1
    a constant; the ratio is largest at t = 0, so the smallest valid constant is z = H_K / ln 2.
    """
    K = _count("K", K)
    return _harmonic(K) / math.log(2.0)


# ------------------------------------------------------------------------------------------------------------
# Theorem 3 and Theorem 4
# ------------------------------------------------------------------------------------------------------------


def _interpolation_factor(log_rho: float, T: int) -> float:
    """((ρ+1)/(ρ−1))·((ρ^T−1)/(ρ^T+1)) = tanh(T·ln ρ/2) / tanh(ln ρ/2), overflow-free for large T.

    Equals 1 at T = 1, increases to coth(ln ρ/2) = (ρ+1)/(ρ−1) as T → ∞, and → T as ρ → 1.
    """
    half = 0.5 * log_rho
    if half == 0.0:  # ρ == 1 in floating point: the limit of the expression
        return float(T)
    return math.tanh(T * half) / math.tanh(half)


def gdp_mu_noisy_fedavg(
    schedule: NoisySchedule,
    *,
    lr: float,
    V: float,
    K: int,
    m: float,
    sigma: float,
    L: float,
    T: int,
) -> float:
    """μ such that Noisy-FedAvg's global model after T rounds is μ-GDP, Theorem 3 (a)–(d), Eqs. (15)–(18).

    With ρ the per-round model-sensitivity factor of Table 2 and tanh-ratio F_T(ρ) = ((ρ+1)/(ρ−1))·((ρ^T−1)/(ρ^T+1)):

    - ``constant``   η = lr, Eq. (15):        μ = 2·lr·V·K/(√m·σ) · √F_T((1+lr·L)^K)
    - ``cyclic``     η = lr/(k+1), Eq. (16):  μ = 2·c·V·ln(K+1)/(√m·σ) · √F_T((1+K)^{c·lr·L}),  c = H_K/ln(K+1)
    - ``stagewise``  η = lr/(t+1), Eq. (17):  μ = 2·lr·V·K/(√m·σ) · √(2 − 1/T)
    - ``continuous`` η = lr/(tK+k+1), Eq. (18): μ = 2·z·V/(√m·σ) · √(2 − 1/T),  z = H_K/ln 2

    Args:
        schedule: learning-rate schedule of the local steps (the paper's η_{k,t}).
        lr: the paper's learning-rate constant μ (> 0).
        V: per-step gradient clipping norm (> 0).
        K: local steps per round (integer ≥ 1).
        m: clients averaged per round (≥ 1; Remark 3.2: under partial participation the participants).
        sigma: absolute std of the Gaussian noise added to each uploaded model (> 0).
        L: assumed smoothness constant of the local objectives (> 0); not measurable, an assumption.
        T: communication rounds so far (integer ≥ 1).

    Raises:
        ValueError: unknown schedule or a parameter out of range.
    """
    if schedule not in NOISY_SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(NOISY_SCHEDULES)}; got {schedule!r}")
    lr = _positive("lr", lr)
    V = _positive("V", V)
    K = _count("K", K)
    m = _at_least_one("m", m)
    sigma = _positive("sigma", sigma)
    L = _positive("L", L)
    T = _count("T", T)
    scale = 1.0 / (math.sqrt(m) * sigma)  # √m/σ (Theorem 1) times the 1/m of every γ_t (Table 2)

    if schedule == "constant":
        log_rho = K * math.log1p(lr * L)  # ρ = (1 + lr·L)^K
        return 2.0 * lr * V * K * scale * math.sqrt(_interpolation_factor(log_rho, T))
    if schedule == "cyclic":
        c = cyclic_constant_c(K)
        log_rho = c * lr * L * math.log(K + 1.0)  # ρ = (1 + K)^{c·lr·L}
        return 2.0 * c * V * math.log(K + 1.0) * scale * math.sqrt(_interpolation_factor(log_rho, T))
    if schedule == "stagewise":
        return 2.0 * lr * V * K * scale * math.sqrt(2.0 - 1.0 / T)
    z = continuous_constant_z(K)
    return 2.0 * z * V * scale * math.sqrt(2.0 - 1.0 / T)


def gdp_mu_noisy_fedprox(
    *,
    V: float,
    m: float,
    sigma: float,
    L: float,
    alpha: float,
    T: int,
    lr: float,
) -> float:
    """μ such that Noisy-FedProx's global model after T rounds is μ-GDP, Theorem 4, Eq. (19).

        μ = 2V/(√m·α·σ) · √( (2α − L)/L · (1 − 2/((α/(α−L))^T + 1)) )

    It does not depend on K or on lr (lr only has to satisfy the theorem's condition); it increases with T to the
    limit 2V/(√m·α·σ)·√((2α − L)/L). Evaluated as tanh(T·ln(α/(α−L))/2) so that large T cannot overflow.

    Raises:
        ValueError: a parameter out of range, alpha ≤ L, or lr ≥ 1/(alpha − L) (the conditions of Theorem 4).
    """
    V = _positive("V", V)
    m = _at_least_one("m", m)
    sigma = _positive("sigma", sigma)
    L = _positive("L", L)
    alpha = _positive("alpha", alpha)
    T = _count("T", T)
    lr = _positive("lr", lr)
    if not alpha > L:
        raise ValueError(
            f"Theorem 4 requires alpha > L (proximal coefficient above smoothness); got alpha={alpha}, L={L}"
        )
    if not lr * (alpha - L) < 1.0:
        raise ValueError(
            f"Theorem 4 requires lr < 1/(alpha - L) = {1.0 / (alpha - L):.6g}; got lr={lr}, alpha={alpha}, L={L}"
        )
    log_ratio = -math.log1p(-L / alpha)  # ln(α/(α−L)) > 0
    saturation = math.tanh(0.5 * T * log_ratio)  # = 1 − 2/((α/(α−L))^T + 1)
    return 2.0 * V / (math.sqrt(m) * alpha * sigma) * math.sqrt((2.0 * alpha - L) / L * saturation)


# ------------------------------------------------------------------------------------------------------------
# Conversions (Appendix E, Lemmas 3–5; Dong, Roth & Su 2022)
# ------------------------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------------------------
# Result object used by the server each round
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GDPBound:
    """A μ-GDP bound for Noisy-FedAvg / Noisy-FedProx and the (ε, δ)-DP it implies (Lemma 3).

    ``parameters`` holds the inputs of the bound, including the *assumed* smoothness ``L``.
    """

    algorithm: str
    schedule: str
    parameters: dict[str, float]
    mu: float
    epsilon: float
    delta: float

    def describe(self) -> str:
        """A few human-readable lines; the last states L and that it is an assumption."""
        p = self.parameters
        if self.algorithm == "noisy_fedprox":
            source = "Thm 4, Eq. (19)"
            name = "Noisy-FedProx"
        else:
            source = _EQUATION.get((self.algorithm, self.schedule), "Thm 3")
            name = "Noisy-FedAvg"
        shown = ", ".join(f"{k}={v:g}" for k, v in p.items() if k != "L")
        lines = [
            f"{name} ({self.schedule} schedule, {_SCHEDULE_FORM.get(self.schedule, '?')}), "
            f"Sun et al. {source}: mu-GDP with mu = {self.mu:.6g}",
            f"  => (epsilon, delta)-DP with epsilon = {self.epsilon:.6g} at delta = {self.delta:.3g} (Lemma 3)",
            f"  parameters: {shown}",
            f"  L = {p.get('L', float('nan')):g} (smoothness; an assumption, not measured)",
        ]
        return "\n".join(lines)


def noisy_bound(
    algorithm: Algorithm,
    schedule: NoisySchedule,
    *,
    lr: float,
    V: float,
    K: int,
    m: float,
    sigma: float,
    L: float,
    T: int,
    delta: float,
    alpha: float | None = None,
) -> GDPBound:
    """μ after T rounds (Thm 3 or Thm 4) and the ε it implies at ``delta`` (Lemma 3), as a :class:`GDPBound`.

    ``alpha`` is required for ``noisy_fedprox`` and ignored for ``noisy_fedavg``. For Noisy-FedProx the schedule is
    only recorded: Theorem 4 holds for any non-increasing schedule (Table 2) and its bound does not depend on it,
    the condition lr < 1/(alpha − L) being on the largest step, lr.

    Raises:
        ValueError: unknown algorithm or schedule, a parameter out of range, a missing alpha, or a violated
            condition of Theorem 4.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}")
    if schedule not in NOISY_SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(NOISY_SCHEDULES)}; got {schedule!r}")
    if not (isinstance(delta, numbers.Real) and 0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    K_int = _count("K", K)
    T_int = _count("T", T)
    parameters: dict[str, float] = {
        "lr": float(lr),
        "V": float(V),
        "K": K_int,
        "m": float(m),
        "sigma": float(sigma),
        "T": T_int,
    }
    if algorithm == "noisy_fedprox":
        if alpha is None:
            raise ValueError("noisy_fedprox needs alpha (the proximal coefficient, alpha > L)")
        mu = gdp_mu_noisy_fedprox(V=V, m=m, sigma=sigma, L=L, alpha=alpha, T=T_int, lr=lr)
        parameters["alpha"] = float(alpha)
    else:
        mu = gdp_mu_noisy_fedavg(schedule, lr=lr, V=V, K=K_int, m=m, sigma=sigma, L=L, T=T_int)
    parameters["L"] = float(L)
    return GDPBound(
        algorithm=algorithm,
        schedule=schedule,
        parameters=parameters,
        mu=mu,
        epsilon=gdp_to_epsilon(mu, float(delta)),
        delta=float(delta),
    )


# ------------------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fl_app.privacy.fdp",
        description=(
            "Gaussian-DP (f-DP) bound of Noisy-FedAvg (Thm 3) / Noisy-FedProx (Thm 4) of Sun et al., converted to "
            "(epsilon, delta)-DP by Lemma 3. Defaults are the paper's Sec. 5 setting (Fig. 2: m=20, K=5, V=10; "
            "stage-wise decay; T=600 as in Table 5; sigma=0.1 from Table 4), lr=0.01, L=1 (an assumption), "
            "delta=1e-5."
        ),
    )
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="noisy_fedavg", help="default: noisy_fedavg")
    parser.add_argument("--schedule", choices=NOISY_SCHEDULES, default="stagewise", help="default: stagewise")
    parser.add_argument("--V", type=float, default=10.0, help="gradient clipping norm (default 10)")
    parser.add_argument("--K", type=int, default=5, help="local steps per round (default 5)")
    parser.add_argument("--m", type=float, default=20.0, help="clients averaged per round (default 20)")
    parser.add_argument("--sigma", type=float, default=0.1, help="absolute noise std per client (default 0.1)")
    parser.add_argument("--L", type=float, default=1.0, help="assumed smoothness constant (default 1)")
    parser.add_argument("--T", type=int, default=600, help="communication rounds (default 600)")
    parser.add_argument("--lr", type=float, default=0.01, help="learning-rate constant of the schedule (default 0.01)")
    parser.add_argument("--delta", type=float, default=1e-5, help="target delta (default 1e-5)")
    parser.add_argument("--alpha", type=float, default=None, help="proximal coefficient (noisy_fedprox; > L)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Print μ, ε(δ), δ and the L assumption; return 0, or 2 (message on stderr) for invalid parameters."""
    args = _parser().parse_args(argv)
    try:
        bound = noisy_bound(
            args.algorithm,
            args.schedule,
            lr=args.lr,
            V=args.V,
            K=args.K,
            m=args.m,
            sigma=args.sigma,
            L=args.L,
            T=args.T,
            delta=args.delta,
            alpha=args.alpha,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"mu = {bound.mu:.6g}")
    print(f"epsilon = {bound.epsilon:.6g}")
    print(f"delta = {bound.delta:.3g}")
    print(bound.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
