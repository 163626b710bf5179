"""What ClientLevelDP(FedAdam) prints under Flower's own ``Strategy.start``, and what it hands Flower: no line of the
inner strategy's that contradicts the wrapper's own (its "Sampled M nodes" and "Received n results" of training),
no ε in the train MetricRecord that Flower prints as the ClientApp-side metrics (it is in ``privacy_metrics``), and
the first round waiting for the M nodes that Flower's simulation engine registers while the ServerApp starts."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from flwr.serverapp.strategy import FedAdam, Strategy

from fl_app.privacy.accountants import compute_epsilon
from strategies.flower_dp import UNIT_WEIGHT, logs, replies
from tests.strategies.test_flower_dp import DELTA, SIGMA, ClientAppGrid, initial, wrapper


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def flower_lines() -> Iterator[list[str]]:
    """Every message Flower's logger handles (its own console handler shows those at INFO and above)."""
    handler = _Lines()
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


def _fedadam_run(rounds: int = 2) -> tuple[object, object]:
    strategy = wrapper(FedAdam(weighted_by_key=UNIT_WEIGHT, eta=0.3, fraction_evaluate=0.5))
    return strategy, Strategy.start(strategy, ClientAppGrid(nodes=10), initial(), num_rounds=rounds)


def test_no_inner_training_line_contradicts_the_wrappers_own(flower_lines: list[str]) -> None:
    strategy, _ = _fedadam_run()
    sampled = [line for line in flower_lines if "clients sampled" in line]
    assert len(sampled) == 2 and all(" of 10 clients sampled (poisson, q=0.5)" in line for line in sampled)
    assert not [line for line in flower_lines if line.startswith("configure_train: Sampled")]
    assert not [line for line in flower_lines if line.startswith("aggregate_train: Received")]
    assert len([line for line in flower_lines if "replies accepted" in line]) == 2
    # The inner strategy's evaluation is its own: its lines stay.
    assert len([line for line in flower_lines if line.startswith("configure_evaluate: Sampled 5 nodes")]) == 2
    assert len([line for line in flower_lines if line.startswith("aggregate_evaluate: Received")]) == 2
    # The summary states who samples once, before the inner strategy's "Fraction: train (1.00)".
    assert len([line for line in flower_lines if "drawn by ClientLevelDP" in line]) == 1
    assert logging.getLogger("flwr").filters == []  # nothing left behind
    assert strategy.rounds_released == 2


def test_the_dropped_lines_are_the_inner_strategys_training_lines_of_this_thread_only() -> None:
    def record(msg: str, args: tuple, thread: int) -> logging.LogRecord:
        made = logging.LogRecord("flwr", logging.INFO, __file__, 1, msg, args, None)
        made.thread = thread
        return made

    here, elsewhere = threading.get_ident(), threading.get_ident() + 1
    dropped = logs._InnerRoundLines(here)
    assert not dropped.filter(record(logs.INNER_SAMPLED, (10, 10), here))
    assert not dropped.filter(record(logs.INNER_RECEIVED, ("aggregate_train", 3, 0), here))
    assert dropped.filter(record(logs.INNER_RECEIVED, ("aggregate_evaluate", 3, 0), here))
    assert dropped.filter(record(logs.INNER_SAMPLED, (10, 10), elsewhere))
    assert dropped.filter(record("configure_train: %d of %d clients sampled (%s, q=%s)", (3, 10, "poisson", 0.5), here))


def test_epsilon_is_not_in_the_train_metrics_flower_prints_as_the_clients(flower_lines: list[str]) -> None:
    strategy, result = _fedadam_run(rounds=3)
    assert result.train_metrics_clientapp == {}
    assert strategy.aggregate_train(4, []) == (None, None)
    assert not [line for line in flower_lines if "dp-epsilon" in line]
    assert sorted(strategy.privacy_metrics) == [1, 2, 3]
    for t, record in strategy.privacy_metrics.items():
        assert record["dp-epsilon"] == pytest.approx(compute_epsilon(SIGMA, 0.5, t, DELTA), rel=1e-12)
        assert (record["dp-delta"], record["dp-rounds-released"], record["dp-noise-std"]) == (
            DELTA, t, strategy.noise_std,
        )  # fmt: skip
    # The wrapper's own per-round line states the same ε.
    released = [line for line in flower_lines if line.startswith("aggregate_train: released round")]
    assert released[-1].startswith(f"aggregate_train: released round 3, epsilon={strategy.epsilon():.4f}")


class _LateGrid(ClientAppGrid):
    """Nodes 1..9 at first; node 10 connects after ``late`` calls of get_node_ids."""

    def __init__(self, late: int) -> None:
        super().__init__(nodes=10)
        self.calls_left = late

    def get_node_ids(self) -> list[int]:
        self.calls_left -= 1
        return list(self.node_ids) if self.calls_left < 0 else self.node_ids[:9]


def test_the_first_round_waits_for_the_nodes_a_later_round_refuses_a_missing_one(
    monkeypatch: pytest.MonkeyPatch, flower_lines: list[str]
) -> None:
    monkeypatch.setattr(replies, "CONNECT_WAIT_S", 10.0)
    grid = _LateGrid(late=3)
    strategy = wrapper()
    Strategy.start(strategy, grid, initial(), num_rounds=1)
    assert strategy.rounds_released == 1
    assert len([line for line in flower_lines if line.startswith("Waiting for the num_clients=10 nodes")]) == 1
    grid.node_ids = grid.node_ids[:9]  # a node leaves: the next round is refused at once
    with pytest.raises(ValueError, match="9 connected nodes"):
        Strategy.start(strategy, grid, initial(), num_rounds=1)
