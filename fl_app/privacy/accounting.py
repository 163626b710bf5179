"""Privacy accounting for client-level DP-FedAvg / DP-FedSAM: ε for a history of sampled Gaussian rounds.

One round releases the uniform average of clipped client updates over the fixed denominator m = qM plus
Gaussian noise of std σC/m, i.e. a sampled Gaussian mechanism with noise multiplier σ (``mechanisms.py``).
Implemented here, as pinned down by ``SPEC.md`` §1 and §7:

- Poisson sampling (default): RDP of the Poisson-subsampled Gaussian composed over T rounds and converted to
  (ε, δ)-DP (DP-FedSAM journal Thm 2 / Eqs. 16–17) through Opacus' ``RDPAccountant``; the tighter numerical
  accountants Opacus ``PRVAccountant`` and dp_accounting ``PLDAccountant`` as options.
- Fixed-size sampling (exactly m of M clients without replacement, papers' Algorithm 1): dp_accounting's
  ``SampledWithoutReplacementDpEvent`` under replace-one adjacency with its RDP accountant — never the Poisson
  formula, which would understate ε roughly twofold.
- Noise calibration (target ε → σ, used for journal Table II) and a stateful accountant with a budget guard.
- δ(ε) of a history (:func:`delta_from_history`), the inverse of ε(δ).

:class:`fl_app.privacy.accountants.SampledGaussianAccountant` puts this composition behind Flower's
``PrivacyAccountant`` interface; this module imports no Flower.

No privacy math is written here: every ε comes from Opacus or dp_accounting.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fl_app.choices import ACCOUNTANTS, SAMPLINGS, AccountantName, Sampling

__all__ = [
    "AccountantName",
    "PrivacyAccountant",
    "Sampling",
    "Segment",
    "calibrate_noise_multiplier",
    "compute_epsilon",
    "delta_from_history",
    "epsilon_and_order_from_history",
    "epsilon_from_history",
    "fixed_sample_size",
]

logger = logging.getLogger(__name__)

# Opacus and dp_accounting are imported in the functions that call them: importing Opacus' package loads its
# optimizers and torch.distributed (~1 s on the 2-core machine, dp_accounting's ~0.3 s more), which a run needs
# once it accounts a round, not on its way to starting Ray and the workers (docs/performance.md, startup).

# (noise_multiplier σ, sample_rate q, number of rounds) — the same triple Opacus keeps in its history.
Segment = tuple[float, float, int]


# dp_accounting's PLD is a pessimistic (upper-bound) discretisation whatever the interval; 1e-3 gives the same
# ε as its 1e-4 default to 1e-4 at q=0.1, σ=0.95, T=300 and is ~10x faster (0.07 s instead of 0.8 s).
_PLD_DISCRETIZATION = 1e-3

# Replacing one client's clipped update (norm <= C) by another moves the sum by up to 2C.
REPLACE_ONE_SENSITIVITY_FACTOR = 2.0

# Bracket limits for calibration; beyond them the target is treated as unreachable.
_SIGMA_MIN = 1e-3
_SIGMA_MAX = 1e6
_MAX_BISECTIONS = 200  # search steps (interpolation or bisection)


# ------------------------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------------------------


def _check_config(accountant: str, sampling: str, population: int | None) -> None:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}")
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
    if sampling == "fixed":
        if isinstance(population, (bool, np.bool_)) or not isinstance(population, (int, np.integer)) or population < 1:
            raise ValueError(f"sampling='fixed' needs the population size M as a positive int, got {population!r}")
        if accountant != "rdp":
            # dp_accounting 0.6 implements sampling without replacement only in its RDP accountant, and Opacus
            # only knows Poisson sampling; falling back to a Poisson event would understate ε.
            raise NotImplementedError(
                f"accountant={accountant!r} is not available for sampling='fixed' (sampling without "
                "replacement); only accountant='rdp' (dp_accounting SampledWithoutReplacementDpEvent) is"
            )


def _check_delta(delta: float) -> None:
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def _check_segment(noise_multiplier: float, sample_rate: float, steps: int) -> None:
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be a non-negative finite number, got {noise_multiplier}")
    if not 0.0 <= sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in [0, 1], got {sample_rate}")
    if isinstance(steps, (bool, np.bool_)) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")


def fixed_sample_size(sample_rate: float, population: int) -> int:
    """m = qM, which must be a whole number: fixed-size sampling draws exactly m clients, and an event that states
    its sample size (Flower's ``GaussianPrivacyEvent``) states m, not q."""
    size = round(sample_rate * population)
    if abs(sample_rate * population - size) > 1e-6:
        raise ValueError(
            f"exactly m = q*M clients are drawn (q = {sample_rate}, M = {population}), but q*M = "
            f"{sample_rate * population} is not an integer"
        )
    return size


# ------------------------------------------------------------------------------------------------------------
# ε of a history
# ------------------------------------------------------------------------------------------------------------


def epsilon_from_history(
    history: Sequence[Segment],
    delta: float,
    accountant: AccountantName = "rdp",
    sampling: Sampling = "poisson",
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
    sampling: Sampling = "poisson",
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
        from opacus.accountants import RDPAccountant
        from opacus.accountants.analysis import rdp as opacus_rdp

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Optimal order is the (largest|smallest) alpha")
            eps, order = opacus_rdp.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)
            return float(eps), _order_or_none(order)
    if accountant == "prv":
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
    sampling: Sampling = "poisson",
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
    SPEC §7 pins 22.47 for M=500, m=50, σ=0.95, T=300, which is dp_accounting with multiplier σ, i.e. a
    replace-one sensitivity of C; that understates ε for our mechanism (≈ 300.8 with σ/2). We account the sound
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


def compute_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: AccountantName = "rdp",
    sampling: Sampling = "poisson",
    population: int | None = None,
) -> float:
    """ε(δ) after ``steps`` rounds of the sampled Gaussian mechanism with noise multiplier σ and rate q.

    ``sampling='poisson'`` accounts Poisson sampling with rate q (SPEC §1; Opacus RDP/PRV or dp_accounting
    PLD); ``sampling='fixed'`` accounts exactly m = qM of ``population`` clients without replacement (RDP
    only). σ = 0 gives ∞ (no noise, no privacy); 0 steps give 0.
    """
    return epsilon_from_history([(noise_multiplier, sample_rate, steps)], delta, accountant, sampling, population)


