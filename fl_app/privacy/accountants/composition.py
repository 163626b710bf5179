"""ε(δ) and δ(ε) of a history of (σ, q, rounds) segments of the sampled Gaussian mechanism, and their caches.

- Poisson sampling: RDP through Opacus (``RDPAccountant``'s orders and curve, each round's curve memoised), Opacus'
  ``PRVAccountant``, or dp_accounting's ``PLDAccountant``.
- Fixed-size sampling (m of M without replacement): dp_accounting's ``SampledWithoutReplacementDpEvent`` under
  replace-one adjacency with its RDP accountant, multiplier σ/2 (:data:`REPLACE_ONE_SENSITIVITY_FACTOR`).
- δ(ε): dp_accounting's ``compute_delta`` (RDP) and ``get_delta`` (PLD), a search on ε(δ) for PRV.

No privacy math is written here: every ε and δ comes from Opacus or dp_accounting.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from fl_app.core.choices import AccountantName, AmplifiedSampling
from fl_app.core.quiet_import import import_opacus
from fl_app.privacy.accountants.checks import (
    Segment,
    _check_config,
    _check_delta,
    _check_segment,
    fixed_sample_size,
)

# Opacus and dp_accounting are imported in the functions that call them: importing Opacus' package loads its
# optimizers and torch.distributed (~1 s on the 2-core machine, dp_accounting's ~0.3 s more), which a run needs
# once it accounts a round, not on its way to starting Ray and the workers (docs/performance.md, startup).

# dp_accounting's PLD is a pessimistic (upper-bound) discretisation whatever the interval; 1e-3 gives the same
# ε as its 1e-4 default to 1e-4 at q=0.1, σ=0.95, T=300 and is ~10x faster (0.07 s instead of 0.8 s).
_PLD_DISCRETIZATION = 1e-3

# Replacing one client's clipped update (norm <= C) by another moves the sum by up to 2C.
REPLACE_ONE_SENSITIVITY_FACTOR = 2.0

_MAX_BISECTIONS = 200  # search steps (interpolation or bisection)


# ------------------------------------------------------------------------------------------------------------
# ε of a history
# ------------------------------------------------------------------------------------------------------------


def epsilon_from_history(
    history: Sequence[Segment],
    delta: float,
    accountant: AccountantName = "rdp",
    sampling: AmplifiedSampling = "poisson",
    population: int | None = None,
) -> float:
    """ε(δ) after composing every (σ, q, rounds) segment of ``history``, heterogeneous segments included.

    A segment with σ = 0 and at least one round is not private (ε = ∞); segments with no rounds or q = 0 cost
    nothing. See the module docstring for which library accounts which (accountant, sampling) pair.
    """
    return epsilon_and_order_from_history(history, delta, accountant, sampling, population)[0]


def epsilon_and_order_from_history(
    history: Sequence[Segment],
    delta: float,
    accountant: AccountantName = "rdp",
    sampling: AmplifiedSampling = "poisson",
    population: int | None = None,
) -> tuple[float, float | None]:
    """:func:`epsilon_from_history` and, for RDP, the order α at which the conversion to (ε, δ) is tightest
    (None for PRV and PLD, and where no segment costs anything)."""
    _check_config(accountant, sampling, population)
    _check_delta(delta)
    segments = _costly_segments(history)
    if segments is None:
        return math.inf, None
    if not segments:
        return 0.0, None
    size = None if population is None else int(population)
    return _cached_epsilon(segments, float(delta), accountant, sampling, size)


def _costly_segments(history: Sequence[Segment]) -> tuple[Segment, ...] | None:
    """The validated segments that cost anything, as floats and ints; None if one is not private (σ = 0)."""
    segments: list[Segment] = []
    for noise_multiplier, sample_rate, steps in history:
        _check_segment(noise_multiplier, sample_rate, steps)
        if steps == 0 or sample_rate == 0.0:
            continue
        if noise_multiplier == 0.0:
            return None
        segments.append((float(noise_multiplier), float(sample_rate), int(steps)))
    return tuple(segments)


# Budget guards ask for ε(T) and ε(T+1) every round, and PRV/PLD cost ~0.1–0.3 s, so results are memoised on
# the (immutable, already validated) arguments.
@functools.lru_cache(maxsize=1024)
def _cached_epsilon(
    segments: tuple[Segment, ...],
    delta: float,
    accountant: str,
    sampling: str,
    population: int | None,
) -> tuple[float, float | None]:
    if sampling == "fixed":
        assert population is not None  # guaranteed by _check_config
        return _fixed_rdp_epsilon(segments, delta, population)
    if accountant == "rdp":
        # Opacus' RDPAccountant.get_privacy_spent, with the per-round RDP curve of each (σ, q) memoised: RDP
        # composes additively, so T rounds cost T times one round's curve (compute_rdp itself multiplies by
        # steps), and a run's ε(T) and ε(T + 1) every round cost a sum instead of ~0.1 s of series each.
        rdp = _poisson_rdp(segments)
        # Opacus warns whenever the optimal order sits at the edge of its grid, which happens for every
        # large-ε setting (e.g. while calibration brackets σ); the bound is still valid, so the warning is
        # only noise.
        import_opacus()  # without the root logging handler Opacus adds (fl_app/core/quiet_import.py)
        from opacus.accountants import RDPAccountant
        from opacus.accountants.analysis import rdp as opacus_rdp

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Optimal order is the (largest|smallest) alpha")
            eps, order = opacus_rdp.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
            return float(eps), _order_or_none(order)
    if accountant == "prv":
        import_opacus()  # without the root logging handler Opacus adds (fl_app/core/quiet_import.py)
        from opacus.accountants import PRVAccountant

        prv = PRVAccountant()
        prv.history = list(segments)
        return float(prv.get_epsilon(delta)), None
    return float(_poisson_pld(segments).get_epsilon(delta)), None


def _order_or_none(order: float) -> float | None:
    order = float(order)
    return order if math.isfinite(order) else None


def _poisson_rdp(segments: Sequence[Segment]) -> np.ndarray:
    """The RDP curve of the Poisson-sampled segments on Opacus' default orders."""
    return sum(steps * _poisson_rdp_per_round(sigma, q) for sigma, q, steps in segments)  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------------------------
