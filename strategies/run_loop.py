"""The run: :meth:`strategies.base.FederatedStrategy.start`'s loop over rounds, as Flower's ``Strategy.start`` runs
its hooks, with the steps a private run adds around them (the module docstring of strategies/base.py numbers them).

Per round, in this order: the budget guard (step 1) → the strategy's plan (steps 2-3) → the grid, with the replies
screened and admitted as they arrive (step 5) → the rest of the strategy's aggregation (step 6) → the release,
written ahead to the log, then accounted (step 7) → the published record and evaluation (step 8) → the observers
(metrics log, checkpoint, the user's), which run once the next round's messages are out (after the last round, at
once). Before the first round: the settings the grid decides, the nodes, the release log and the audit; on a resume,
the checkpointed state and every release logged after it. The loop itself holds the run's
:class:`~flwr.serverapp.strategy.Result` and nothing else.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from strategies.aggregation import RoundInFlight
from strategies.messaging import send_and_receive
from strategies.observers import Checkpointer, MetricsLog, RoundObserver
from strategies.rounds import RoundOutcome
from strategies.secure_sum import secure_sum_for

#: Flower's centralized evaluation: (server round, global model) -> metrics or None; the round record takes
#: ``test_loss`` and ``test_accuracy`` (and any other numbers) from it.
EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


class RoundLoop:
    """Flower's ``start()`` for :class:`strategies.base.FederatedStrategy`: :func:`run_rounds` over its hooks, the
    strategy handed to it as an explicit argument."""

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
    ) -> Result:
        """Run the rounds (steps 1-8 of the module docstring) and return Flower's :class:`Result`, as
        :meth:`flwr.serverapp.strategy.Strategy.start` does: ``result.arrays`` the last released model,
        ``train_metrics_clientapp`` the round's published client metrics (mean local train loss/accuracy under
        raw client statistics), ``evaluate_metrics_serverapp`` what ``evaluate_fn`` returned for the initial model
        (round 0, unless resuming; evaluated after the first round's release, so that round does not wait for it) and
        after every ``eval_every``-th round and the last. Evaluation is central:
        ``evaluate_config`` is accepted and unused (clients only train).

        With ``checkpoint_dir`` (constructor) the state after every ``checkpoint_every``-th round (and the last) is
        saved atomically; ``resume_from`` continues after the checkpointed round with its model and ledger;
        ``on_accounted`` is called after the resume's accounting and after every round's, before that round's model
        can leave the server (the ServerApp keeps run.json true with it).
        """
        return run_rounds(self, grid, initial_arrays, num_rounds, timeout, train_config, evaluate_fn)


def run_rounds(
    strategy: RoundLoop,
    grid: Grid,
    initial_arrays: ArrayRecord,
    num_rounds: int,
    timeout: float,
    train_config: ConfigRecord | None,
    evaluate_fn: EvaluateFn | None,
) -> Result:
    """Run ``strategy``'s rounds on ``grid`` (Flower's ``Strategy.start`` contract: see its docstring). Each round
    is ``strategy.configure_train`` → the grid → ``strategy.aggregate_train``, as under Flower's own loop, so a
    subclass's overrides of the hooks run; the loop adds resume, the record, evaluation and the observers."""
    observers = _observers(strategy, num_rounds)
    strategy.prepare_run(grid, initial_arrays, timeout)  # settings, nodes, audit: once
    train_config = ConfigRecord() if train_config is None else train_config
    result = Result()
    arrays, first_round = _starting_point(strategy, initial_arrays, observers, result)
    # Flower's start() evaluates the initial model too; here after the first round's release (before that round's
    # own evaluation), so that the workers' start-up and first round do not wait for it: the same model and test
    # set, so the same result.
    initial_pending = evaluate_fn is not None and strategy.resume_from is None
    # A round's observers run once the next round's messages are out (after the last round: at once), while its
    # clients train: the checkpoint's write and the metrics line are off the path from one round's replies to the
    # next round's start, and the checkpoint still follows the release within milliseconds (a crash in between
    # re-runs the round: with CSPRNG noise a new release). Nothing they read changes in between: planning a round
    # changes nothing on the strategy.
    completed = _CompletedRounds(strategy, observers)
    try:
        for server_round in range(first_round, num_rounds + 1):
            t0 = time.perf_counter()
            released = _train_round(strategy, server_round, arrays, train_config, grid, timeout, completed)
            if released is None:  # the budget guard (step 1) stopped the run before this round
                break
            arrays = result.arrays = released.arrays
            if initial_pending:
                _evaluate_initial(evaluate_fn, initial_arrays, result)
                initial_pending = False
            record = _evaluated_record(strategy, server_round, num_rounds, released.outcome, evaluate_fn, result)
            record["wall_time_s"] = time.perf_counter() - t0
            # Where the round's time went: sending + client training + receiving, then the server's aggregation.
            record["clients_phase_s"] = released.replies_at - t0
            record["aggregate_s"] = released.aggregated_at - released.replies_at
            record["finished_unix"] = time.time()
            strategy.rounds_completed += 1
            completed.add(server_round, released.outcome, record)
    finally:
        completed.flush()
    if initial_pending:  # no round ran (the budget guard stopped the first)
        _evaluate_initial(evaluate_fn, initial_arrays, result)
    if strategy.auditor is not None:  # scored once more if the run stopped early, saved, its deltas dropped
        strategy.auditor.finish(strategy.checkpoint_dir, strategy.account)
    return result


