"""fl_app/privacy/accountants/: our accountants speak Flower 1.42's PrivacyAccountant interface, agree with Flower's
RdpAccountant where the two libraries' RDP agree (and the tests say where and why they do not), keep the pinned ε values
(docs/mechanisms.md, 6), load today's checkpoints, and come from a registry; the ledgers hold one, or Flower's
RdpAccountant in its place."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from flwr.supercore.privacy_accounting import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyAccountant,
    PrivacyConfig,
    PrivacySpent,
    SamplingMethod,
)
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_app.core import choices
from fl_app.privacy import accountants as accounting
from fl_app.privacy.accountants import (
    FlowerAccountant,
    GDPAccountant,
    GDPEvent,
    SampledGaussianAccountant,
    SampledGaussianEvent,
    compute_epsilon,
    create_accountant,
    epsilon_after,
    gdp_privacy_config,
    privacy_config,
    register_accountant,
    registry,
)
from fl_app.privacy.fdp import gdp_to_delta, gdp_to_epsilon, noisy_bound
from fl_app.privacy.ledger import GDPLedger, SampledGaussianLedger
from tests.privacy.test_accounting import (
    DELTA,
    FIXED_PIN,
    FIXED_TOLERANCE,
    POPULATION,
    PRV_POISSON_PINS,
    PRV_TOLERANCE,
    RDP_POISSON_PINS,
    RDP_TOLERANCE,
    SIGMA,
    SPEC_FIXED_PIN,
    SPEC_FIXED_TOLERANCE,
    Q,
)

M = round(Q * POPULATION)  # 50 of 500
POISSON = privacy_config(DELTA, "poisson", POPULATION)
FIXED = privacy_config(DELTA, "fixed", POPULATION)
NO_AMPLIFICATION = PrivacyConfig(
    DELTA, POPULATION, NeighboringRelation.ADD_OR_REMOVE_ONE, SamplingMethod.NO_AMPLIFICATION
)


@pytest.fixture(autouse=True)
def _quiet_dp_accounting():
    # dp_accounting logs a warning for every fractional order below ~1.5 whose series it gives up on (Flower's
    # RdpAccountant then drops that order); the numbers are what the tests check.
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def flower(config: PrivacyConfig) -> RdpAccountant:
    return RdpAccountant(config)


def flower_ledger(delta: float, sampling, population: int) -> SampledGaussianLedger:
    return SampledGaussianLedger(
        delta, RdpAccountant(privacy_config(delta, sampling, population)), sampling, population
    )


def bound(rounds: int):
    return noisy_bound(
        "noisy_fedavg", "stagewise", lr=0.1, V=10, K=5, m=20, sigma=0.1, L=1, T=max(rounds, 1), delta=1e-5
    )


# ------------------------------------------------------------------------------------------------------------
# The interface
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", choices.REGISTERED_ACCOUNTANTS)
def test_every_registered_accountant_has_flowers_interface(name: str) -> None:
    kwargs = {"bound": bound, "description": "seed 004"} if name == "gdp" else {}
    accountant = create_accountant(name, POISSON if name != "gdp" else gdp_privacy_config(1e-5, 100), **kwargs)
    assert isinstance(accountant, FlowerAccountant)
    if name != "flower-rdp":  # ours subclass Flower's Protocol explicitly; Flower's own class satisfies it by shape
        assert PrivacyAccountant in type(accountant).__mro__
    assert accountant.num_releases == 0 and accountant.get_epsilon(DELTA) == 0.0


def test_flowers_protocol_is_not_runtime_checkable_hence_flower_accountant() -> None:
    """Flower's PrivacyAccountant is a plain typing.Protocol: isinstance() against it raises even for a subclass."""
    with pytest.raises(TypeError, match="runtime_checkable"):
        isinstance(SampledGaussianAccountant(POISSON), PrivacyAccountant)
    assert not isinstance(object(), FlowerAccountant)


