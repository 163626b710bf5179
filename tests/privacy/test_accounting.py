"""Tests for fl_app/privacy/accountants/: the pinned ε values of docs/mechanisms.md, 6 (Opacus 1.6 RDP/PRV,
dp_accounting PLD and sampling without replacement), noise calibration and the stateful accountant's budget guard.
"""

from __future__ import annotations

import itertools
import json
import math
import time

import dp_accounting
import dp_accounting.rdp
import pytest

from fl_app.privacy.accountants import (
    CompositionHistory,
    calibrate_noise_multiplier,
    compute_epsilon,
    epsilon_from_history,
)

Q, SIGMA, DELTA, POPULATION = 0.1, 0.95, 1 / 500, 500

#: The pinned values (docs/mechanisms.md, 6) at (σ, q, δ) above, (rounds, ε) with their tolerance;
#: tests/privacy/test_accountants.py checks the same numbers through Flower's interface.
RDP_POISSON_PINS, RDP_TOLERANCE = [(300, 10.795), (200, 8.515)], 0.01
PRV_POISSON_PINS, PRV_TOLERANCE = [(300, 9.38), (200, 7.31)], 0.05
#: Fixed-size sampling, M = 500, m = 50, replace-one sensitivity 2C (dp_accounting multiplier σ/2).
FIXED_PIN, FIXED_TOLERANCE = (300, 300.8), 0.5
#: The same event at dp_accounting multiplier σ (replace-one sensitivity C): not a valid bound (docs/mechanisms.md, 6).
SPEC_FIXED_PIN, SPEC_FIXED_TOLERANCE = (300, 22.47), 0.05


# ------------------------------------------------------------------------------------------------------------
# Pinned values (docs/mechanisms.md, 6)
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("steps", "expected"), RDP_POISSON_PINS)
def test_rdp_poisson_pins(steps: int, expected: float) -> None:
    assert compute_epsilon(SIGMA, Q, steps, DELTA) == pytest.approx(expected, abs=RDP_TOLERANCE)


@pytest.mark.parametrize(("steps", "expected"), PRV_POISSON_PINS)
def test_prv_poisson_pins(steps: int, expected: float) -> None:
    assert compute_epsilon(SIGMA, Q, steps, DELTA, accountant="prv") == pytest.approx(expected, abs=PRV_TOLERANCE)


@pytest.mark.parametrize("steps", [200, 300])
def test_pld_is_tighter_than_rdp(steps: int) -> None:
    pld = compute_epsilon(SIGMA, Q, steps, DELTA, accountant="pld")
    rdp = compute_epsilon(SIGMA, Q, steps, DELTA, accountant="rdp")
    prv = compute_epsilon(SIGMA, Q, steps, DELTA, accountant="prv")
    assert pld <= rdp
    assert prv <= rdp
    assert pld == pytest.approx(prv, abs=0.05)  # both numerically tight accountants agree


def test_fixed_size_sampling_pin_and_not_the_poisson_formula() -> None:
    fixed = compute_epsilon(SIGMA, Q, FIXED_PIN[0], DELTA, sampling="fixed", population=POPULATION)
    # Replace-one sensitivity of the sum of clipped updates is 2C: dp_accounting gets multiplier σ/2.
    assert fixed == pytest.approx(FIXED_PIN[1], abs=FIXED_TOLERANCE)
    poisson = compute_epsilon(SIGMA, Q, 300, DELTA, sampling="poisson")
    assert fixed > 1.8 * poisson  # never the Poisson formula


def test_spec_fixed_size_pin_is_dp_accounting_with_sensitivity_c() -> None:
    """The 22.47 of docs/mechanisms.md, 6 is dp_accounting's WOR event with multiplier σ (replace-one sensitivity C);
    ours is the same event at σ/2 (sensitivity 2C), so the two differ exactly by that factor."""
    rdp = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(POPULATION, 50, dp_accounting.GaussianDpEvent(SIGMA))
    rdp.compose(dp_accounting.SelfComposedDpEvent(event, SPEC_FIXED_PIN[0]))
    assert rdp.get_epsilon(DELTA) == pytest.approx(SPEC_FIXED_PIN[1], abs=SPEC_FIXED_TOLERANCE)
    ours_at_double_sigma = compute_epsilon(2 * SIGMA, Q, 300, DELTA, sampling="fixed", population=POPULATION)
    assert ours_at_double_sigma == pytest.approx(rdp.get_epsilon(DELTA), rel=1e-9)


