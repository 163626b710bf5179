"""Client sampling (docs/mechanisms.md, 1): Poisson sampling with rate q and the fixed denominator m = qM
(:func:`expected_clients`), or fixed-size sampling of exactly m clients without replacement (the papers'
Algorithm 1).
"""

from __future__ import annotations

import numpy as np

from fl_app.privacy.mechanisms.randomness import RandomSource


def poisson_sample(population: int, sample_rate: float, rng: RandomSource) -> np.ndarray:
    """Sorted indices of clients that join: each of ``population`` independently with probability q.

    This is the sampling that the Poisson-subsampled Gaussian accountants (Opacus RDP/PRV, dp_accounting
    ``PoissonSampledDpEvent``) assume; the round may have any number of participants, including none.
    """
    _check_population(population)
    if not 0.0 <= sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in [0, 1], got {sample_rate}")
    return np.flatnonzero(rng.random(population) < sample_rate).astype(np.int64)


def fixed_size_sample(population: int, sample_size: int, rng: RandomSource) -> np.ndarray:
    """Exactly ``sample_size`` distinct indices, uniformly without replacement, sorted (papers' Algorithm 1).

    Must be accounted with the sampling-without-replacement event (replace-one adjacency), never with the
    Poisson formula (docs/mechanisms.md, 6).
    """
    _check_population(population)
    if not 0 <= sample_size <= population:
        raise ValueError(f"sample_size must be in [0, {population}], got {sample_size}")
    return np.sort(rng.choice(population, size=sample_size, replace=False)).astype(np.int64)


def expected_clients(population: int, sample_rate: float) -> float:
    """The fixed denominator m = qM, kept as a float.

    Not rounded: the accountant's analysis is for the sampled Gaussian with sensitivity C/m and noise std σC/m
    on the average for exactly this m = qM; rounding m would change both the sensitivity and the noise and
    make them disagree with what is accounted.
    """
    _check_population(population)
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
    return float(sample_rate) * float(population)


def _check_population(population: int) -> None:
    if isinstance(population, bool) or not isinstance(population, (int, np.integer)) or population < 0:
        raise ValueError(f"population must be a non-negative integer, got {population}")