# ------------------------------------------------------------------------------------------------------------
# The pinned ε values (docs/mechanisms.md, 6) through the interface
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "steps", "expected", "tolerance"),
    [("rdp", *pin, RDP_TOLERANCE) for pin in RDP_POISSON_PINS]
    + [("prv", *pin, PRV_TOLERANCE) for pin in PRV_POISSON_PINS],
)
def test_poisson_pins_through_flowers_interface(method: str, steps: int, expected: float, tolerance: float) -> None:
    ours = create_accountant(method, POISSON)
    ours.compose(GaussianPrivacyEvent(SIGMA, M, POPULATION), steps)
    spent = ours.get_privacy_spent()
    assert spent.epsilon == pytest.approx(expected, abs=tolerance)
    assert spent.epsilon == compute_epsilon(SIGMA, Q, steps, DELTA, accountant=method)  # the same composition code
    assert (spent.delta, spent.num_releases, spent.accounting_method) == (DELTA, steps, method)
    assert (spent.optimal_order is not None) == (method == "rdp")
    same = create_accountant(method, POISSON)
    same.compose(SampledGaussianEvent(SIGMA, Q), steps)  # a run's (σ, q): the same event in our terms
    assert same.get_epsilon(DELTA) == spent.epsilon


def test_fixed_size_pins_and_the_multiplier_convention() -> None:
    """Under replace-one a run's σ (noise std over C) is dp_accounting's multiplier σ/2, which Flower's event
    states: 22.47 (docs/mechanisms.md, 6) is Flower's RdpAccountant fed the run's σ unchanged, and understates ε
    13-fold."""
    steps, expected = FIXED_PIN
    ours = create_accountant("rdp", FIXED)
    ours.compose(SampledGaussianEvent(SIGMA, Q), steps)
    assert ours.get_epsilon(DELTA) == pytest.approx(expected, abs=FIXED_TOLERANCE)
    assert ours.get_epsilon(DELTA) == compute_epsilon(SIGMA, Q, steps, DELTA, sampling="fixed", population=POPULATION)
    reference = flower(FIXED)
    reference.compose(GaussianPrivacyEvent(SIGMA / 2, M, POPULATION), steps)
    assert ours.get_epsilon(DELTA) == pytest.approx(reference.get_epsilon(DELTA), rel=1e-9)
    naive = flower(FIXED)
    naive.compose(GaussianPrivacyEvent(SIGMA, M, POPULATION), SPEC_FIXED_PIN[0])
    assert naive.get_epsilon(DELTA) == pytest.approx(SPEC_FIXED_PIN[1], abs=SPEC_FIXED_TOLERANCE)


def test_pld_and_prv_are_at_most_rdp() -> None:
    epsilons = {}
    for method in ("rdp", "prv", "pld"):
        accountant = create_accountant(method, POISSON)
        accountant.compose(SampledGaussianEvent(SIGMA, Q), 300)
        epsilons[method] = accountant.get_epsilon(DELTA)
    assert epsilons["pld"] <= epsilons["rdp"] and epsilons["prv"] <= epsilons["rdp"]
    assert epsilons["pld"] == pytest.approx(epsilons["prv"], abs=0.05)


# ------------------------------------------------------------------------------------------------------------
# Against Flower's RdpAccountant on the same events
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "events",
    [
        [(SIGMA / 2, M, 300)],
        [(SIGMA / 2, M, 40), (0.75, M, 9), (SIGMA / 2, 20, 3)],
        [(2.0, 100, 1), (0.3, 50, 7)],
    ],
)
def test_rdp_equals_flowers_rdp_accountant_without_replacement(events) -> None:
    """Both are dp_accounting's SampledWithoutReplacementDpEvent RDP on its own orders: equal."""
    ours, reference = create_accountant("rdp", FIXED), flower(FIXED)
    for sigma, size, count in events:
        for accountant in (ours, reference):
            accountant.compose(GaussianPrivacyEvent(sigma, size, POPULATION), count)
    assert ours.num_releases == reference.num_releases
    for delta in (DELTA, 1e-5):
        assert ours.get_epsilon(delta) == pytest.approx(reference.get_epsilon(delta), rel=1e-9)
    assert ours.get_privacy_spent().optimal_order == reference.get_privacy_spent().optimal_order


