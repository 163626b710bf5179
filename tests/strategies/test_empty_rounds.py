"""Rounds in which nobody trained (fl_app/empty_rounds.py): a warning with the causes, and after
``max_empty_rounds`` of them in a row a failed run whose every noise-only release is accounted."""

from __future__ import annotations

import logging

import pytest
from flwr.app import ArrayRecord, Error, Message

from fl_app.empty_rounds import EmptyRoundWatch, NoUpdateAcceptedError
from fl_app.privacy.accountants import compute_epsilon
from tests.helpers import FakeGrid, build, zeros

SHAPES = [(4, 5), (5,)]
POP = ("strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2")


class ErrorsUntil(FakeGrid):
    """Every client fails (Flower error replies) in the first ``bad_rounds`` rounds, then answers zero updates."""

    def __init__(self, bad_rounds: int) -> None:
        super().__init__()
        self.bad_rounds = bad_rounds

    def send_and_receive(self, messages, timeout=None):
        replies = super().send_and_receive(messages, timeout)
        if len(self.sent) <= self.bad_rounds:
            return [Message(Error(code=0, reason="KeyError: 'fitins.parameters'"), reply_to=m) for m in messages]
        return replies


def test_a_run_in_which_nobody_trains_fails_after_max_empty_rounds_with_every_release_accounted(caplog) -> None:
    strategy = build(*POP)
    with caplog.at_level(logging.WARNING), pytest.raises(NoUpdateAcceptedError) as failure:
        strategy.start(ErrorsUntil(bad_rounds=10), ArrayRecord(zeros(SHAPES)), num_rounds=10)
    message = str(failure.value)
    assert "no client update was accepted in 3 consecutive rounds (up to round 3; max_empty_rounds=3)" in message
    assert "failed:" in message and "KeyError: 'fitins.parameters'" in message  # the cause, as the client said it
    assert "Round 1: no client update was accepted (1 empty round(s) in a row" in caplog.text
    # The three noise-only models were released: each is accounted.
    assert strategy.ledger.rounds == 3
    assert strategy.epsilon() == pytest.approx(compute_epsilon(0.95, 0.2, 3, 1 / 50), rel=1e-9)


def test_a_transient_empty_round_is_only_warned_about() -> None:
    strategy = build(*POP)
    grid = ErrorsUntil(bad_rounds=2)
    strategy.start(grid, ArrayRecord(zeros(SHAPES)), num_rounds=5)
    assert strategy.rounds_completed == 5 and strategy.empty_rounds.streak == 0


def test_max_empty_rounds_zero_never_stops_the_run() -> None:
    strategy = build(*POP, "max_empty_rounds=0")
    strategy.start(ErrorsUntil(bad_rounds=10), ArrayRecord(zeros(SHAPES)), num_rounds=5)
    assert strategy.rounds_completed == 5 and strategy.empty_rounds.streak == 5


def test_without_raw_statistics_the_causes_stay_in_the_operators_record(caplog) -> None:
    strategy = build(*POP, "privacy.client_statistics=none", "max_empty_rounds=2")
    with caplog.at_level(logging.WARNING), pytest.raises(NoUpdateAcceptedError) as failure:
        strategy.start(ErrorsUntil(bad_rounds=10), ArrayRecord(zeros(SHAPES)), num_rounds=5)
    assert "operator_counts.jsonl" in str(failure.value) and "KeyError" not in str(failure.value)
    assert "KeyError" not in caplog.text and "client(s)" not in caplog.text  # no count, no reason in the logs


def test_a_round_with_nobody_sampled_is_not_empty() -> None:
    watch = EmptyRoundWatch(2)
    for server_round in range(1, 5):
        watch.observe(server_round, sampled=0, accepted=0, causes={})
    assert watch.streak == 0
    watch.observe(5, sampled=3, accepted=0, causes={"unanswered": "3 client(s) sent no reply before round_timeout"})
    with pytest.raises(NoUpdateAcceptedError, match="unanswered: 3 client"):
        watch.observe(6, sampled=3, accepted=0, causes={"unanswered": "3 client(s) sent no reply before round_timeout"})


def test_the_hooks_log_a_line_per_round_where_no_metrics_writer_does(caplog) -> None:
    """Any loop over Flower's hooks (here start() without ``metrics=``) gets one line per released round: ε, and the
    client counts where they are published."""
    strategy = build(*POP)
    with caplog.at_level(logging.INFO):
        strategy.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=2)
    eps = compute_epsilon(0.95, 0.2, 2, 1 / 50)
    assert f"Round 2 released: epsilon={eps:.4g} (delta=0.02); " in caplog.text
    assert "sampled clients accepted, 0 failed, 0 rejected" in caplog.text
    quiet = build(*POP, "privacy.client_statistics=none")
    caplog.clear()
    with caplog.at_level(logging.INFO):
        quiet.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=1)
    assert "Round 1 released: epsilon=" in caplog.text and "accepted" not in caplog.text
