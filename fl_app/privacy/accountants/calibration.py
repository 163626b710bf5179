"""ε of one (σ, q, steps) setting (:func:`compute_epsilon`) and its inverse in σ: the noise multiplier that meets a
target ε (:func:`calibrate_noise_multiplier`, used for journal Table II); :func:`calibrate` is the search itself, for
any mechanism whose ε falls with σ (distributed DP's Skellam mechanism calibrates by it).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from fl_app.core.choices import AccountantName, AmplifiedSampling
from fl_app.privacy.accountants.checks import _check_config, _check_delta, _check_segment
from fl_app.privacy.accountants.composition import _MAX_BISECTIONS, epsilon_from_history

logger = logging.getLogger(__name__)

# Bracket limits for calibration; beyond them the target is treated as unreachable.
_SIGMA_MIN = 1e-3
_SIGMA_MAX = 1e6


def compute_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: AccountantName = "rdp",
    sampling: AmplifiedSampling = "poisson",
    population: int | None = None,
) -> float:
    """ε(δ) after ``steps`` rounds of the sampled Gaussian mechanism with noise multiplier σ and rate q.

    ``sampling='poisson'`` accounts Poisson sampling with rate q (docs/mechanisms.md, 1; Opacus RDP/PRV or dp_accounting
    PLD); ``sampling='fixed'`` accounts exactly m = qM of ``population`` clients without replacement (RDP
    only). σ = 0 gives ∞ (no noise, no privacy); 0 steps give 0.
    """
    return epsilon_from_history([(noise_multiplier, sample_rate, steps)], delta, accountant, sampling, population)


# ------------------------------------------------------------------------------------------------------------
# Calibration
# ------------------------------------------------------------------------------------------------------------


def _bracket(epsilon: Callable[[float], float], target: float, at: str, run: str) -> tuple[float, float]:
    """σ_low = σ_high / 2 with ε(σ_low) > ``target`` ≥ ε(σ_high), by doubling up from σ = 1 and halving down."""
    high = 1.0
    while epsilon(high) > target:
        high *= 2.0
        if high > _SIGMA_MAX:
            raise ValueError(f"target ε = {target} {at} is unreachable: even σ = {_SIGMA_MAX:g} gives a larger ε")
    low = high / 2.0
    while epsilon(low) <= target:
        high = low
        low /= 2.0
        if low < _SIGMA_MIN:
            raise ValueError(
                f"target ε = {target} is met by every σ ≥ {_SIGMA_MIN:g} {run}; calibration is meaningless"
            )
    return low, high


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: AccountantName = "rdp",
    sampling: AmplifiedSampling = "poisson",
    population: int | None = None,
    rel_tol: float = 0.005,
) -> float:
    """σ with target·(1 − rel_tol) ≤ ε(σ) ≤ target (an Opacus ``get_noise_multiplier``-style search).

    ε is decreasing in σ, so a geometric bracket followed by bisection finds it; the returned σ always
    satisfies ε(σ) ≤ target (the budget side), the lower bound only bounds how much budget is left unused.
    """
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise ValueError(f"target_epsilon must be a positive finite number, got {target_epsilon}")
    if not 0.0 < rel_tol < 1.0:
        raise ValueError(f"rel_tol must be in (0, 1), got {rel_tol}")
    _check_config(accountant, sampling, population)
    _check_delta(delta)
    _check_segment(1.0, sample_rate, steps)
    if steps == 0 or sample_rate == 0.0:
        raise ValueError("with no rounds or q = 0, ε = 0 for every σ: there is no noise multiplier to calibrate")

    def epsilon(sigma: float) -> float:
        return compute_epsilon(sigma, sample_rate, steps, delta, accountant, sampling, population)

    return calibrate(epsilon, target_epsilon, rel_tol, f"at δ = {delta}", f"(q = {sample_rate}, T = {steps})")


def calibrate(
    epsilon: Callable[[float], float], target_epsilon: float, rel_tol: float = 0.005, at: str = "", run: str = ""
) -> float:
    """σ with target·(1 − rel_tol) ≤ ``epsilon``(σ) ≤ target, for any ε(σ) decreasing in σ (a mechanism's ε after
    the run's rounds); ``at`` and ``run`` describe the setting in the errors of a target no σ meets or every σ
    meets."""
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise ValueError(f"target_epsilon must be a positive finite number, got {target_epsilon}")
    lower_target = target_epsilon * (1.0 - rel_tol)
    low, high = _bracket(epsilon, target_epsilon, at, run)
    # Invariant: ε(low) > target ≥ ε(high).
    eps_low, eps_high = epsilon(low), epsilon(high)
    if eps_high >= lower_target:
        return high
    return _refine(epsilon, (low, eps_low), (high, eps_high), target_epsilon, rel_tol)


def _refine(
    epsilon: Callable[[float], float],
    lower: tuple[float, float],
    upper: tuple[float, float],
    target_epsilon: float,
    rel_tol: float,
) -> float:
    """σ in the bracket (σ_low, ε_low), (σ_high, ε_high) with target·(1 − rel_tol) ≤ ε(σ) ≤ target, or the
    bracket's budget-safe end if ε jumps across that window."""
    (low, eps_low), (high, eps_high) = lower, upper
    lower_target = target_epsilon * (1.0 - rel_tol)
    # log ε is close to linear in log σ, so interpolating there (regula falsi, aimed at the middle of the
    # window) needs 2-4 accountant calls where bisection needs ~8; a bisection step follows whenever the same end
    # moved twice in a row, so the bracket always shrinks.
    aim = math.log(target_epsilon * (1.0 - rel_tol / 2.0))
    last_moved = ""
    for _ in range(_MAX_BISECTIONS):
        mid = 0.5 * (low + high)
        if last_moved != "twice" and math.isfinite(eps_low) and eps_low > 0 and eps_high > 0:
            slope = (math.log(eps_high) - math.log(eps_low)) / (math.log(high) - math.log(low))
            guess = math.exp(math.log(low) + (aim - math.log(eps_low)) / slope) if slope < 0 else mid
            width = high - low
            if low + 0.01 * width < guess < high - 0.01 * width:
                mid = guess
        eps_mid = epsilon(mid)
        moved = "low" if eps_mid > target_epsilon else "high"
        last_moved = "twice" if moved == last_moved else moved
        if moved == "low":
            low, eps_low = mid, eps_mid
        else:
            high, eps_high = mid, eps_mid
            if eps_mid >= lower_target:
                return mid
        if high - low <= 1e-12 * high:
            break
    # Only reachable if ε jumps across the window (e.g. PRV's ε-error): keep the budget-safe end.
    logger.warning(
        "calibration stopped at σ=%.6g with ε=%.6g, outside [%.6g, %.6g]",
        high,
        epsilon(high),
        lower_target,
        target_epsilon,
    )
    return high