@pytest.mark.parametrize(
    "events",
    [
        [(1.0, 200, 5)],
        [(1.5, 50, 20)],
        [(3.0, 200, 20)],
        [(2.0, 50, 20), (3.0, 200, 5)],
        [(1.5, 10, 20), (2.0, 10, 20)],
    ],
)
def test_rdp_equals_flowers_rdp_accountant_with_poisson_sampling_where_the_series_agree(events) -> None:
    """Poisson sampling, at events whose tightest order is an integer in both grids: equal to rounding."""
    config = privacy_config(1e-5, "poisson", 1000)
    ours, reference = create_accountant("rdp", config), flower(config)
    for sigma, size, count in events:
        for accountant in (ours, reference):
            accountant.compose(GaussianPrivacyEvent(sigma, size, 1000), count)
    ours_spent, flower_spent = ours.get_privacy_spent(), reference.get_privacy_spent()
    assert float(flower_spent.optimal_order).is_integer()
    assert ours_spent.optimal_order == flower_spent.optimal_order
    assert ours_spent.epsilon == pytest.approx(flower_spent.epsilon, rel=1e-9)


def test_where_flowers_poisson_rdp_differs_and_why() -> None:
    """Opacus and dp_accounting 0.6 compute the Poisson-subsampled Gaussian's RDP with the same series (Mironov,
    Talwar, Zhang 2019, §3.3) except at fractional orders α: Opacus adds the terms with the sign of binom(α, i),
    dp_accounting adds |terms| (its _log_comb is gammaln-based: log|binom|), a larger, still valid bound that it also
    gives up on below α ≈ 1.5 (inf). Integer orders agree exactly; the grids also differ (dp_accounting adds 11 and
    128..1024). So at the pinned setting (q = 0.1, σ = 0.95), whose tightest order is 2.1, Flower's ε is larger than
    ours by < 1%."""
    from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_poisson_subsampled_gaussian
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp

    orders = np.array(RDPAccountant.DEFAULT_ALPHAS)
    opacus_curve = compute_rdp(q=Q, noise_multiplier=SIGMA, steps=1, orders=orders)
    dp_curve = _compute_rdp_poisson_subsampled_gaussian(Q, SIGMA, orders)
    integer = orders == np.round(orders)
    np.testing.assert_allclose(dp_curve[integer], opacus_curve[integer], rtol=1e-12)
    assert np.all(dp_curve[~integer] >= opacus_curve[~integer] * (1 - 1e-12))  # |terms| ≥ signed terms
    at = orders == 2.1  # the pinned setting's tightest order
    assert dp_curve[at] > 1.005 * opacus_curve[at]
    for steps, pinned in RDP_POISSON_PINS:
        reference = flower(POISSON)
        reference.compose(GaussianPrivacyEvent(SIGMA, M, POPULATION), steps)
        ours = create_accountant("rdp", POISSON)
        ours.compose(GaussianPrivacyEvent(SIGMA, M, POPULATION), steps)
        assert ours.get_epsilon(DELTA) == pytest.approx(pinned, abs=RDP_TOLERANCE)
        assert ours.get_epsilon(DELTA) < reference.get_epsilon(DELTA) < 1.01 * ours.get_epsilon(DELTA)
        assert not float(reference.get_privacy_spent().optimal_order).is_integer()


# ------------------------------------------------------------------------------------------------------------
# would_exceed, epsilon_after, state, get_delta
# ------------------------------------------------------------------------------------------------------------


