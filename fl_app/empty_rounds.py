"""Rounds in which nobody trained: warned about, and after ``max_empty_rounds`` of them in a row, a failed run.

A round whose sampled clients all fail or are rejected still releases a model — the fixed-denominator average of
nothing plus the round's noise — and the ledger counts it: ε is spent while the model only drifts. One such round can
be a transient (every client of a small cohort timed out once); several in a row mean the clients cannot train at all
(a client that answers in another format, a worker that cannot start, a model the clients do not have). The run then
stops with :class:`NoUpdateAcceptedError`, after the last round's release was logged and accounted, so ``run.json``
says ``failed``, names the cause and states the ε of every model released. A round in which nobody was sampled
(Poisson sampling can draw none; the participation rule can refuse everyone) is not counted: nobody was asked.

What the warning and the error say follows what the run publishes about its clients (docs/PRIVACY.md): the
rejection counts by kind and the first reason of each kind only when raw client statistics are published, else a
pointer to the operator's own record (``operator_counts.jsonl``).
"""

from __future__ import annotations

from logging import WARNING

from flwr.common.logger import log


class NoUpdateAcceptedError(RuntimeError):
    """Clients were sampled in ``max_empty_rounds`` consecutive rounds and no update of theirs was accepted."""


class EmptyRoundWatch:
    """Counts the consecutive rounds in which clients were sampled and none of their updates was accepted."""

    def __init__(self, limit: int, setting: str = "max_empty_rounds") -> None:
        self.limit, self.setting = limit, setting
        self.streak = 0

    def observe(self, server_round: int, sampled: int, accepted: int, causes: dict[str, str] | None) -> None:
        """Round ``server_round``: ``sampled`` clients asked, ``accepted`` updates admitted; ``causes`` says why the
        rest were not ({kind: "count, first reason"}, None where it must not be published). Raises
        :class:`NoUpdateAcceptedError` when this makes ``limit`` empty rounds in a row."""
        if accepted > 0 or sampled == 0:
            self.streak = 0
            return
        self.streak += 1
        why = describe(causes)
        if self.limit and self.streak >= self.limit:
            raise NoUpdateAcceptedError(
                f"no client update was accepted in {self.streak} consecutive rounds (up to round {server_round}; "
                f"{self.setting}={self.limit}): {why}. Every such round released a noise-only model and is accounted "
                "in epsilon"
            )
        log(WARNING, "Round %d: no client update was accepted (%d empty round(s) in a row; the run fails at %s=%d): "
            "%s", server_round, self.streak, self.setting, self.limit, why)  # fmt: skip


def describe(causes: dict[str, str] | None) -> str:
    """The causes of an empty round, as the warning and the error state them."""
    if causes is None:
        return "the counts by kind are in the operator's own record, operator_counts.jsonl (not published)"
    if not causes:
        return "no reply came back before round_timeout"
    return "; ".join(f"{kind}: {cause}" for kind, cause in causes.items())