# δ of a history
# ------------------------------------------------------------------------------------------------------------

# δ by search on ε(δ) (PRV): relative width of the final bracket, and the range searched.
_DELTA_REL_TOL = 1e-4
_DELTA_MIN, _DELTA_MAX = 1e-15, 0.5


def delta_from_history(
    history: Sequence[Segment],
    epsilon: float,
    accountant: AccountantName = "rdp",
    sampling: AmplifiedSampling = "poisson",
    population: int | None = None,
) -> float:
    """δ(ε) after composing every segment of ``history``: the inverse of :func:`epsilon_from_history`.

    - RDP: dp_accounting's ``compute_delta`` on the same RDP curve (Opacus' orders and curve for Poisson sampling,
      dp_accounting's for fixed-size): Proposition 12 of Canonne, Kamath, Steinke 2020, the bound whose inverse
      Opacus' and dp_accounting's ε conversions are, so δ(ε(δ)) = δ; it also takes the KL bound
      δ ≤ √(1 − e^(−RDP)) where that is smaller (only for δ near 1).
    - PLD: dp_accounting's ``PLDAccountant.get_delta`` on the same discretised privacy-loss distribution.
    - PRV: Opacus' PRV accountant has no δ(ε) with an error bound, so δ is searched on log δ over ε(δ)
      (decreasing in δ): a bracket around RDP's δ(ε), then regula falsi until the bracket is 1e-4 wide relative to
      δ (or ε is met to 1e-9), returning its upper end: the δ with ε(δ) ≤ ``epsilon``, a sound (ε, δ) pair. δ
      below 1e-15 is reported as 1e-15, and 1.0 when no δ ≤ 1/2 gives ``epsilon`` (PRV's discretisation cannot
      resolve δ near 1). About 2 s (6-10 PRV evaluations).

    σ = 0 in a segment that costs anything gives δ = 1 (no noise: no ε holds with δ < 1); no rounds give 0.
    """
    _check_config(accountant, sampling, population)
    if isinstance(epsilon, bool) or not (epsilon >= 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a non-negative finite number, got {epsilon}")
    segments = _costly_segments(history)
    if segments is None:
        return 1.0
    if not segments:
        return 0.0
    size = None if population is None else int(population)
    return _cached_delta(segments, float(epsilon), accountant, sampling, size)


@functools.lru_cache(maxsize=256)
def _cached_delta(
    segments: tuple[Segment, ...],
    epsilon: float,
    accountant: str,
    sampling: str,
    population: int | None,
) -> float:
    from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp

    if sampling == "fixed":
        assert population is not None
        orders, rdp = _fixed_rdp(segments, population)
        return float(dp_rdp.compute_delta(orders, rdp, epsilon)[0])
    if accountant == "rdp":
        import_opacus()  # without the root logging handler Opacus adds (fl_app/core/quiet_import.py)
        from opacus.accountants import RDPAccountant

        return float(dp_rdp.compute_delta(RDPAccountant.DEFAULT_ALPHAS, _poisson_rdp(segments), epsilon)[0])
    if accountant == "pld":
        return float(_poisson_pld(segments).get_delta(epsilon))
    return _search_delta(segments, epsilon, accountant, sampling, population)


def _search_delta(
    segments: tuple[Segment, ...], epsilon: float, accountant: str, sampling: str, population: int | None
) -> float:
    """The δ with ε(δ) = ``epsilon`` for an accountant that only gives ε(δ) (PRV): a bracket in log δ around RDP's
    δ(ε), then regula falsi (Illinois) on ε against log δ; the bracket's upper end is returned, ε(δ) ≤ epsilon."""
    target = epsilon

    def excess(log_delta: float) -> float:
        try:
            return _cached_epsilon(segments, math.exp(log_delta), accountant, sampling, population)[0] - target
        except (ValueError, RuntimeError):  # PRV refuses a δ its discretisation cannot resolve: treat as too small
            return math.inf

    lowest, highest = math.log(_DELTA_MIN), math.log(_DELTA_MAX)
    seed = _cached_delta(segments, epsilon, "rdp", sampling, population)  # the RDP bound: PRV's δ is close below
    x_hi = min(max(math.log(max(seed, _DELTA_MIN)), lowest), highest)
    f_hi = excess(x_hi)
    while f_hi > 0:
        if x_hi >= highest:
            return 1.0
        x_hi = min(x_hi + math.log(10.0), highest)
        f_hi = excess(x_hi)
    x_lo = max(x_hi - math.log(10.0), lowest)
    f_lo = excess(x_lo)
    while f_lo <= 0:
        if x_lo <= lowest:
            return _DELTA_MIN
        x_hi, f_hi = x_lo, f_lo
        x_lo = max(x_lo - math.log(10.0), lowest)
        f_lo = excess(x_lo)
    # Invariant: ε(e^x_lo) > epsilon ≥ ε(e^x_hi).
    last = ""
    for _ in range(_MAX_BISECTIONS):
        if x_hi - x_lo <= math.log1p(_DELTA_REL_TOL) or f_hi >= -1e-9 * max(target, 1.0):
            break
        x = 0.5 * (x_lo + x_hi)
        if math.isfinite(f_lo) and f_lo != f_hi:
            secant = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
            if x_lo < secant < x_hi:
                x = secant
        f = excess(x)
        if f > 0:
            x_lo, f_lo = x, f
            if last == "low":
                f_hi /= 2.0  # Illinois: the end that stayed twice counts half, so both ends move
            last = "low"
        else:
            x_hi, f_hi = x, f
            if last == "high":
                f_lo /= 2.0
            last = "high"
    return math.exp(x_hi)


def _poisson_pld(segments: Sequence[Segment]) -> Any:
    """dp_accounting's PLD accountant with the Poisson-sampled segments composed."""
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    pld = PLDAccountant(value_discretization_interval=_PLD_DISCRETIZATION)
    pld.compose(
        dp_accounting.ComposedDpEvent(
            [
                dp_accounting.SelfComposedDpEvent(
                    dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(sigma)),
                    steps,
                )
                for sigma, sample_rate, steps in segments
            ]
        )
    )
    return pld


