"""What happens after a round, as observers of the round loop (strategies/run_loop.py).

An observer gets each completed round's outcome and published record after the round's model was released and
accounted (the release log and the ledger are part of the round itself: they must come before the model can leave
the server). The run calls the observers of a round once the next round's messages are out (after the last round,
at once), so that their work — the checkpoint's write, above all — overlaps the clients' training instead of holding
them up; nothing on the strategy changes in between (planning a round changes nothing on it). The strategy builds
the two it needs from its constructor arguments — :class:`MetricsLog` for ``metrics=``, :class:`Checkpointer` for
``checkpoint_dir=`` — and runs any others a user passes as ``observers=``, in that order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fl_app.checkpoint import Checkpoint, save_checkpoint
from fl_app.config import AppConfig
from fl_app.metrics import CLIENT_COUNTS, MetricsWriter
from strategies.rounds import RoundOutcome
from strategies.statistics import ClientStatistics


class ObservedStrategy(Protocol):
    """What the observers here read of the strategy (a :class:`strategies.base.FederatedStrategy`)."""

    config: AppConfig
    statistics: ClientStatistics

    def state(self) -> tuple[dict[str, Any], dict[str, list[np.ndarray]]]: ...


class RoundObserver(Protocol):
    def round_completed(
        self, strategy: ObservedStrategy, server_round: int, outcome: RoundOutcome, record: dict[str, Any]
    ) -> None:
        """Called once per completed round, in round order, with the record ``metrics.jsonl`` gets."""


class MetricsLog:
    """``metrics.jsonl`` (the published record) and, when client statistics are not published, the operator's own
    record of client counts (``operator_counts.jsonl``)."""

    def __init__(self, writer: MetricsWriter) -> None:
        self.writer = writer

    def round_completed(
        self, strategy: ObservedStrategy, server_round: int, outcome: RoundOutcome, record: dict[str, Any]
    ) -> None:
        self.writer.write(record)
        if not strategy.statistics.publishes_raw:
            counts = {k: outcome.stats[k] for k in CLIENT_COUNTS if k in outcome.stats}
            self.writer.write_operator({"round": server_round, **counts})


class Checkpointer:
    """``checkpoint.npz`` (atomic) after every ``every``-th round and after the last: the released model and what a
    resumed run needs (:meth:`FederatedStrategy.state`)."""

    def __init__(self, directory: Path, every: int, last_round: int) -> None:
        self.directory, self.every, self.last_round = directory, every, last_round

    def round_completed(
        self, strategy: ObservedStrategy, server_round: int, outcome: RoundOutcome, record: dict[str, Any]
    ) -> None:
        if server_round % self.every == 0 or server_round == self.last_round:
            self.save(strategy, server_round, outcome.new_weights)

    def save(self, strategy: ObservedStrategy, server_round: int, weights: list[np.ndarray]) -> None:
        """The checkpoint after ``server_round`` (0: the initial model, so a run killed in round 1 can resume)."""
        state, arrays = strategy.state()
        save_checkpoint(self.directory, Checkpoint(server_round, weights, state, strategy.config.to_raw(), arrays))