def _starting_point(
    strategy: RoundLoop, initial_arrays: ArrayRecord, observers: list[RoundObserver], result: Result
) -> tuple[ArrayRecord, int]:
    """The model and the round the run starts from: the checkpoint's on a resume (its state and owed releases were
    accounted when the strategy was built), else the initial model, checkpointed as round 0. run.json is told."""
    arrays, first_round = initial_arrays, 1
    if strategy.resume_from is not None:
        arrays = result.arrays = ArrayRecord(strategy.resume_from.weights)
        first_round = strategy.resume_from.round + 1
    else:
        for observer in observers:
            if isinstance(observer, Checkpointer):
                observer.save(strategy, 0, initial_arrays.to_numpy_ndarrays())
    if strategy.on_accounted is not None:
        strategy.on_accounted(strategy)
    return arrays, first_round


@dataclass(frozen=True)
class _ReleasedRound:
    """A round's released model, its outcome, and when its replies were in and its aggregation done."""

    arrays: ArrayRecord
    outcome: RoundOutcome
    replies_at: float
    aggregated_at: float


def _train_round(
    strategy: RoundLoop,
    server_round: int,
    arrays: ArrayRecord,
    train_config: ConfigRecord,
    grid: Grid,
    timeout: float,
    completed: _CompletedRounds,
) -> _ReleasedRound | None:
    """Steps 1-7 of one round through Flower's hooks: configure_train, the grid (replies taken as they arrive where
    the round in flight allows it; the previous round's observers run once this round's messages are out),
    aggregate_train. None when the budget guard stopped the run before the round."""
    messages = list(strategy.configure_train(server_round, arrays, train_config, grid))
    if strategy.stop_reason is not None:
        return None
    secure_sum = None if strategy.account is None else secure_sum_for(strategy.placement, strategy.randomness)
    if secure_sum is not None and strategy.in_flight is not None:
        # Distributed DP: the clients' updates leave them only masked; the round's sum is what is taken.
        strategy.in_flight.taken.take_sum(secure_sum.run(grid, strategy.in_flight.plan, timeout, completed.flush))
        replies = []
    else:
        early = _EarlyReplies(strategy, strategy.in_flight)
        replies = send_and_receive(grid, messages, timeout, on_arrival=early.arrived, on_pushed=completed.flush)
        replies = replies[early.count :]
    replies_at = time.perf_counter()
    released, _ = strategy.aggregate_train(server_round, replies)
    outcome = strategy.last_outcome
    if released is None or outcome is None:
        raise RuntimeError(f"aggregate_train({server_round}) released no model")
    return _ReleasedRound(released, outcome, replies_at, time.perf_counter())