def test_would_exceed_asks_without_composing() -> None:
    accountant = create_accountant("rdp", POISSON)
    accountant.compose(SampledGaussianEvent(SIGMA, Q), 99)
    before = json.dumps(accountant.state_dict())
    eps_100, eps_101 = compute_epsilon(SIGMA, Q, 100, DELTA), compute_epsilon(SIGMA, Q, 101, DELTA)
    budget = 0.5 * (eps_100 + eps_101)
    event = GaussianPrivacyEvent(SIGMA, M, POPULATION)
    assert not accountant.would_exceed(event, budget)
    assert accountant.would_exceed(event, budget, count=2)
    assert accountant.epsilon_after(event, 2) == pytest.approx(eps_101, rel=1e-12)
    assert json.dumps(accountant.state_dict()) == before and accountant.num_releases == 99
    with pytest.raises(ValueError, match="max_epsilon"):
        accountant.would_exceed(event)  # neither the config nor the call states a limit
    budgeted = SampledGaussianAccountant(privacy_config(DELTA, "poisson", POPULATION, max_epsilon=budget))
    budgeted.load_state_dict(accountant.state_dict())  # max_epsilon is a budget, not part of what was spent
    assert budgeted.would_exceed(event, count=2) and not budgeted.would_exceed(event)


@settings(max_examples=40, deadline=None)
@given(
    sigma=st.sampled_from([0.7, 0.95, 1.3, 2.0]),
    rate=st.sampled_from([0.02, 0.1, 0.3]),
    done=st.integers(0, 200),
    count=st.integers(1, 50),
    limit=st.floats(0.05, 40.0),
)
def test_would_exceed_is_projected_epsilon_above_the_limit(sigma, rate, done, count, limit) -> None:
    accountant = create_accountant("rdp", POISSON)
    event = SampledGaussianEvent(sigma, rate)
    if done:
        accountant.compose(event, done)
    state = accountant.state_dict()
    projected = accountant.epsilon_after(event, count)
    assert accountant.would_exceed(event, limit, count) == (projected > limit)
    assert accountant.state_dict() == state
    assert projected == pytest.approx(compute_epsilon(sigma, rate, done + count, DELTA), rel=1e-12)


def test_epsilon_after_a_flower_accountant_copies_it() -> None:
    reference = flower(POISSON)
    event = GaussianPrivacyEvent(SIGMA, M, POPULATION)
    for _ in range(3):
        reference.compose(event)  # three compositions, which the copy merges into one of count 3
    state = reference.state_dict()
    projected = epsilon_after(reference, event, 2)
    assert reference.state_dict() == state and reference.num_releases == 3
    direct = flower(POISSON)
    direct.compose(event, 5)
    assert projected == pytest.approx(direct.get_epsilon(DELTA), rel=1e-12)
    assert reference.would_exceed(event, projected * 0.999, 2)
    assert not reference.would_exceed(event, projected * 1.001, 2)


def test_state_dict_round_trip_and_todays_checkpoints() -> None:
    accountant = create_accountant("rdp", POISSON)
    accountant.compose(SampledGaussianEvent(SIGMA, Q), 150)
    accountant.compose(GaussianPrivacyEvent(1.2, 25, POPULATION), 20)
    state = json.loads(json.dumps(accountant.state_dict()))
    restored = create_accountant("rdp", POISSON)
    restored.load_state_dict(state)
    assert restored.num_releases == 170 and restored.get_epsilon(DELTA) == accountant.get_epsilon(DELTA)

    # A checkpoint of today's accounting.CompositionHistory (no config), and one with population None (Poisson).
    today = accounting.CompositionHistory("rdp", "poisson", POPULATION)
    today.step(SIGMA, Q, 150)
    today.step(1.2, 0.05, 20)
    for old in (today.state_dict(), {**today.state_dict(), "population": None}):
        loaded = SampledGaussianAccountant(POISSON)
        loaded.load_state_dict(json.loads(json.dumps(old)))
        assert loaded.history == today.history and loaded.get_epsilon(DELTA) == today.get_epsilon(DELTA)
    # ... and today's class loads ours (a superset of its state).
    assert accounting.CompositionHistory.from_state_dict(state).get_epsilon(DELTA) == accountant.get_epsilon(DELTA)

    with pytest.raises(ValueError, match="saved for"):
        create_accountant("prv", POISSON).load_state_dict(state)
    with pytest.raises(ValueError, match="saved for"):
        create_accountant("rdp", FIXED).load_state_dict(state)
    with pytest.raises(ValueError, match="saved for config"):
        create_accountant("rdp", privacy_config(1e-5, "poisson", POPULATION)).load_state_dict(state)
    with pytest.raises(ValueError, match="Flower RdpAccountant"):
        create_accountant("rdp", POISSON).load_state_dict(flower(POISSON).state_dict())