def test_fixed_size_sampling_configuration_errors() -> None:
    with pytest.raises(ValueError, match="population"):
        compute_epsilon(SIGMA, Q, 300, DELTA, sampling="fixed")
    with pytest.raises(ValueError, match="not an integer"):
        compute_epsilon(SIGMA, 0.1, 300, DELTA, sampling="fixed", population=25)
    for accountant in ("prv", "pld"):
        with pytest.raises(NotImplementedError):
            compute_epsilon(SIGMA, Q, 300, DELTA, accountant=accountant, sampling="fixed", population=500)


def test_edge_cases() -> None:
    assert compute_epsilon(0.0, Q, 10, DELTA) == math.inf
    assert compute_epsilon(SIGMA, Q, 0, DELTA) == 0.0
    assert compute_epsilon(0.0, Q, 0, DELTA) == 0.0
    for accountant in ("rdp", "prv", "pld"):
        assert compute_epsilon(0.0, Q, 5, DELTA, accountant=accountant) == math.inf
    assert compute_epsilon(0.0, Q, 5, DELTA, sampling="fixed", population=POPULATION) == math.inf
    with pytest.raises(ValueError):
        compute_epsilon(SIGMA, Q, 10, 0.0)
    with pytest.raises(ValueError):
        compute_epsilon(SIGMA, 1.5, 10, DELTA)
    with pytest.raises(ValueError):
        compute_epsilon(SIGMA, Q, 10, DELTA, accountant="gdp")  # type: ignore[arg-type]


def test_epsilon_is_monotone_in_steps() -> None:
    values = [compute_epsilon(SIGMA, Q, steps, DELTA) for steps in (1, 10, 50, 100, 200, 300)]
    assert all(a < b for a, b in itertools.pairwise(values))
    fixed = [compute_epsilon(SIGMA, Q, steps, DELTA, sampling="fixed", population=POPULATION) for steps in (1, 50, 300)]
    assert all(a < b for a, b in itertools.pairwise(fixed))


def test_compute_epsilon_is_fast() -> None:
    start = time.perf_counter()
    epsilon_from_history([(SIGMA * 1.01, Q, 300)], DELTA)  # a history not seen before: no cache hit
    epsilon_from_history([(SIGMA * 1.01, Q, 300)], DELTA, accountant="pld")
    assert time.perf_counter() - start < 1.0


# ------------------------------------------------------------------------------------------------------------
# Calibration
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", [4.0, 8.0])
def test_calibration_hits_target_within_one_percent(target: float) -> None:
    sigma = calibrate_noise_multiplier(target, DELTA, Q, 300)
    epsilon = compute_epsilon(sigma, Q, 300, DELTA)
    assert 0.99 * target <= epsilon <= target
    assert compute_epsilon(sigma * 0.98, Q, 300, DELTA) > target  # not a needlessly large σ


def test_calibration_fixed_sampling() -> None:
    sigma = calibrate_noise_multiplier(8.0, DELTA, Q, 300, sampling="fixed", population=POPULATION)
    epsilon = compute_epsilon(sigma, Q, 300, DELTA, sampling="fixed", population=POPULATION)
    assert 0.99 * 8.0 <= epsilon <= 8.0
    assert sigma > calibrate_noise_multiplier(8.0, DELTA, Q, 300)  # more noise for the same ε


def test_calibration_rejects_unreachable_targets() -> None:
    with pytest.raises(ValueError):
        calibrate_noise_multiplier(0.0, DELTA, Q, 300)
    with pytest.raises(ValueError):
        calibrate_noise_multiplier(-1.0, DELTA, Q, 300)
    with pytest.raises(ValueError):
        calibrate_noise_multiplier(math.inf, DELTA, Q, 300)
    with pytest.raises(ValueError):
        calibrate_noise_multiplier(1e-9, DELTA, Q, 300)
    with pytest.raises(ValueError):
        calibrate_noise_multiplier(8.0, DELTA, Q, 0)


# ------------------------------------------------------------------------------------------------------------
# Stateful accountant
# ------------------------------------------------------------------------------------------------------------


def test_stepping_one_round_at_a_time_equals_compute_epsilon() -> None:
    accountant = CompositionHistory()
    assert accountant.get_epsilon(DELTA) == 0.0
    for _ in range(300):
        accountant.step(SIGMA, Q)
    assert accountant.steps == 300
    assert accountant.history == [(SIGMA, Q, 300)]
    assert accountant.get_epsilon(DELTA) == pytest.approx(compute_epsilon(SIGMA, Q, 300, DELTA), rel=1e-12)
    assert accountant.get_epsilon(DELTA) == pytest.approx(10.795, abs=0.01)


