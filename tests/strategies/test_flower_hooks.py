"""The round is Flower's hooks. Whatever drives ``configure_train`` / ``aggregate_train`` — Flower's own
``Strategy.start`` (the base-class method a subclass inherits), our ``start()``, or a user's loop — every released
model is logged and accounted, the settings are resolved for the grid before the first message, and nothing leaves
in a MetricRecord that ``privacy.client_statistics`` does not allow.

The ClientApp is the real handler (:class:`tests.helpers.InProcessGrid`: Flower's wire format, in this process)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import Strategy

from fl_app.config import ConfigError, compose_config
from fl_app.models import build_model_for_dataset, get_weights
from fl_app.privacy.accountants import compute_epsilon
from fl_app.releases import ReleaseLog, model_digest
from strategies import ClientLevelDP, FederatedAveraging
from strategies.base import FederatedStrategy
from strategies.dp_fedavg import DPFedAvg
from strategies.registry import build_strategy
from tests.helpers import FakeGrid, InProcessGrid, build
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

SMALL = [
    "dataset.num_clients=20",
    "dataset.max_train_samples=400",  # 20 images a client
    "dataset.max_test_samples=100",
    "privacy.sample_rate=0.2",
]


def _initial(config) -> ArrayRecord:
    return ArrayRecord(get_weights(build_model_for_dataset(config.model.name, config.dataset.name, seed=0)))


def _strategy(name: str, *extra: str, **run) -> FederatedStrategy:
    config = compose_config([f"strategy={name}", *SMALL, *extra])
    return build_strategy(config, **run)


@pytest.mark.parametrize("name", ["dp_fedavg", "dp_fedsam", "noisy_fedavg"])
def test_flowers_own_start_accounts_every_release(tmp_path: Path, name: str) -> None:
    strategy = _strategy(name, checkpoint_dir=tmp_path)
    # The base-class loop: what a user's subclass that does not override start() runs.
    result = Strategy.start(strategy, InProcessGrid(nodes=2), _initial(strategy.config), num_rounds=2)
    assert strategy.account.ledger is not None and strategy.account.ledger.rounds == 2
    assert strategy.account.rounds_released == 2
    releases = ReleaseLog(tmp_path).read()
    assert [r.round for r in releases] == [1, 2]
    assert releases[-1].digest == model_digest(result.arrays.to_numpy_ndarrays())  # the model Flower kept
    p = strategy.config.privacy
    if name == "noisy_fedavg":
        expected = strategy.bound(2).epsilon  # the GDP bound after 2 releases
    else:
        expected = compute_epsilon(strategy.account.accounted_noise_multiplier, p.sample_rate, 2, p.delta)
    assert strategy.epsilon() == pytest.approx(expected, rel=1e-12) and expected > 0
    assert strategy.dp_guarantee()["rounds_released"] == 2
    # Settings were resolved for the grid before the first message (Flower's in-memory grid: a simulation).
    assert strategy.run_settings is not None and strategy.run_settings.simulation


def test_flowers_own_start_publishes_only_what_client_statistics_allows() -> None:
    strategy = _strategy("dp_fedavg", "privacy.client_statistics=none")
    result = Strategy.start(strategy, InProcessGrid(nodes=2), _initial(strategy.config), num_rounds=2)
    published = {key for record in result.train_metrics_clientapp.values() for key in record}
    leaked = published & {"received", "aggregated", "failed", "sampled", "train_loss", "pre_clip_norm_mean"}
    assert not leaked, leaked
    raw = _strategy("dp_fedavg", "privacy.client_statistics=raw")
    result = Strategy.start(raw, InProcessGrid(nodes=2), _initial(raw.config), num_rounds=1)
    assert "aggregated" in result.train_metrics_clientapp[1]  # raw: the counts are published (outside ε)


def test_flowers_own_start_refuses_seeded_randomness_on_a_deployment_grid_before_any_message() -> None:
    config = compose_config(["strategy=dp_fedavg", *SMALL, "privacy.secure_noise=false"])
    strategy = DPFedAvg(config)
    grid = FakeGrid()  # not the simulation engine
    with pytest.raises(ConfigError, match="allow_seeded_deployment"):
        Strategy.start(strategy, grid, _initial(config), num_rounds=2)
    assert grid.sent == []
    assert strategy.account.ledger is not None and strategy.account.ledger.rounds == 0


def test_flowers_own_start_stops_at_the_budget_guard_and_releases_nothing_more() -> None:
    probe = _strategy("dp_fedavg")
    sigma, delta = probe.account.accounted_noise_multiplier, probe.config.privacy.delta
    one, two = (compute_epsilon(sigma, 0.2, rounds, delta) for rounds in (1, 2))
    strategy = _strategy("dp_fedavg", f"privacy.max_epsilon={(one + two) / 2}")  # round 1 may run, round 2 not
    grid = InProcessGrid(nodes=2)
    Strategy.start(strategy, grid, _initial(strategy.config), num_rounds=3)
    # Flower's loop sends each round's train messages, then its (empty) evaluate ones: nothing after the guard.
    assert grid.sent == [2, 0, 0, 0, 0, 0]
    assert strategy.account.ledger is not None and strategy.account.ledger.rounds == 1
    assert strategy.stop_reason is not None and "budget guard" in strategy.stop_reason


class CountingHooks(FederatedAveraging):
    """A user's subclass customising the round the Flower way: overrides of both hooks that call super() (made
    private by the client-level DP layer around it)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, int]] = []
        self.seen: list[int] = []  # replies each aggregate_train call was given

    def configure_train(self, server_round, arrays, config, grid):
        self.calls.append(("configure_train", server_round))
        return super().configure_train(server_round, arrays, ConfigRecord({**config, "user-key": 7}), grid)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.calls.append(("aggregate_train", server_round))
        self.seen.append(len(replies))
        return super().aggregate_train(server_round, replies)


