"""Our strategies are Flower strategies. ``start()`` has Flower's signature and Result semantics,
``evaluate_fn`` is Flower's ``(round, ArrayRecord) -> MetricRecord | None``, and a strategy can be built with
keyword arguments, as Flower's own are, as well as from an AppConfig."""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import Strategy

from fl_app.config import CONF_DIR, compose_config
from fl_app.privacy.accountants import compute_epsilon
from strategies.base import FederatedStrategy
from strategies.dp_fedsam import DPFedSAM
from strategies.registry import strategy_class
from tests.helpers import FakeGrid, build, zeros

SHAPES = [(4, 5), (5,)]


def test_start_has_flowers_signature():
    ours = inspect.signature(FederatedStrategy.start)
    flowers = inspect.signature(Strategy.start)
    assert list(ours.parameters) == list(flowers.parameters)
    for name, parameter in flowers.parameters.items():
        assert ours.parameters[name].default == parameter.default, name


@pytest.mark.parametrize("path", sorted((Path(CONF_DIR) / "strategy").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_strategy_class_knows_its_config(path):
    conf = yaml.safe_load(path.read_text())
    assert "_target_" not in conf  # the name is the key: strategies/registry.py
    assert strategy_class(conf["name"]).config_name == conf["name"] == path.stem


def test_keyword_construction_is_the_config_with_those_values():
    strategy = DPFedSAM(num_clients=40, sample_rate=0.25, clip_norm=0.5, num_rounds=7, server_optimizer="adam",
                        client={"rho": 0.1}, **{"audit.seed": 3})  # fmt: skip
    expected = compose_config(
        ["strategy=dp_fedsam", "server_optimizer=adam", "dataset.num_clients=40", "privacy.sample_rate=0.25",
         "privacy.clip_norm=0.5", "num_rounds=7", "client.rho=0.1", "audit.seed=3"]
    )  # fmt: skip
    assert strategy.config == expected
    with pytest.raises(TypeError, match="ambiguous setting 'momentum'"):
        DPFedSAM(momentum=0.5)
    with pytest.raises(TypeError, match="unknown setting 'clipnorm'"):
        DPFedSAM(clipnorm=0.5)
    with pytest.raises(TypeError, match="either a config or keyword settings"):
        DPFedSAM(expected, clip_norm=0.5)


def test_start_evaluates_flowers_way_and_returns_flowers_result():
    calls: list[tuple[int, int]] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        calls.append((server_round, len(arrays)))
        return None if server_round == 2 else MetricRecord({"test_accuracy": 0.5, "test_loss": 1.0, "other": 7.0})

    strategy = build("strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2", "eval_every=1")
    initial = ArrayRecord(zeros(SHAPES))
    result = strategy.start(FakeGrid(), initial, num_rounds=3, evaluate_fn=evaluate_fn)
    assert calls == [(0, 2), (1, 2), (2, 2), (3, 2)]  # the initial model too, as Flower's start() does
    assert sorted(result.evaluate_metrics_serverapp) == [0, 1, 3]  # None is no result
    assert result.evaluate_metrics_serverapp[3]["other"] == 7.0
    # train_metrics_clientapp: what the clients reported, aggregated; the server's own record is not in it.
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert set(result.train_metrics_clientapp[1]) == {"train_loss", "train_accuracy"}
    assert strategy.rounds_completed == 3
    assert strategy.epsilon() == pytest.approx(compute_epsilon(0.95, 0.2, 3, 1 / 50), rel=1e-12)
    assert not math.isnan(result.evaluate_metrics_serverapp[1]["test_accuracy"])


def test_the_initial_model_is_evaluated_after_the_first_round_is_sent_and_before_its_evaluation():
    seen: list[tuple[int, list[np.ndarray], int]] = []
    grid = FakeGrid()

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        seen.append((server_round, arrays.to_numpy_ndarrays(), len(grid.sent)))
        return MetricRecord({"test_accuracy": 0.5, "test_loss": 1.0})

    strategy = build("strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2", "eval_every=1")
    initial = zeros(SHAPES)
    result = strategy.start(grid, ArrayRecord(initial), num_rounds=2, evaluate_fn=evaluate_fn)
    assert [(r, rounds_sent) for r, _, rounds_sent in seen] == [(0, 1), (1, 1), (2, 2)]  # round 1 went out first
    assert all(np.array_equal(a, b) for a, b in zip(seen[0][1], initial, strict=True))  # the initial model
    assert list(result.evaluate_metrics_serverapp) == [0, 1, 2]


def test_the_initial_model_is_evaluated_when_no_round_may_run():
    calls: list[int] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        calls.append(server_round)
        return MetricRecord({"test_accuracy": 0.5})

    strategy = build(
        "strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2", "privacy.max_epsilon=0.01"
    )
    result = strategy.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=3, evaluate_fn=evaluate_fn)
    assert calls == [0] and strategy.rounds_completed == 0 and strategy.stop_reason is not None
    assert list(result.evaluate_metrics_serverapp) == [0]