def _fixed_rdp_epsilon(segments: Sequence[Segment], delta: float, population: int) -> tuple[float, float | None]:
    """RDP of sampling m of M without replacement (Wang, Balle, Kasiviswanathan 2019, Thm 27), replace-one.

    dp_accounting defines the event's noise multiplier relative to the L2 sensitivity under *replace-one*
    adjacency. Replacing one client's clipped update moves the sum by up to 2C (not C), and the noise std on the
    sum is σC, so the multiplier handed to dp_accounting is σ/2 (:data:`REPLACE_ONE_SENSITIVITY_FACTOR`).
    The same event at multiplier σ gives 22.47 for M=500, m=50, σ=0.95, T=300, i.e. a replace-one sensitivity
    of C; that understates ε for our mechanism (≈ 300.8 with σ/2). We account the sound
    number and the tests pin both (see docs/mechanisms.md "Fixed-size sampling").
    """
    from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp

    orders, rdp = _fixed_rdp(segments, population)
    eps, order = dp_rdp.compute_epsilon(orders, rdp, delta)
    return float(eps), _order_or_none(order)


def _fixed_rdp(segments: Sequence[Segment], population: int) -> tuple[list[float], np.ndarray]:
    """dp_accounting's orders and the RDP curve of the fixed-size-sampled segments on them."""
    orders, _ = _fixed_rdp_per_round(segments[0][0], segments[0][1], population)
    rdp = sum(steps * _fixed_rdp_per_round(sigma, q, population)[1] for sigma, q, steps in segments)
    return orders, rdp  # type: ignore[return-value]


@functools.lru_cache(maxsize=256)
def _poisson_rdp_per_round(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """Opacus' RDP curve of one Poisson-sampled Gaussian round on its default orders."""
    import_opacus()  # without the root logging handler Opacus adds (fl_app/core/quiet_import.py)
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as opacus_rdp

    curve = opacus_rdp.compute_rdp(
        q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS
    )
    return np.asarray(curve, dtype=np.float64)


@functools.lru_cache(maxsize=256)
def _fixed_rdp_per_round(
    noise_multiplier: float, sample_rate: float, population: int
) -> tuple[list[float], np.ndarray]:
    """dp_accounting's (orders, RDP curve) of one round of sampling m of M without replacement, replace-one.

    dp_accounting composes ``SelfComposedDpEvent(event, T)`` as T times the event's curve, so one round's curve
    (read from the accountant after composing one event) times T is the same number, without redoing the
    series every round.
    """
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(
        dp_accounting.SampledWithoutReplacementDpEvent(
            source_dataset_size=population,
            sample_size=fixed_sample_size(sample_rate, population),
            event=dp_accounting.GaussianDpEvent(noise_multiplier / REPLACE_ONE_SENSITIVITY_FACTOR),
        )
    )
    return list(accountant._orders), np.array(accountant._rdp, dtype=np.float64)
