"""A mechanism is an object with a client step, a server step and its own state. The strategy builds
its pipeline once, so a server step keeps state from round to round, and the checkpoint carries it generically
(``Mechanism.state_dict`` / ``load_state_dict``), not through a hard-coded list."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord

from fl_app.checkpoint import load_checkpoint
from fl_app.config import compose_config
from fl_app.privacy.accountants import SampledGaussianEvent, compute_epsilon
from fl_app.privacy.pipeline import GaussianNoise, Mechanism, ReleaseParameters, ServerStep
from strategies import ClientLevelDP, FederatedAveraging
from strategies.dp_fedavg import DPFedAvg
from tests.helpers import FakeGrid, random_update
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

SHAPES = [(4, 5), (5,)]
RUN = [
    "strategy=dp_fedavg",
    "dataset.num_clients=20",
    "privacy.sample_rate=0.2",
    "checkpoint_every=1",
    "privacy.secure_noise=false",
    "privacy.allow_seeded_deployment=true",
    "privacy.client_statistics=raw",
    "allow_virtual_deployment=true",  # FakeGrid counts as a real SuperLink
]


class RoundsSeen(Mechanism):
    """A server step with state: it counts the rounds it has post-processed (and changes nothing)."""

    def __init__(self) -> None:
        self.rounds = 0

    def server_step(self, average: list[np.ndarray], step: ServerStep) -> list[np.ndarray]:
        self.rounds += 1
        return average

    def state_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds = int(state["rounds"])


class CountingFedAvg(FederatedAveraging):
    """A user's algorithm: FederatedAveraging with one more server step (the DP layer around it is ClientLevelDP's)."""

    def server_mechanisms(self) -> tuple[Mechanism, ...]:
        return (RoundsSeen(),)


def _counter(strategy: ClientLevelDP) -> RoundsSeen:
    (counter,) = [m for m in strategy.mechanisms if isinstance(m, RoundsSeen)]
    return counter


def test_a_mechanism_keeps_its_state_across_rounds_and_a_resume(tmp_path: Path) -> None:
    initial = ArrayRecord(random_update(SHAPES, 0.1, seed=0))
    first = ClientLevelDP(CountingFedAvg(compose_config(RUN), checkpoint_dir=tmp_path))
    first.start(FakeGrid(), initial, num_rounds=2)
    assert _counter(first).rounds == 2  # one object for the whole run, not rebuilt each round
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.round == 2 and checkpoint.strategy_state["mechanisms"][-1] == {"rounds": 2}

    resumed = ClientLevelDP(CountingFedAvg(compose_config(RUN), checkpoint_dir=tmp_path, resume_from=checkpoint))
    assert _counter(resumed).rounds == 2  # restored when built
    resumed.start(FakeGrid(), initial, num_rounds=3)
    assert _counter(resumed).rounds == 3
    sigma = resumed.account.accounted_noise_multiplier
    assert resumed.epsilon() == pytest.approx(compute_epsilon(sigma, 0.2, 3, resumed.config.privacy.delta), rel=1e-12)


def test_a_stateless_pipeline_leaves_the_checkpoint_as_it_was(tmp_path: Path) -> None:
    strategy = DPFedAvg(compose_config(RUN), checkpoint_dir=tmp_path)
    strategy.start(FakeGrid(), ArrayRecord(random_update(SHAPES, 0.1, seed=0)), num_rounds=1)
    assert "mechanisms" not in load_checkpoint(tmp_path).strategy_state
    assert strategy.mechanisms is strategy.mechanisms  # built once


# ----- the privacy event each release makes is the mechanism's ---------------------------------------------------


class HalfStrengthNoise(GaussianNoise):
    """The same noise, but the event it reports is that of half the multiplier (an accountant's conservative view)."""

    def privacy_event(self, release: ReleaseParameters) -> SampledGaussianEvent:
        return SampledGaussianEvent(release.noise_multiplier / 2, release.sample_rate)


class ConservativeFedAvg(FederatedAveraging):
    def server_mechanisms(self) -> tuple[Mechanism, ...]:
        return ()

    @cached_property
    def mechanisms(self) -> tuple[Mechanism, ...]:
        return tuple(HalfStrengthNoise() if type(m) is GaussianNoise else m for m in super().mechanisms)


class NoEventFedAvg(FederatedAveraging):
    @cached_property
    def mechanisms(self) -> tuple[Mechanism, ...]:
        return tuple(m for m in super().mechanisms if not isinstance(m, GaussianNoise))


def test_the_ledger_composes_the_event_its_mechanisms_report() -> None:
    strategy = ClientLevelDP(ConservativeFedAvg(compose_config(RUN)))
    strategy.start(FakeGrid(), ArrayRecord(random_update(SHAPES, 0.1, seed=0)), num_rounds=2)
    sigma, delta = strategy.account.accounted_noise_multiplier, strategy.config.privacy.delta
    assert strategy.epsilon() == pytest.approx(compute_epsilon(sigma / 2, 0.2, 2, delta), rel=1e-12)
    assert strategy.epsilon() > compute_epsilon(sigma, 0.2, 2, delta)


def test_a_private_pipeline_without_a_privacy_event_is_refused_before_any_message() -> None:
    strategy = ClientLevelDP(NoEventFedAvg(compose_config(RUN)))
    grid = FakeGrid()
    with pytest.raises(RuntimeError, match="makes a privacy event"):
        strategy.start(grid, ArrayRecord(random_update(SHAPES, 0.1, seed=0)), num_rounds=1)
    assert grid.sent == []