@pytest.mark.parametrize(("method", "sampling"), [("rdp", "poisson"), ("rdp", "fixed"), ("pld", "poisson")])
def test_get_delta_inverts_get_epsilon(method: str, sampling: str) -> None:
    accountant = create_accountant(method, privacy_config(DELTA, sampling, POPULATION))
    accountant.compose(SampledGaussianEvent(SIGMA, Q), 120)
    for delta in (DELTA, 1e-5):
        assert accountant.get_delta(accountant.get_epsilon(delta)) == pytest.approx(delta, rel=1e-9)
    assert create_accountant(method, privacy_config(DELTA, sampling, POPULATION)).get_delta(1.0) == 0.0


def test_prv_get_delta_is_a_search_on_get_epsilon() -> None:
    accountant = create_accountant("prv", POISSON)
    accountant.compose(SampledGaussianEvent(2.0, 0.2), 3)
    epsilon = accountant.get_epsilon(DELTA)
    delta = accountant.get_delta(epsilon)
    assert delta == pytest.approx(DELTA, rel=1e-4)
    assert accountant.get_epsilon(delta) <= epsilon  # the sound end of the bracket


def test_events_and_configurations_are_validated() -> None:
    with pytest.raises(ValueError):
        SampledGaussianEvent(-1.0, Q)
    with pytest.raises(ValueError):
        SampledGaussianEvent(SIGMA, 1.5)
    with pytest.raises(ValueError):
        SampledGaussianEvent(math.nan, Q)
    assert SampledGaussianEvent(np.float32(0.5), np.float64(0.25)) == SampledGaussianEvent(0.5, 0.25)
    accountant = create_accountant("rdp", FIXED)
    with pytest.raises(ValueError, match="not an integer"):
        accountant.compose(SampledGaussianEvent(SIGMA, 0.101))
    with pytest.raises(ValueError, match="population_size"):
        accountant.compose(GaussianPrivacyEvent(SIGMA, 5, 100))
    with pytest.raises(TypeError, match="GDPEvent"):
        accountant.compose(GDPEvent())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count"):
        accountant.compose(SampledGaussianEvent(SIGMA, Q), 0)
    assert accountant.num_releases == 0
    with pytest.raises(NotImplementedError):
        create_accountant("pld", FIXED)  # dp_accounting's PLD has no sampling without replacement
    with pytest.raises(ValueError, match="no-amplification"):
        SampledGaussianAccountant(NO_AMPLIFICATION)
    with pytest.raises(ValueError, match="accounts by"):
        registry.ACCOUNTANTS["prv"](POISSON, method="rdp")
    zero_noise = create_accountant("rdp", POISSON)
    zero_noise.compose(SampledGaussianEvent(0.0, Q))
    assert zero_noise.get_epsilon(DELTA) == math.inf and zero_noise.get_delta(5.0) == 1.0


# ------------------------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------------------------


def test_registry_creates_every_name_from_the_one_list() -> None:
    assert tuple(registry.ACCOUNTANTS) == choices.REGISTERED_ACCOUNTANTS
    assert set(choices.ACCOUNTANTS) < set(choices.REGISTERED_ACCOUNTANTS)
    for method in choices.ACCOUNTANTS:
        accountant = create_accountant(method, POISSON)
        assert isinstance(accountant, SampledGaussianAccountant) and accountant.method == method
    assert type(create_accountant("flower-rdp", POISSON)) is RdpAccountant
    gdp = create_accountant("gdp", gdp_privacy_config(1e-5, 100), bound=bound, description="seed 004")
    assert isinstance(gdp, GDPAccountant) and gdp.describe() == "seed 004"


def test_registry_refuses_an_unknown_name_and_lists_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="unknown accountant 'moments'; registered: rdp, prv, pld, gdp, flower-rdp"):
        create_accountant("moments", POISSON)


