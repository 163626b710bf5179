"""The Skellam noise (its law, its closure under sums), the tail bound, the overflow bound against a worst-case
simulation, and how a round's parameters are chosen."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from fl_app.privacy.distributed.codec import SkellamCodec
from fl_app.privacy.distributed.encoding import to_modular
from fl_app.privacy.distributed.skellam import SkellamParameters, skellam_noise, skellam_tail


def _pmf_distance(draws: np.ndarray, variance: float) -> float:
    values, counts = np.unique(draws, return_counts=True)
    exact = stats.skellam.pmf(values, variance / 2.0, variance / 2.0)
    return float(np.max(np.abs(counts / draws.size - exact)))


def test_skellam_noise_has_the_skellam_law() -> None:
    draws = skellam_noise(200_000, 6.0, np.random.default_rng(0))
    assert draws.dtype == np.int64
    assert draws.mean() == pytest.approx(0.0, abs=0.02)
    assert draws.var() == pytest.approx(6.0, rel=0.02)
    assert _pmf_distance(draws, 6.0) < 0.004


def test_a_sum_of_client_shares_is_the_sums_skellam() -> None:
    """Closure under sums: 8 clients' Sk(6/8) add up to Sk(6), the law the accountant is owed."""
    rng = np.random.default_rng(1)
    total = sum(skellam_noise(200_000, 6.0 / 8, rng) for _ in range(8))
    assert _pmf_distance(total, 6.0) < 0.004


def test_zero_variance_is_no_noise_and_bad_variances_are_refused() -> None:
    assert not skellam_noise(5, 0.0, np.random.default_rng(0)).any()
    for bad in (-1.0, math.inf, 2e19):
        with pytest.raises(ValueError, match="variance"):
            skellam_noise(5, bad, np.random.default_rng(0))


@pytest.mark.parametrize(("t", "variance"), [(1, 1.0), (5, 2.0), (10, 4.0), (30, 50.0), (200, 1000.0), (3, 100.0)])
def test_the_tail_bound_is_above_the_exact_tail(t: int, variance: float) -> None:
    exact = float(stats.skellam.sf(t - 1, variance / 2.0, variance / 2.0))  # P(X ≥ t)
    bound = skellam_tail(t, variance)
    assert exact <= bound <= 1.0
    assert skellam_tail(0, variance) == 1.0 and skellam_tail(t, 0.0) == 0.0


def test_the_tail_bound_is_gaussian_for_a_large_variance() -> None:
    variance, t = 1e16, 8e8  # 8 standard deviations
    assert math.log(skellam_tail(t, variance)) == pytest.approx(-(t**2) / (2 * variance), rel=1e-6)


def _parameters(**changes: object) -> SkellamParameters:
    settings = {
        "clip_norm": 1.0,
        "dimension": 64,
        "min_clients": 4,
        "max_clients": 4,
        "noise_multiplier": 1.0,
        "bits": 12,
        "overflow_target": 0.05,
    } | changes
    return SkellamParameters(**settings)  # type: ignore[arg-type]


def test_the_scale_is_the_largest_within_the_overflow_target() -> None:
    parameters = _parameters()
    assert parameters.overflow <= 0.05
    assert parameters.overflow_at(parameters.scale * 1.001) > 0.05


def test_the_overflow_bound_holds_against_aligned_updates() -> None:
    """The worst case of the bound: every client sends the same spike, at full norm. The band is hit no more often
    than the bound says, over 400 rounds."""
    parameters = _parameters()
    spike = np.zeros(64)
    spike[0] = 1.0
    rng = np.random.default_rng(2)
    hits = 0
    rounds = 400
    for round_seed in range(rounds):
        codec = SkellamCodec(parameters, rotation_seed=round_seed)
        total = np.zeros(codec.rotation.padded, dtype=np.int64)
        for _ in range(4):
            total = total + codec.encode(spike, rng).astype(np.int64)
        hits += codec.decode(to_modular(total, 12)).wrapped
    assert hits / rounds <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / rounds)


def test_the_noise_is_sigma_times_the_integer_sensitivity() -> None:
    parameters = _parameters(min_clients=2, max_clients=5, noise_multiplier=0.7)
    assert parameters.variance == pytest.approx((0.7 * parameters.l2_sensitivity) ** 2)
    assert parameters.client_variance == pytest.approx(parameters.variance / 2)
    assert parameters.l2_sensitivity > parameters.scale * parameters.clip_norm


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bits": 7}, "bits"),
        ({"bits": 37}, "bits"),
        ({"max_clients": 3}, "below min_clients"),
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"clip_norm": -1.0}, "clip_norm"),
        ({"dimension": 0}, "dimension"),
        ({"beta": 1.0}, "beta"),
        ({"overflow_target": 0.0}, "overflow_target"),
        ({"bits": 8, "dimension": 10**6, "overflow_target": 1e-12}, "no scale"),
    ],
)
def test_parameters_out_of_range_are_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _parameters(**changes)
