"""Andrew et al.'s one-run ε estimate (ICLR 2024, §3–4) with a percentile-bootstrap interval: one Gaussian fitted
to the statistics of the never-inserted canaries and one to those of the inserted canaries, then the ε at δ of
the pair (:mod:`fl_app.privacy.audit.gaussian_pair`). The bootstrap is not in the paper (it reports point
estimates); it says how well K canaries pin ε down. An estimate, not a bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fl_app.privacy.audit.checks import _check_confidence, _check_delta, _non_negative_int
from fl_app.privacy.audit.gaussian_pair import _pair_epsilons


@dataclass(frozen=True)
class EpsilonEstimate:
    """ε estimate at ``delta`` from two sets of canary statistics, and its percentile-bootstrap interval."""

    epsilon: float
    low: float
    high: float
    null_mean: float
    null_std: float
    inserted_mean: float
    inserted_std: float
    delta: float
    confidence: float
    bootstrap: int


def _statistics(name: str, values: np.ndarray) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size < 2:
        raise ValueError(f"{name} must be a flat array of at least 2 values, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} must be finite")
    return array


def _bootstrap_interval(
    null: np.ndarray,
    known_null: tuple[float, float] | None,
    inserted: np.ndarray,
    delta: float,
    rng: np.random.Generator,
    bootstrap: int,
    confidence: float,
) -> tuple[float, float]:
    """The percentile bootstrap's (low, high) of :func:`estimate_epsilon`: the null set resampled first (unless it is
    ``known_null``), then the inserted set, each with replacement, all resamples at once."""
    if known_null is None:
        null_draws = null[rng.integers(0, null.size, size=(bootstrap, null.size))]
        null_means, null_stds = null_draws.mean(axis=1), null_draws.std(axis=1, ddof=1)
    else:
        null_means, null_stds = np.full(bootstrap, known_null[0]), np.full(bootstrap, known_null[1])
    inserted_draws = inserted[rng.integers(0, inserted.size, size=(bootstrap, inserted.size))]
    replicas = _pair_epsilons(
        null_means, null_stds, inserted_draws.mean(axis=1), inserted_draws.std(axis=1, ddof=1), delta
    )
    tail = (1.0 - confidence) / 2.0
    # Order statistics rather than interpolation: replicas can be +inf (a resample of identical values).
    return float(np.quantile(replicas, tail, method="lower")), float(np.quantile(replicas, 1.0 - tail, method="higher"))


def estimate_epsilon(
    null_stats: np.ndarray,
    inserted_stats: np.ndarray,
    delta: float,
    *,
    rng: np.random.Generator,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    known_null: tuple[float, float] | None = None,
) -> EpsilonEstimate:
    """Andrew et al.'s ε estimate: one Gaussian fitted to each set of statistics, then the ε at δ of the pair.

    The fits are the sample mean and the sample standard deviation (ddof = 1). The interval is a percentile
    bootstrap: ``bootstrap`` times, each set is resampled with replacement (independently, keeping its size), refit
    and turned into an ε, all resamples at once; ``low``/``high`` are the lower/upper order statistics at
    (1 ∓ confidence)/2. It describes the sampling error of the K canaries, not a guarantee: the estimate is neither
    an upper nor a lower bound on the mechanism's ε. At small δ it is biased upwards for small sets, because any
    sampled mismatch of the two stds reads as a leak in the tails (about +10–15% at δ = 1e-5 with ~1000 canaries
    per set and equal true variances), and the percentile interval inherits that bias. ``bootstrap = 0`` skips
    the interval (low = high = epsilon).
    All randomness comes from ``rng``.

    ``known_null = (mean, std)`` replaces the fitted null by a known one (``null_stats`` are then ignored): the paper's
    analytic N(0, 1/d) for the final-model statistic (§4), exact for a direction drawn independently of the
    model; only the inserted set is fitted and resampled, which removes half of the estimate's sampling noise.
    """
    inserted = _statistics("inserted_stats", inserted_stats)
    null = _statistics("null_stats", null_stats) if known_null is None else np.asarray(known_null, dtype=np.float64)
    delta = _check_delta(delta)
    confidence = _check_confidence(confidence)
    bootstrap = _non_negative_int("bootstrap", bootstrap)
    if known_null is None:
        null_mean, null_std = float(null.mean()), float(null.std(ddof=1))
    else:
        null_mean, null_std = (float(v) for v in known_null)
        if not (math.isfinite(null_mean) and math.isfinite(null_std) and null_std > 0):
            raise ValueError(f"known_null must be a finite (mean, std > 0), got {known_null}")
    inserted_mean, inserted_std = float(inserted.mean()), float(inserted.std(ddof=1))
    epsilon = float(_pair_epsilons(null_mean, null_std, inserted_mean, inserted_std, delta)[()])
    low = high = epsilon
    if bootstrap > 0:
        fitted_null = None if known_null is None else (null_mean, null_std)
        low, high = _bootstrap_interval(null, fitted_null, inserted, delta, rng, bootstrap, confidence)
    return EpsilonEstimate(
        epsilon=epsilon,
        low=low,
        high=high,
        null_mean=null_mean,
        null_std=null_std,
        inserted_mean=inserted_mean,
        inserted_std=inserted_std,
        delta=delta,
        confidence=confidence,
        bootstrap=bootstrap,
    )
