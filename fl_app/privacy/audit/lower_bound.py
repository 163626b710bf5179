"""One-run lower bound on ε: T. Steinke, M. Nasr, M. Jagielski, "Privacy Auditing with One (1) Training Run",
NeurIPS 2023 (arXiv 2305.08846).

m canaries, each included independently with probability 1/2; the auditor guesses "included" on the k₊ highest
scores and "excluded" on the k₋ lowest (:data:`~fl_app.core.choices.GUESS_RULES`: ``two_sided``, or ``one_sided``
with k₋ = 0) and abstains on the rest; the p-value of v right guesses out of r is the approximate-DP theorem's,
computed exactly as in the paper's Appendix D code (:func:`one_run_p_value`). Each guess count tried is tested
at significance (1 − confidence)/n (Bonferroni) and the largest certified ε is reported
(:func:`one_run_lower_bound`); :func:`certifiable_epsilon` is its ceiling when every guess is right.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fl_app.core.choices import GUESS_RULES, GuessRule
from fl_app.privacy.audit.checks import _check_confidence, _non_negative_int

# SciPy's special functions, root finder and binomial are imported where they are called: scipy.stats alone costs
# ~0.4 s, which every run's driver would pay on its way to starting Ray, and only an audit's evaluation uses them.


def _check_rule(rule: object) -> GuessRule:
    if rule not in GUESS_RULES:
        raise ValueError(f"rule must be one of {GUESS_RULES}, got {rule!r}")
    return rule  # type: ignore[return-value]


def _split_guesses(count: int, rule: GuessRule) -> tuple[int, int]:
    """(guesses "inserted" on the highest scores, guesses "not inserted" on the lowest) of ``count`` guesses."""
    if rule == "one_sided":
        return count, 0
    return (count + 1) // 2, count // 2


@dataclass(frozen=True)
class LowerBound:
    """A statistically valid lower bound on ε: unless an event of probability ≤ 1 − ``confidence`` (over the
    canaries' random insertion and the mechanism's noise) occurred, the mechanism is not (ε', delta)-DP for any
    ε' ≤ ``epsilon`` (when ``epsilon`` > 0).

    ``guesses``/``correct`` are r and v of the guess count that certified ``epsilon`` (``positive_guesses`` of them
    "inserted" on the highest scores, ``negative_guesses`` "not inserted" on the lowest); ``tried`` lists every
    guess count tested, each at ``significance`` = (1 − confidence)/len(tried) (Bonferroni).
    """

    epsilon: float
    guesses: int
    correct: int
    positive_guesses: int
    negative_guesses: int
    canaries: int
    delta: float
    confidence: float
    tried: tuple[int, ...]
    significance: float
    rule: GuessRule = "two_sided"


def one_run_p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """p-value of ``correct`` or more right guesses out of ``guesses`` if the mechanism were (ε, δ)-DP.

    Steinke, Nasr & Jagielski (approximate-DP theorem; Appendix D code): with m = ``canaries`` each included
    independently with probability 1/2, r = ``guesses``, v = ``correct``, q = e^ε/(1 + e^ε),

        p = P[Binomial(r, q) ≥ v] + 2mδ · max_{1≤i≤v} P[v − i ≤ Binomial(r, q) < v] / i,

    capped at 1. For δ = 0 this is the pure-DP binomial tail.
    """
    m = _non_negative_int("canaries", canaries)
    r = _non_negative_int("guesses", guesses)
    v = _non_negative_int("correct", correct)
    if not v <= r <= m:
        raise ValueError(f"need correct <= guesses <= canaries, got {v}, {r}, {m}")
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not epsilon >= 0:
        raise ValueError(f"epsilon must be non-negative, got {epsilon!r}")
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    from scipy.special import expit
    from scipy.stats import binom

    q = float(expit(epsilon))
    tail = float(binom.sf(v - 1, r, q))
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    below = np.cumsum(binom.pmf(np.arange(v - 1, -1, -1), r, q))  # below[i-1] = P[v − i ≤ Bin < v]
    alpha = float(np.max(below / np.arange(1, v + 1)))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def _certified_epsilon(canaries: int, guesses: int, correct: int, delta: float, significance: float) -> float:
    """The largest ε (to ~1e-12) whose p-value is below ``significance``; 0 if not even ε = 0 is rejected.

    Bisection keeps p(lo) < significance ≤ p(hi), so the returned lo is always itself a rejected hypothesis —
    the bound is valid whether or not p is monotone in ε.
    """
    if one_run_p_value(canaries, guesses, correct, 0.0, delta) >= significance:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(canaries, guesses, correct, hi, delta) < significance:
        lo, hi = hi, 2.0 * hi  # terminates: at ε ≳ 37, q rounds to 1 and p = 1
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if one_run_p_value(canaries, guesses, correct, mid, delta) < significance:
            lo = mid
        else:
            hi = mid
    return lo


def default_guess_counts(canaries: int) -> tuple[int, ...]:
    """The guess counts tried by default: m, m/2, m/4, … (halving, rounded down) while ≥ 10, at least one.

    A geometric grid covers both regimes — a strong signal certifies most with many guesses, a weak one only on
    the few most extreme scores — at a Bonferroni price of about log₂(m/10) + 1 tests.
    """
    m = _non_negative_int("canaries", canaries)
    counts = [m]
    while counts[-1] // 2 >= 10:
        counts.append(counts[-1] // 2)
    return tuple(count for count in counts if count > 0)


def _guess_counts(canaries: int, guesses: Sequence[int] | None) -> tuple[int, ...]:
    """The distinct guess counts to try (default :func:`default_guess_counts`), each checked to be in [1, m]."""
    counts = default_guess_counts(canaries) if guesses is None else tuple(dict.fromkeys(guesses))
    for count in counts:
        if _non_negative_int("guess count", count) == 0 or count > canaries:
            raise ValueError(f"guess counts must be in [1, {canaries}], got {count!r}")
    if not counts:
        raise ValueError("guesses must name at least one guess count")
    return counts


def certifiable_epsilon(
    canaries: int,
    delta: float,
    confidence: float = 0.95,
    *,
    guesses: Sequence[int] | None = None,
    rule: GuessRule = "two_sided",
) -> float:
    """The ceiling of :func:`one_run_lower_bound` with m = ``canaries``: the ε it certifies when every guess is right.

    Steinke, Nasr & Jagielski's bound depends on the scores only through the number v of right guesses out of
    each count r tried; with perfect separation (the ⌈m/2⌉ inserted canaries all score above the ⌊m/2⌋ others)
    every two-sided count gets v = r (a one-sided count v = min(r, ⌈m/2⌉): past the inserted canaries its guesses
    are wrong), and the result is max_r of the largest ε whose p-value (:func:`one_run_p_value`) is below
    (1 − confidence)/n, n the number of counts (``guesses``, default :func:`default_guess_counts`).
    This is what the audit can certify at best with m canaries, δ and that confidence, however strong the signal:
    a bound can only show that the accountant's ε is violated where this ceiling is above it. At δ = 0 it is
    logit(((1 − confidence)/n)^(1/m)), growing like log m. It shrinks as δ grows, through the p-value's 2mδ term —
    at a *fixed* δ, more canaries eventually certify less (m = 50,000 at δ = 1e-3 certifies nothing) — so δ must
    shrink like 1/m for the ceiling to keep growing, as the audit's default δ_LB = min(δ, 0.01/m) does
    (2mδ ≤ 0.02): 3.05, 4.57, 5.89, 7.44, 8.98 at m = 100, 500, 2000, 10⁴, 5·10⁴.

    It is exactly ``one_run_lower_bound(scores, inserted, delta, confidence=confidence, guesses=guesses,
    rule=rule).epsilon`` for perfectly separated scores with ⌈m/2⌉ inserted; it does not look at any scores and costs
    one bisection per guess count (~1 s at m = 50,000 with the default counts).

    Perfect separation needs every inserted canary to leave a trace. One that was inserted but never joined a
    round (a fraction (1 − q)^T of them when each round samples canaries at rate q: 28% at q = 0.1, T = 12) is
    indistinguishable from a never-inserted one under any mechanism, so the "not inserted" guesses on the lowest
    scores are wrong for some of them and the bound a two-sided run can reach is lower than this ceiling; the
    one-sided rule does not guess on the lowest scores and keeps it up to the number of canaries that joined
    (bench/audit_power_k.py simulates that case).
    """
    m = _non_negative_int("canaries", canaries)
    if m == 0:
        raise ValueError("certifiable_epsilon needs at least one canary")
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    confidence = _check_confidence(confidence)
    rule = _check_rule(rule)
    counts = _guess_counts(m, guesses)
    significance = (1.0 - float(confidence)) / len(counts)
    inserted = (m + 1) // 2
    certified = []
    for count in counts:
        positive, negative = _split_guesses(int(count), rule)
        right = min(positive, inserted) + min(negative, m - inserted)
        certified.append(_certified_epsilon(m, int(count), right, float(delta), significance))
    return max(certified)


def _checked_scores(scores: np.ndarray, inserted: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """The scores (finite, float64, flat, non-empty) and who was inserted (bool, the same shape); δ in [0, 1)."""
    score = np.asarray(scores, dtype=np.float64)
    truth = np.asarray(inserted)
    if score.ndim != 1 or score.size == 0:
        raise ValueError(f"scores must be a non-empty flat array, got shape {score.shape}")
    if not np.isfinite(score).all():
        raise ValueError("scores must be finite")
    if truth.shape != score.shape or truth.dtype != np.bool_:
        raise ValueError(f"inserted must be a bool array of shape {score.shape}, got {truth.dtype} {truth.shape}")
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    return score, truth


def one_run_lower_bound(
    scores: np.ndarray,
    inserted: np.ndarray,
    delta: float,
    *,
    confidence: float = 0.95,
    guesses: Sequence[int] | None = None,
    rule: GuessRule = "two_sided",
) -> LowerBound:
    """Steinke, Nasr & Jagielski's one-run lower bound on ε at ``delta`` from canary scores.

    Higher score means "inserted". For each guess count r the auditor guesses "inserted" on the ⌈r/2⌉ highest
    scores and "not inserted" on the ⌊r/2⌋ lowest (``rule="two_sided"``), or "inserted" on the r highest
    (``rule="one_sided"``), and abstains on the rest; v counts the right guesses and :func:`one_run_p_value`
    tests (ε, δ)-DP. Every count in ``guesses`` (default
    :func:`default_guess_counts`) is tested at significance (1 − confidence)/n, n the number of distinct counts
    (Bonferroni), and the largest certified ε is returned, so the result is a valid lower bound with probability
    ≥ ``confidence``. 0.0 means nothing could be certified.

    Validity needs what the theorem assumes: each canary was inserted independently with probability 1/2 (m, the
    number of scores, is the number of such canaries, all of them, not only the inserted ones), and the scores
    are computed from the released models without looking at who was inserted. Ties in the scores are broken
    by canary position, which does not depend on the insertion either.
    """
    score, truth = _checked_scores(scores, inserted, delta)
    confidence = _check_confidence(confidence)
    rule = _check_rule(rule)
    m = score.size
    counts = _guess_counts(m, guesses)
    significance = (1.0 - float(confidence)) / len(counts)

    order = np.argsort(score, kind="stable")  # ascending; stable: ties keep canary order
    ranked = truth[order]
    # correct_low[k] = right "not inserted" guesses among the k lowest; correct_high[k] = right "inserted" among
    # the k highest.
    correct_low = np.concatenate([[0], np.cumsum(~ranked)])
    correct_high = np.concatenate([[0], np.cumsum(ranked[::-1])])

    best: tuple[float, int, int, int, int] | None = None
    for count in counts:
        positive, negative = _split_guesses(int(count), rule)
        right = int(correct_high[positive] + correct_low[negative])
        epsilon = _certified_epsilon(m, int(count), right, float(delta), significance)
        if best is None or epsilon > best[0]:
            best = (epsilon, int(count), right, positive, negative)
    assert best is not None
    epsilon, count, right, positive, negative = best
    return LowerBound(
        epsilon=epsilon,
        guesses=count,
        correct=right,
        positive_guesses=positive,
        negative_guesses=negative,
        canaries=m,
        delta=float(delta),
        confidence=float(confidence),
        tried=tuple(int(c) for c in counts),
        significance=significance,
        rule=rule,
    )