# ------------------------------------------------------------------------------------------------------------
# Calibration
# ------------------------------------------------------------------------------------------------------------


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: AccountantName = "rdp",
    sampling: Sampling = "poisson",
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

    lower_target = target_epsilon * (1.0 - rel_tol)
    high = 1.0
    while epsilon(high) > target_epsilon:
        high *= 2.0
        if high > _SIGMA_MAX:
            raise ValueError(
                f"target ε = {target_epsilon} at δ = {delta} is unreachable: even σ = {_SIGMA_MAX:g} gives a larger ε"
            )
    low = high / 2.0
    while epsilon(low) <= target_epsilon:
        high = low
        low /= 2.0
        if low < _SIGMA_MIN:
            raise ValueError(
                f"target ε = {target_epsilon} is met by every σ ≥ {_SIGMA_MIN:g} "
                f"(q = {sample_rate}, T = {steps}); calibration is meaningless"
            )
    # Invariant: ε(low) > target ≥ ε(high).
    eps_low, eps_high = epsilon(low), epsilon(high)
    if eps_high >= lower_target:
        return high
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


# ------------------------------------------------------------------------------------------------------------
# Stateful accountant with budget guard
# ------------------------------------------------------------------------------------------------------------


class PrivacyAccountant:
    """Running accountant over the rounds of one training run, in the style of Opacus' accountants.

    Keeps the history as (σ, q, rounds) segments, merging consecutive rounds with equal (σ, q), and recomputes
    ε from the whole history, so rounds with different σ or q compose correctly. ``would_exceed`` is the
    budget guard of SPEC §7: the server asks it before each round and stops if that round would exceed
    ``max_epsilon``.
    """

    def __init__(
        self,
        accountant: AccountantName = "rdp",
        sampling: Sampling = "poisson",
        population: int | None = None,
    ) -> None:
        _check_config(accountant, sampling, population)
        self.accountant: AccountantName = accountant
        self.sampling: Sampling = sampling
        self.population: int | None = None if population is None else int(population)
        self._history: list[Segment] = []

    @property
    def steps(self) -> int:
        """Number of accounted rounds."""
        return sum(steps for _, _, steps in self._history)

    @property
    def history(self) -> list[Segment]:
        """A copy of the (σ, q, rounds) segments."""
        return list(self._history)

    def step(self, noise_multiplier: float, sample_rate: float, num_steps: int = 1) -> None:
        """Record ``num_steps`` rounds with noise multiplier σ and sampling rate q."""
        _check_segment(noise_multiplier, sample_rate, num_steps)
        if self.sampling == "fixed":
            assert self.population is not None
            # Fail when the round is recorded, not later when someone asks for ε.
            fixed_sample_size(sample_rate, self.population)
        if num_steps == 0:
            return
        noise_multiplier, sample_rate = float(noise_multiplier), float(sample_rate)
        if self._history and self._history[-1][:2] == (noise_multiplier, sample_rate):
            self._history[-1] = (noise_multiplier, sample_rate, self._history[-1][2] + int(num_steps))
        else:
            self._history.append((noise_multiplier, sample_rate, int(num_steps)))

    def get_epsilon(self, delta: float) -> float:
        """ε(δ) spent so far (0 before the first round)."""
        return epsilon_from_history(self._history, delta, self.accountant, self.sampling, self.population)

    def epsilon_after(self, extra_steps: int, noise_multiplier: float, sample_rate: float, delta: float) -> float:
        """ε(δ) if ``extra_steps`` more rounds with (σ, q) were run; the accountant itself is not changed."""
        _check_segment(noise_multiplier, sample_rate, extra_steps)
        extended = [*self._history, (float(noise_multiplier), float(sample_rate), int(extra_steps))]
        return epsilon_from_history(extended, delta, self.accountant, self.sampling, self.population)

    def would_exceed(self, max_epsilon: float, delta: float, noise_multiplier: float, sample_rate: float) -> bool:
        """True if running one more round with (σ, q) would take ε(δ) above ``max_epsilon``."""
        return self.epsilon_after(1, noise_multiplier, sample_rate, delta) > max_epsilon

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the configuration and the history as lists."""
        return {
            "accountant": self.accountant,
            "sampling": self.sampling,
            "population": self.population,
            "history": [[sigma, rate, steps] for sigma, rate, steps in self._history],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the history saved by ``state_dict``; the configuration must match this accountant's."""
        for key in ("accountant", "sampling", "population", "history"):
            if key not in state:
                raise ValueError(f"accountant state has no {key!r} entry")
        saved = (state["accountant"], state["sampling"], state["population"])
        if saved != (self.accountant, self.sampling, self.population):
            raise ValueError(
                f"accountant state was saved for (accountant, sampling, population) = {saved}, "
                f"not {(self.accountant, self.sampling, self.population)}"
            )
        history: list[Segment] = []
        for entry in state["history"]:
            sigma, rate, steps = entry
            _check_segment(float(sigma), float(rate), int(steps))
            history.append((float(sigma), float(rate), int(steps)))
        self._history = history

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> PrivacyAccountant:
        """A new accountant with the configuration and history of ``state``."""
        restored = cls(state["accountant"], state["sampling"], state["population"])
        restored.load_state_dict(state)
        return restored