def test_fixed_accountant_steps_equal_compute_epsilon() -> None:
    accountant = CompositionHistory(sampling="fixed", population=POPULATION)
    accountant.step(SIGMA, Q, num_steps=300)
    assert accountant.get_epsilon(DELTA) == pytest.approx(
        compute_epsilon(SIGMA, Q, 300, DELTA, sampling="fixed", population=POPULATION), rel=1e-12
    )


def test_heterogeneous_segments_compose() -> None:
    accountant = CompositionHistory()
    accountant.step(SIGMA, Q, num_steps=100)
    accountant.step(2.0, Q, num_steps=200)
    accountant.step(2.0, Q)
    assert accountant.history == [(SIGMA, Q, 100), (2.0, Q, 201)]
    mixed = accountant.get_epsilon(DELTA)
    assert compute_epsilon(2.0, Q, 301, DELTA) < mixed < compute_epsilon(SIGMA, Q, 301, DELTA)
    assert mixed > compute_epsilon(SIGMA, Q, 100, DELTA)


def test_would_exceed_stops_exactly_before_the_crossing_round() -> None:
    accountant = CompositionHistory()
    accountant.step(SIGMA, Q, num_steps=99)
    eps_100 = compute_epsilon(SIGMA, Q, 100, DELTA)
    eps_101 = compute_epsilon(SIGMA, Q, 101, DELTA)
    budget = 0.5 * (eps_100 + eps_101)
    assert accountant.epsilon_after(1, SIGMA, Q, DELTA) == pytest.approx(eps_100, rel=1e-12)
    # The server loop: check the guard before each round, run it only if allowed.
    rounds_run = 99
    while not accountant.would_exceed(budget, DELTA, SIGMA, Q):
        accountant.step(SIGMA, Q)
        rounds_run += 1
        assert rounds_run <= 101, "budget guard did not stop"
    assert rounds_run == 100
    assert accountant.get_epsilon(DELTA) <= budget
    assert accountant.epsilon_after(1, SIGMA, Q, DELTA) > budget
    assert accountant.steps == 100  # asking does not step


def test_state_dict_round_trip_through_json() -> None:
    accountant = CompositionHistory()
    accountant.step(SIGMA, Q, num_steps=150)
    accountant.step(1.2, 0.05, num_steps=20)
    state = json.loads(json.dumps(accountant.state_dict()))
    restored = CompositionHistory()
    restored.load_state_dict(state)
    assert restored.steps == 170
    assert restored.get_epsilon(DELTA) == accountant.get_epsilon(DELTA)
    assert CompositionHistory.from_state_dict(state).get_epsilon(DELTA) == accountant.get_epsilon(DELTA)
    restored.step(1.2, 0.05)
    assert restored.history[-1] == (1.2, 0.05, 21)  # merges with the restored last segment
    with pytest.raises(ValueError):
        CompositionHistory(accountant="prv").load_state_dict(state)
    with pytest.raises(ValueError):
        CompositionHistory(sampling="fixed", population=POPULATION).load_state_dict(state)


def test_accountant_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError):
        CompositionHistory(sampling="fixed")
    with pytest.raises(NotImplementedError):
        CompositionHistory(accountant="pld", sampling="fixed", population=POPULATION)
    accountant = CompositionHistory()
    with pytest.raises(ValueError):
        accountant.step(-1.0, Q)
    with pytest.raises(ValueError):
        accountant.step(SIGMA, Q, num_steps=-1)
    assert accountant.steps == 0


def test_memoised_rdp_equals_opacus_rdp_accountant_on_a_heterogeneous_history() -> None:
    from opacus.accountants import RDPAccountant

    history = [(0.95, 0.1, 120), (1.3, 0.05, 7), (0.95, 0.1, 33), (2.0, 0.2, 1)]
    reference = RDPAccountant()
    reference.history = list(history)
    assert epsilon_from_history(history, DELTA) == pytest.approx(reference.get_epsilon(DELTA), rel=1e-12)


def test_memoised_fixed_size_rdp_equals_dp_accounting_on_a_heterogeneous_history() -> None:
    history = [(0.95, 0.1, 40), (1.5, 0.1, 9)]
    rdp = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    for sigma, q, steps in history:
        event = dp_accounting.SampledWithoutReplacementDpEvent(
            POPULATION, round(q * POPULATION), dp_accounting.GaussianDpEvent(sigma / 2)
        )
        rdp.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    ours = epsilon_from_history(history, DELTA, sampling="fixed", population=POPULATION)
    assert ours == pytest.approx(rdp.get_epsilon(DELTA), rel=1e-12)
