"""Distributed DP's calibration (fl_app/privacy/distributed/mechanism.py): σ found on the Skellam bound itself meets
the target ε on the budget side. Pinned: at 32 bits the discrete parts cost nothing, and σ is the one the same
general subsampling bound (Zhu & Wang 2019, Thm 6) gives the Gaussian mechanism, 18% above the sampled Gaussian
mechanism's exact analysis; fewer bits cost noise through the rounding's norm inflation."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from opacus.accountants.analysis.rdp import get_privacy_spent

from fl_app.privacy.accountants import calibrate_noise_multiplier
from fl_app.privacy.accountants.calibration import calibrate
from fl_app.privacy.accountants.skellam import SKELLAM_ORDERS, poisson_subsampled_rdp
from fl_app.privacy.distributed.mechanism import (
    ABORT_SHARE_OF_DELTA,
    DistributedLedger,
    calibrated_parameters,
    default_threshold,
    sample_below_probability,
)
from fl_app.privacy.distributed.skellam import SkellamParameters

M, Q, T = 500, 0.1, 20
DELTA = 1 / M


def _parameters(bits: int = 32, sigma: float = 1.0) -> SkellamParameters:
    # The paper CNN on Fashion-MNIST (d = 1,663,370); 26 survivors of a Poisson(50) sample, at most 90.
    return SkellamParameters(clip_norm=0.05, dimension=1_663_370, min_clients=26, max_clients=90,
                             noise_multiplier=sigma, bits=bits)  # fmt: skip


def _epsilon(parameters: SkellamParameters) -> float:
    ledger = DistributedLedger(DELTA, M, parameters)
    ledger.step(parameters.noise_multiplier, Q, T)
    return ledger.epsilon()


@pytest.mark.parametrize("target", [0.5, 2.0, 8.0])
def test_the_calibrated_sigma_spends_at_most_the_target_and_within_half_a_percent(target: float) -> None:
    parameters = calibrated_parameters(_parameters(), target, DELTA, Q, T, M)
    assert target * 0.995 <= _epsilon(parameters) <= target
    # The scale is the one chosen for the calibrated σ, not for the σ the search started from.
    assert parameters.scale == _parameters(sigma=parameters.noise_multiplier).scale
    assert dataclasses.replace(parameters, noise_multiplier=1.0) == _parameters()


def _gaussian_under_the_general_bound(sigma: float) -> float:
    rdp = np.array([T * poisson_subsampled_rdp(a, lambda o: o / (2 * sigma**2), Q) for a in SKELLAM_ORDERS])
    return float(get_privacy_spent(orders=list(SKELLAM_ORDERS), rdp=rdp, delta=DELTA)[0])


def test_at_32_bits_sigma_is_the_general_subsampling_bounds_gaussian_one_18_percent_above_the_exact_one() -> None:
    skellam = calibrated_parameters(_parameters(), 2.0, DELTA, Q, T, M).noise_multiplier
    assert skellam == pytest.approx(calibrate(_gaussian_under_the_general_bound, 2.0), rel=1e-6)
    exact = calibrate_noise_multiplier(2.0, DELTA, Q, T)
    assert (skellam, exact) == pytest.approx((1.30979, 1.10922), abs=1e-4)


def test_fewer_bits_cost_noise_through_the_rounding_and_too_few_are_refused() -> None:
    effective = [calibrated_parameters(_parameters(bits), 2.0, DELTA, Q, T, M).effective_noise_multiplier
                 for bits in (17, 18, 32)]  # fmt: skip
    # σ·Δ2/(sC): the decoded sum's noise over C. At 32 bits it is σ; at 17 bits the rounding adds 13.5%.
    assert effective == pytest.approx([1.30979 * 1.1355, 1.30979 * 1.0294, 1.30979], rel=1e-3)
    with pytest.raises(ValueError, match="raise bits"):  # at 16 bits the noise itself would wrap
        calibrated_parameters(_parameters(16), 2.0, DELTA, Q, T, M)


def test_an_unreachable_target_and_a_run_of_no_rounds_are_refused() -> None:
    with pytest.raises(ValueError, match="every σ"):
        calibrated_parameters(_parameters(), 1e9, DELTA, Q, T, M)
    with pytest.raises(ValueError, match="rounds >= 1"):
        calibrated_parameters(_parameters(), 2.0, DELTA, Q, 0, M)


def test_a_sample_below_t_is_as_likely_as_the_binomial_tail_of_the_neighbour_with_a_client_fewer() -> None:
    # P(Bin(99, 0.1) <= t - 1) for M = 100: the cpu scale's m = 10.
    assert sample_below_probability(6, 100, 0.1) == pytest.approx(0.0611516, rel=1e-5)
    assert sample_below_probability(2, 100, 0.1) == pytest.approx(0.9**99 + 99 * 0.1 * 0.9**98, rel=1e-12)


def test_the_aborts_add_one_plus_e_to_the_epsilon_times_their_chance_to_delta() -> None:
    ledger = DistributedLedger(DELTA, M, _parameters())
    ledger.step(1.0, Q, T)
    p = sample_below_probability(26, M, Q)
    assert ledger.abort_delta() == pytest.approx((1 + math.exp(ledger.epsilon())) * T * p, rel=1e-12)
    claim = ledger.claim()
    assert f"{DELTA + ledger.abort_delta():.3g})-DP against whoever sees the released models" in claim["statement"]
    assert claim["distributed"]["abort_probability"] == p and claim["distributed"]["abort_delta"] > 0


@pytest.mark.parametrize(("epsilon", "threshold"), [(1.0, 22), (2.0, 21), (4.0, 20), (8.0, 16)])
def test_the_default_threshold_is_the_largest_whose_aborts_add_a_tenth_of_delta(epsilon: float, threshold: int) -> None:
    assert default_threshold(26, epsilon, DELTA, M, Q, T) == threshold
    for t, within in ((threshold, True), (threshold + 1, False)):
        added = (1 + math.exp(epsilon)) * T * sample_below_probability(t, M, Q)
        assert (added <= ABORT_SHARE_OF_DELTA * DELTA) is within
    assert default_threshold(6, 4.0, 0.01, 100, 0.1, 12) == 2  # m = 10: no t meets it; the run warns


def test_a_run_whose_aborts_reach_delta_one_states_no_guarantee_against_the_models_consumers() -> None:
    # M = 6, q = 0.5, t = 2: a neighbour's sample of 5 is below 2 with probability 6/32 a round.
    ledger = DistributedLedger(1 / 6, 6, dataclasses.replace(_parameters(), min_clients=2, max_clients=6))
    ledger.step(1.0, 0.5, 2)
    assert ledger.abort_probability(0.5) == pytest.approx(6 / 32)
    statement = ledger.claim()["statement"]
    assert statement.startswith("no client-level guarantee against whoever sees the released models")
    assert "-DP against the server" in statement
