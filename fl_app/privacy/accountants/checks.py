"""Argument checks of the accounting: the (accountant, sampling, population) configuration, δ, a (σ, q, rounds)
segment, and m = qM for fixed-size sampling.

A :data:`Segment` is the (noise_multiplier σ, sample_rate q, number of rounds) triple every other module of
:mod:`fl_app.privacy.accountants` composes.
"""

from __future__ import annotations

import math

import numpy as np

from fl_app.core.choices import ACCOUNTANTS, SAMPLINGS

# (noise_multiplier σ, sample_rate q, number of rounds) — the same triple Opacus keeps in its history.
Segment = tuple[float, float, int]


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