def test_register_accountant(monkeypatch) -> None:
    monkeypatch.setattr(registry, "ACCOUNTANTS", dict(registry.ACCOUNTANTS))

    class TwiceAccountant(SampledGaussianAccountant):
        """A user's accountant: every release counted twice."""

        def compose(self, event, count=1):
            super().compose(event, 2 * count)

    register_accountant("twice", TwiceAccountant)
    twice = create_accountant("twice", POISSON, method="pld")
    twice.compose(SampledGaussianEvent(SIGMA, Q), 3)
    assert twice.num_releases == 6 and twice.method == "pld"
    with pytest.raises(ValueError, match="already registered"):
        register_accountant("twice", TwiceAccountant)
    register_accountant("rdp", TwiceAccountant, force=True)
    assert type(create_accountant("rdp", POISSON)) is TwiceAccountant
    with pytest.raises(TypeError, match="lacks"):
        register_accountant("nothing", type("Nothing", (), {"compose": lambda self, e, c=1: None}))
    with pytest.raises(TypeError):
        register_accountant("instance", create_accountant("pld", POISSON))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------------
# GDP
# ------------------------------------------------------------------------------------------------------------


def test_gdp_accountant_gives_the_gdp_ledgers_numbers() -> None:
    accountant = GDPAccountant(gdp_privacy_config(1e-5, 100), bound, lambda: "seed 004 Thm 3, stagewise")
    assert accountant.get_epsilon(1e-5) == 0.0 and accountant.mu == 0.0 and accountant.get_delta(1.0) == 0.0
    accountant.compose(GDPEvent(), 600)
    assert accountant.num_releases == 600 and accountant.mu == bound(600).mu
    assert accountant.get_epsilon(1e-5) == bound(600).epsilon
    assert accountant.get_epsilon(1e-3) == gdp_to_epsilon(bound(600).mu, 1e-3)
    assert accountant.get_delta(2.0) == gdp_to_delta(bound(600).mu, 2.0)
    assert accountant.get_delta(accountant.get_epsilon(1e-5)) == pytest.approx(1e-5, rel=1e-6)
    assert accountant.epsilon_after(GDPEvent()) == bound(601).epsilon and accountant.num_releases == 600
    assert accountant.would_exceed(GDPEvent(), bound(601).epsilon * 0.999)
    assert not accountant.would_exceed(GDPEvent(), bound(601).epsilon * 1.001)
    assert accountant.get_privacy_spent() == PrivacySpent(bound(600).epsilon, 1e-5, 600, "gdp")
    assert accountant.state_dict() == {"gdp_rounds": 600}
    with pytest.raises(TypeError, match="GDPEvent"):
        accountant.compose(GaussianPrivacyEvent(1.0, 10, 100))  # type: ignore[arg-type]

    ledger = GDPLedger(1e-5, bound, lambda: "seed 004 Thm 3, stagewise")
    ledger.step(0.0, 1.0, rounds=600)
    assert isinstance(ledger.accountant, GDPAccountant) and isinstance(ledger.accountant, FlowerAccountant)
    assert (ledger.epsilon(), ledger.mu, ledger.epsilon_at(1e-3)) == (
        accountant.get_epsilon(1e-5),
        accountant.mu,
        accountant.get_epsilon(1e-3),
    )
    assert ledger.projected_epsilon(0.0, 1.0, rounds=2) == bound(602).epsilon
    assert ledger.accountant.config.population_size == 20  # no population given: the bound's m stands in
    restored = GDPLedger(1e-5, bound, lambda: "", population=100)
    restored.load_state_dict({"gdp_rounds": 600})  # today's checkpoint
    assert restored.rounds == 600 and restored.epsilon() == ledger.epsilon()


# ------------------------------------------------------------------------------------------------------------
# The ledgers hold an accountant with Flower's interface; Flower's RdpAccountant works in its place
# ------------------------------------------------------------------------------------------------------------


