"""strategies/observers.py: what happens after a round — the metrics log, the checkpoint, and a user's observer —
runs after the round's release and accounting, in that order, once per round."""

from __future__ import annotations

from pathlib import Path

import pytest
from flwr.app import ArrayRecord

from fl_app.checkpoint import load_checkpoint
from fl_app.metrics import MetricsWriter, read_metrics
from tests.helpers import FakeGrid, build, zeros

SHAPES = [(4, 5), (5,)]


class Recorder:
    """An observer written in the test: what it saw, and what was on disk when it saw it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.seen: list[tuple[int, float, int, int]] = []

    def round_completed(self, strategy, server_round, outcome, record) -> None:
        on_disk = len(read_metrics(self.directory / "metrics.jsonl"))
        self.seen.append((server_round, record["epsilon"], on_disk, load_checkpoint(self.directory).round))


def test_observers_see_every_round_after_the_metrics_log_and_the_checkpoint(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path)
    metrics = MetricsWriter(tmp_path, 3, progress=False)
    strategy = build("strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2", "checkpoint_every=2",
                     metrics=metrics, checkpoint_dir=tmp_path, observers=[recorder])  # fmt: skip
    strategy.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=3)
    metrics.close()
    assert [r for r, *_ in recorder.seen] == [1, 2, 3]
    assert [on_disk for _, _, on_disk, _ in recorder.seen] == [1, 2, 3]  # the record was written before
    assert [ckpt for *_, ckpt in recorder.seen] == [0, 2, 3]  # every 2nd round and the last
    epsilons = [eps for _, eps, _, _ in recorder.seen]
    assert epsilons == sorted(epsilons) and epsilons[-1] == strategy.epsilon()  # after the round was accounted


def test_a_round_s_observers_run_once_the_next_round_s_messages_are_out(tmp_path: Path) -> None:
    grid = FakeGrid()
    seen: list[tuple[int, int]] = []

    class PushCounter:
        def round_completed(self, strategy, server_round, outcome, record) -> None:
            seen.append((server_round, len(grid.sent)))  # how many rounds' messages had been pushed by then

    strategy = build("strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2",
                     checkpoint_dir=tmp_path, observers=[PushCounter()])  # fmt: skip
    strategy.start(grid, ArrayRecord(zeros(SHAPES)), num_rounds=3)
    # Round r's observers (and its checkpoint) while round r + 1's clients train; the last round's at the end.
    assert seen == [(1, 2), (2, 3), (3, 3)]
    assert load_checkpoint(tmp_path).round == 3


def test_a_failed_round_still_lets_the_completed_one_be_observed(tmp_path: Path) -> None:
    class FailsInRoundTwo(FakeGrid):
        def send_and_receive(self, messages, timeout=None):
            if len(self.sent) == 1:
                raise RuntimeError("the grid went away")
            return super().send_and_receive(messages, timeout)

    strategy = build("strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2",
                     checkpoint_dir=tmp_path)  # fmt: skip
    with pytest.raises(RuntimeError, match="went away"):
        strategy.start(FailsInRoundTwo(), ArrayRecord(zeros(SHAPES)), num_rounds=3)
    assert load_checkpoint(tmp_path).round == 1  # round 1's checkpoint was written although round 2 failed
