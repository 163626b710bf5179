"""The GDP parameter μ after T rounds of Noisy-FedAvg (Theorem 3 (a)–(d), Eqs. (15)–(18)) and of Noisy-FedProx
(Theorem 4, Eq. (19)) of Sun et al., "Convergent Differential Privacy Analysis for General Federated Learning"
(theorems, equations and appendices cited by the paper's own numbers).

The formulas are implemented as printed; where the printed paper departs from its own derivation (the missing
learning-rate factor of Eqs. (16) and (18), the Cauchy–Schwarz value behind Eqs. (15), (16), (19), Theorem 4's
condition on lr) see :mod:`fl_app.privacy.fdp`.
"""

from __future__ import annotations

import math

from fl_app.core.choices import NOISY_SCHEDULES, NoisySchedule
from fl_app.privacy.fdp.checks import _at_least_one, _count, _positive
from fl_app.privacy.fdp.constants import continuous_constant_z, cyclic_constant_c


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