def test_our_start_runs_a_subclasss_hooks() -> None:
    strategy = ClientLevelDP(CountingHooks(compose_config(["strategy=dp_fedavg", *SMALL])))
    grid = InProcessGrid(nodes=2)
    result = strategy.start(grid, _initial(strategy.config), num_rounds=2)
    assert strategy.seen == [2, 2]  # its aggregate_train saw every reply (none taken before it was called)
    assert strategy.calls == [("configure_train", 1), ("aggregate_train", 1), ("configure_train", 2),
                              ("aggregate_train", 2)]  # fmt: skip
    assert strategy.account.ledger is not None and strategy.account.ledger.rounds == 2
    assert len(result.arrays) > 0


def test_a_resumed_strategy_refuses_a_loop_that_starts_at_round_one(tmp_path: Path) -> None:
    strategy = build("strategy=dp_fedavg", *SMALL, "checkpoint_every=1", checkpoint_dir=tmp_path)
    strategy.start(FakeGrid(), _initial(strategy.config), num_rounds=1)
    from fl_app.checkpoint import load_checkpoint

    resumed = build("strategy=dp_fedavg", *SMALL, "checkpoint_every=1", checkpoint_dir=tmp_path,
                    resume_from=load_checkpoint(tmp_path))  # fmt: skip
    assert resumed.account.ledger is not None and resumed.account.ledger.rounds == 1  # accounted when built
    with pytest.raises(RuntimeError, match="resume_from"):
        Strategy.start(resumed, FakeGrid(), _initial(resumed.config), num_rounds=2)
    assert np.isfinite(resumed.epsilon())


# ----- the package exports its strategies; the accountant speaks Flower's interface -------------------------------


def test_the_package_exports_its_strategies_and_their_accountant_is_flowers_interface() -> None:
    from flwr.serverapp import PrivacyAccountant

    from strategies import DPFedAvg as Exported
    from strategies import DPFedSAM, NoisyFedAvg

    assert Exported is DPFedAvg and issubclass(NoisyFedAvg, FederatedStrategy)
    strategy = DPFedSAM(num_clients=100, sample_rate=0.1, clip_norm=0.2, noise_multiplier=0.95)
    assert PrivacyAccountant in type(strategy.accountant).__mro__  # the Protocol, subclassed explicitly
    assert strategy.accountant is strategy.account.ledger.accountant


def test_flowers_rdp_accountant_accounts_a_run_in_place_of_ours() -> None:
    from flwr.serverapp import GaussianPrivacyEvent, PrivacyConfig, RdpAccountant
    from flwr.supercore.privacy_accounting import NeighboringRelation, SamplingMethod

    def config() -> PrivacyConfig:
        return PrivacyConfig(target_delta=0.05, population_size=20, sampling_method=SamplingMethod.POISSON,
                             neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE)  # fmt: skip

    flowers = RdpAccountant(config())
    strategy = build("strategy=dp_fedavg", *SMALL, "privacy.delta=0.05", accountant=flowers)
    assert strategy.accountant is flowers
    strategy.start(FakeGrid(), _initial(strategy.config), num_rounds=2)
    assert flowers.num_releases == 2
    reference = RdpAccountant(config())
    sigma = strategy.account.accounted_noise_multiplier
    reference.compose(GaussianPrivacyEvent(sigma, sample_size=4, population_size=20), 2)
    assert strategy.epsilon() == pytest.approx(reference.get_epsilon(0.05), rel=1e-12)
    assert strategy.dp_guarantee()["rounds_released"] == 2