def _evaluated_record(
    strategy: RoundLoop,
    server_round: int,
    num_rounds: int,
    outcome: RoundOutcome,
    evaluate_fn: EvaluateFn | None,
    result: Result,
) -> dict[str, Any]:
    """Step 8: the round's published record with the audit's and the evaluation's results when due; ``result``'s
    metrics (Flower's ``evaluate_metrics_serverapp`` and ``train_metrics_clientapp``) for the round."""
    record = _round_record(strategy, server_round, outcome)
    if strategy.auditor is not None and strategy.auditor.due(server_round, num_rounds):
        record.update(strategy.auditor.evaluate(server_round, strategy.account))
    evaluated = None
    if evaluate_fn is not None and (server_round % strategy.config.eval_every == 0 or server_round == num_rounds):
        evaluated = evaluate_fn(server_round, result.arrays)
    if evaluated is not None:
        result.evaluate_metrics_serverapp[server_round] = evaluated
        record.update({k: v for k, v in evaluated.items() if k not in record})
    record.setdefault("test_loss", math.nan)
    record.setdefault("test_accuracy", math.nan)
    # Flower's train_metrics_clientapp: the clients' aggregated metrics, as far as they are published.
    client_metrics = {k: record[k] for k in ("train_loss", "train_accuracy") if k in record}
    if client_metrics:
        result.train_metrics_clientapp[server_round] = MetricRecord(client_metrics)
    return record


class _CompletedRounds:
    """Completed rounds whose observers have yet to run (the last one, until :meth:`flush`)."""

    def __init__(self, strategy: RoundLoop, observers: list[RoundObserver]) -> None:
        self.strategy, self.observers = strategy, observers
        self.pending: list[tuple[int, RoundOutcome, dict[str, Any]]] = []

    def add(self, server_round: int, outcome: RoundOutcome, record: dict[str, Any]) -> None:
        self.pending.append((server_round, outcome, record))

    def flush(self) -> None:
        """Run the observers of every pending round, in round order."""
        pending, self.pending = self.pending, []
        for server_round, outcome, record in pending:
            for observer in self.observers:
                observer.round_completed(self.strategy, server_round, outcome, record)


class _EarlyReplies:
    """The server's work before a round's last reply is in, on the core the first cohorts to finish left idle: at
    the first reply the noise starts drawing on a thread (fl_app/privacy/prefetch.py), and (``take``) every reply
    that arrives while others are outstanding is screened and admitted then, where the round allows it
    (:attr:`RoundInFlight.takes_early`: only when the skeleton's own aggregate_train takes the replies; a subclass's
    override must see every reply). (``send_and_receive`` returns the replies in the order they arrived, so the rest
    are the ones after the first ``count``.)"""

    def __init__(self, strategy: RoundLoop, in_flight: RoundInFlight | None) -> None:
        self.strategy, self.in_flight, self.count = strategy, in_flight, 0
        self.take = in_flight is not None and in_flight.takes_early

    def arrived(self, replies: list[Message], still_pending: int) -> None:
        if self.in_flight is None:
            return
        self.strategy.aggregator.draw_noise_ahead(self.in_flight.plan)
        if still_pending and self.take:
            self.in_flight.taken.take(replies)
            self.count += len(replies)


def _evaluate_initial(evaluate_fn: EvaluateFn | None, initial_arrays: ArrayRecord, result: Result) -> None:
    """Round 0 of ``result.evaluate_metrics_serverapp``: ``evaluate_fn`` on the initial model."""
    assert evaluate_fn is not None
    initial = evaluate_fn(0, initial_arrays)
    if initial is not None:
        result.evaluate_metrics_serverapp[0] = initial


def _observers(strategy: RoundLoop, num_rounds: int) -> list[RoundObserver]:
    """The metrics log (``metrics=``), the checkpointer (``checkpoint_dir=``), then the user's ``observers=``."""
    observers: list[RoundObserver] = []
    if strategy.metrics is not None:
        observers.append(MetricsLog(strategy.metrics))
    if strategy.checkpoint_dir is not None and strategy.config.checkpoint_every:
        observers.append(Checkpointer(strategy.checkpoint_dir, strategy.config.checkpoint_every, num_rounds))
    return observers + list(strategy.observers)


def _round_record(strategy: RoundLoop, server_round: int, outcome: RoundOutcome) -> dict[str, Any]:
    """Step 8's record before evaluation: the statistics as published, the strategy's extras, the guarantee so far."""
    accounted = strategy.account is not None
    published = outcome.published
    record: dict[str, Any] = {"round": server_round, **published, **strategy.round_extras()}
    record["epsilon"] = strategy.epsilon() if accounted else None
    record["delta"] = strategy.config.privacy.delta if accounted else None
    record["noise_multiplier"] = strategy.noise_multiplier if accounted else None
    return record