def test_the_ledger_holds_ours_and_loads_todays_checkpoint() -> None:
    ledger = SampledGaussianLedger(1e-3, "prv", "poisson", 1000)
    assert isinstance(ledger.accountant, SampledGaussianAccountant) and ledger.accountant.method == "prv"
    assert ledger.accountant.config == privacy_config(1e-3, "poisson", 1000)
    today = accounting.CompositionHistory("prv", "poisson", 1000)
    today.step(SIGMA, Q, 12)
    ledger.load_state_dict({"accountant": today.state_dict()})
    assert ledger.rounds == 12 and ledger.epsilon() == today.get_epsilon(1e-3)
    assert ledger.claim()["accountant"] == "prv"


@pytest.mark.parametrize(
    ("sampling", "sigma", "rate", "population", "delta"),
    [("fixed", SIGMA, Q, POPULATION, DELTA), ("poisson", 2.0, 0.05, 1000, 1e-5)],
)
def test_the_ledger_with_flowers_rdp_accountant_gives_ours(sampling, sigma, rate, population, delta) -> None:
    ours = SampledGaussianLedger(delta, "rdp", sampling, population)
    theirs = flower_ledger(delta, sampling, population)
    for ledger in (ours, theirs):
        ledger.step(sigma, rate, rounds=15)
        ledger.step(sigma, rate)
        ledger.step(sigma, rate, rounds=0)
    assert theirs.rounds == ours.rounds == 16
    assert theirs.epsilon() == pytest.approx(ours.epsilon(), rel=1e-9)
    assert theirs.projected_epsilon(sigma, rate, 4) == pytest.approx(ours.projected_epsilon(sigma, rate, 4), rel=1e-9)
    assert theirs.rounds == 16  # the guard's question changed nothing
    claim, reference = theirs.claim(), ours.claim()
    assert claim.pop("accountant") == "flwr-rdp" and reference.pop("accountant") == "rdp"
    assert claim.keys() == reference.keys() and claim["sampling_event"] == reference["sampling_event"]
    restored = flower_ledger(delta, sampling, population)
    restored.load_state_dict(json.loads(json.dumps(theirs.state_dict())))
    assert restored.epsilon() == theirs.epsilon()


def test_the_ledger_refuses_a_flower_accountant_that_does_not_account_the_run() -> None:
    poisson = RdpAccountant(privacy_config(DELTA, "poisson", POPULATION))
    with pytest.raises(ValueError, match=r"sampling_method 'poisson'.*sampling='fixed'"):
        SampledGaussianLedger(DELTA, poisson, "fixed", POPULATION)
    with pytest.raises(ValueError, match=r"sampling_method 'without-replacement'.*sampling='poisson'"):
        SampledGaussianLedger(DELTA, RdpAccountant(FIXED), "poisson", POPULATION)
    with pytest.raises(ValueError, match="population"):
        SampledGaussianLedger(DELTA, poisson, "poisson", 25)
    with pytest.raises(ValueError, match="no-amplification"):
        SampledGaussianLedger(DELTA, RdpAccountant(NO_AMPLIFICATION), "fixed", POPULATION)
    with pytest.raises(TypeError):
        SampledGaussianLedger(DELTA, object(), "poisson", POPULATION)  # type: ignore[arg-type]
    ledger = SampledGaussianLedger(DELTA, poisson, "poisson", POPULATION)
    with pytest.raises(ValueError, match="not an integer"):
        ledger.step(SIGMA, 0.1001)  # q·M = 50.05: Flower's event states a whole sample size
    with pytest.raises(ValueError, match="not an integer"):
        ledger.projected_epsilon(SIGMA, 0.1001)
    assert ledger.rounds == 0


def test_a_poisson_run_may_be_accounted_without_amplification_a_looser_bound() -> None:
    ledger = SampledGaussianLedger(DELTA, RdpAccountant(NO_AMPLIFICATION), "poisson", POPULATION)
    ledger.step(SIGMA, Q, rounds=20)
    amplified = compute_epsilon(SIGMA, Q, 20, DELTA)
    assert ledger.epsilon() > 5 * amplified
    assert ledger.claim()["sampling_event"] == "poisson (accounted without amplification)"
