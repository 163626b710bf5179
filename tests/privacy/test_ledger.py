"""fl_app/privacy/ledger.py: the two ledgers against the accountants they wrap, their checkpoint state, and a
strategy that brings its own ledger (the one choice a strategy makes about accounting)."""

from __future__ import annotations

import pytest
from flwr.app import ArrayRecord

from fl_app.config import DPConfig
from fl_app.privacy.accountants import compute_epsilon
from fl_app.privacy.fdp import gdp_to_epsilon, noisy_bound
from fl_app.privacy.ledger import GDPLedger, PrivacyLedger, SampledGaussianLedger
from strategies import ClientLevelDP, FederatedAveraging, PrivateRounds
from tests.helpers import FakeGrid, build, zeros
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)


def test_sampled_gaussian_ledger_is_the_accountant_of_its_releases():
    ledger = SampledGaussianLedger(1e-3, "rdp", "poisson", 1000)
    assert ledger.rounds == 0 and ledger.epsilon() == 0
    ledger.step(0.95, 0.1, rounds=7)
    assert ledger.rounds == 7
    assert ledger.epsilon() == pytest.approx(compute_epsilon(0.95, 0.1, 7, 1e-3), rel=1e-12)
    assert ledger.projected_epsilon(0.95, 0.1) == pytest.approx(compute_epsilon(0.95, 0.1, 8, 1e-3), rel=1e-12)
    assert ledger.rounds == 7  # the guard's question changes nothing
    claim = ledger.claim()
    assert claim["statement"] == f"client-level ({ledger.epsilon():.4g}, 0.001)-DP"
    assert (claim["sampling_event"], claim["neighbouring"], claim["rounds_accounted"]) == (
        "poisson",
        "add/remove one client",
        7,
    )
    restored = SampledGaussianLedger(1e-3, "rdp", "poisson", 1000)
    restored.load_state_dict(ledger.state_dict())
    assert restored.epsilon() == ledger.epsilon() and restored.rounds == 7
    with pytest.raises(ValueError, match="saved for"):  # a checkpoint of another accounting is refused
        SampledGaussianLedger(1e-3, "rdp", "fixed", 1000).load_state_dict(ledger.state_dict())


def test_gdp_ledger_is_the_bound_of_its_number_of_releases():
    def bound(rounds: int):
        return noisy_bound(
            "noisy_fedavg", "stagewise", lr=0.1, V=10, K=5, m=20, sigma=0.1, L=1, T=max(rounds, 1), delta=1e-5
        )

    ledger = GDPLedger(1e-5, bound, lambda: "seed 004 Thm 3, stagewise; assumes L = 1")
    assert ledger.epsilon() == 0 and ledger.mu == 0
    ledger.step(0.0, 1.0, rounds=600)  # (σ, q) do not enter a GDP bound stated in the mechanism's parameters
    assert ledger.mu == pytest.approx(bound(600).mu) and ledger.epsilon() == pytest.approx(bound(600).epsilon)
    assert ledger.epsilon_at(1e-3) == pytest.approx(gdp_to_epsilon(bound(600).mu, 1e-3))
    assert ledger.projected_epsilon(0.0, 1.0) == pytest.approx(bound(601).epsilon)
    assert ledger.claim()["statement"].endswith("-GDP (seed 004 Thm 3, stagewise; assumes L = 1)")
    assert ledger.uncovered("why").startswith("not covered: why; paper bound (")
    restored = GDPLedger(1e-5, bound, lambda: "")
    restored.load_state_dict(ledger.state_dict())
    assert restored.rounds == 600


class HalfRoundsLedger(SampledGaussianLedger):
    """A ledger written in the test: it counts every release twice (say, a mechanism released in two parts)."""

    def step(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> None:
        super().step(noise_multiplier, sample_rate, 2 * rounds)

    def projected_epsilon(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> float:
        return super().projected_epsilon(noise_multiplier, sample_rate, 2 * rounds)


class DoubleCounting(PrivateRounds):
    """Client-level DP rounds accounted by the test's ledger."""

    def ledger(self, privacy: DPConfig, num_clients: int) -> PrivacyLedger:
        return HalfRoundsLedger(privacy.delta, privacy.accountant, privacy.sampling, num_clients)


def test_a_strategy_that_brings_its_own_ledger_is_accounted_by_it_everywhere(tmp_path):
    overrides = ["strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2", "privacy.max_epsilon=3"]
    config = build(*overrides).config
    strategy = ClientLevelDP(FederatedAveraging(config, checkpoint_dir=tmp_path), private_rounds=DoubleCounting())
    strategy.start(FakeGrid(), ArrayRecord(zeros([(4, 5)])), num_rounds=10)
    # The round loop, the budget guard and run.json's claim all went through the test's ledger.
    rounds = strategy.ledger.rounds
    assert rounds % 2 == 0 and rounds > 0
    assert strategy.epsilon() == pytest.approx(compute_epsilon(0.95, 0.2, rounds, 1 / 50), rel=1e-12)
    assert strategy.stop_reason is not None and strategy.epsilon() <= 3  # stopped by the guard on its count
    assert strategy.dp_guarantee()["rounds_accounted"] == rounds
