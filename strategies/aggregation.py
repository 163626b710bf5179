"""Steps 5-6 of the round over its replies (strategies/base.py numbers the steps; docs/mechanisms.md, 3–6).

:class:`RoundReplies` takes every reply once, as it arrives: binds it to the message it answers
(:meth:`RoundPlan.bind`), screens it (strategies/screening.py), has the strategy admit what passed (the round's mask,
the server's clip), and counts the rest by kind. What it holds is summed in partition order
(:meth:`RoundReplies.ordered`, the canaries after every real client) so that the same seed gives the same model,
whatever order the replies came in; :meth:`statistics` is the round record's view of the clients. A per-client reply
is a cohort of one, and so is a reply in Flower's convention (a trained model: the screening computes its update):
nothing here knows the difference. A reply of per-partition models (a NumPyClient's cohort) is taken as one such
reply per partition.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from flwr.app import Message

from fl_app.instructions import CLIENT_TIMESTAMPS
from fl_app.privacy import mechanisms as mech
from strategies.client_dp.updates import REJECTION_KINDS
from strategies.rounds import Contribution, RoundPlan
from strategies.screening import screen_each

#: The strategy's step 5 for a screened sum of k client updates and its measured norm (NaN: not measured):
#: (admitted sum, how many it re-clipped).
Admit = Callable[[RoundPlan, list[np.ndarray], int, float], tuple[list[np.ndarray], int]]
#: Where a rejection is reported: (round, kind, reason).
RejectionLog = Callable[[int, str, str], None]


class SecureSumOutcome(Protocol):
    """What a round of secure aggregation hands the round (strategies/secure_sum.py: ``SecureSumResult``)."""

    total: list[np.ndarray] | None
    participants: list[int]


class RoundReplies:
    """What one round's replies contributed: the admitted sums, their clients' statistics, the rejection counts.

    Replies are taken as they arrive (:meth:`take`, any number of times: the run screens the first cohorts' sums
    while the last ones still train); nothing depends on their order.
    """

    def __init__(self, plan: RoundPlan, admit: Admit, reject: RejectionLog) -> None:
        self.plan, self.admit, self.reject = plan, admit, reject
        self.counts = dict.fromkeys(REJECTION_KINDS, 0)
        #: The first reason given for each kind of rejection (what an empty round's warning names).
        self.first_reason: dict[str, str] = {}
        self.received = 0
        self.reclipped = 0
        # (first partition id, an update or a cohort's sum, the number of client updates in it)
        self.contributions: list[tuple[int, list[np.ndarray], int]] = []
        self.clients: list[tuple[int, dict[str, float]]] = []

    def take(self, replies: Iterable[Message]) -> None:
        """Bind, screen and admit each reply to the plan's messages; count and report (``reject``) the others. A reply
        of per-partition models gives one result per partition (strategies/screening.py: :func:`screen_each`), each
        counted as that partition's own reply."""
        plan = self.plan
        for reply in replies:
            ids = plan.bind(reply)
            if ids is None:
                self._unbound("not the first answer to a message of this round from the node it went to")
                continue
            for pids, kind, screened in screen_each(plan, reply, ids):
                if not pids:
                    self._unbound(str(screened))
                    continue
                self.received += len(pids)
                self._take_screened(len(pids), kind, screened)
        self.clients.sort(key=lambda item: item[0])  # partition order, whatever order the replies came in

    def _unbound(self, reason: str) -> None:
        """Count an answer that is no sampled client's (a reply bound to no message, or a per-partition entry for no
        partition of its message): malformed, not "received", not any client's failure."""
        self.counts["malformed"] += 1
        self.first_reason.setdefault("malformed", reason)
        self.reject(self.plan.server_round, "malformed", reason)

    def _take_screened(self, count: int, kind: str, screened: Contribution | str) -> None:
        """Admit a screened contribution (the strategy's mask and clip), or count its ``count`` clients as ``kind``."""
        if not isinstance(screened, Contribution):
            self.counts[kind] += count
            self.first_reason.setdefault(kind, screened)
            self.reject(self.plan.server_round, kind, screened)
            return
        for rejection, pids in screened.rejections.items():
            self.counts[rejection] += len(pids)
        self.reclipped += screened.reclipped
        if not screened.clients:
            return
        total, server_reclipped = self.admit(self.plan, screened.total, len(screened.clients), screened.norm)
        self.reclipped += server_reclipped
        self.contributions.append((screened.clients[0][0], total, len(screened.clients)))
        self.clients.extend(screened.clients)

    def take_sum(self, secure_sum: SecureSumOutcome) -> None:
        """A round of secure aggregation's outcome (distributed DP): one sum of its participants' clipped updates and
        their noise, no client's values, admitted as a cohort of them (the round's mask; nothing is clipped again:
        the sum's sensitivity is its encoding's). The sampled clients outside it did not answer in time."""
        if secure_sum.total is None or not secure_sum.participants:
            return
        clients = sorted(secure_sum.participants)
        self.received += len(clients)
        total, _ = self.admit(self.plan, secure_sum.total, len(clients), math.nan)
        self.contributions.append((clients[0], total, len(clients)))

    def causes(self) -> dict[str, str]:
        """Why the sampled clients' updates were not accepted: {kind: how many, and the first reason given}."""
        causes: dict[str, str] = {}
        unanswered = self.plan.sampled - self.received
        if unanswered > 0:
            causes["unanswered"] = f"{unanswered} client(s) sent no reply before round_timeout"
        for kind, count in self.counts.items():
            if count:
                example = f", e.g. {self.first_reason[kind]}" if kind in self.first_reason else ""
                causes[kind] = f"{count} client(s){example}"
        return causes

    def add_canaries(self, first_id: int, canaries: list[tuple[int, list[np.ndarray]]]) -> None:
        """The audit's admitted canaries, as ids ``first_id + i`` after every real client, adding nothing to the
        count of clients: m stays the real clients'."""
        self.contributions += [(first_id + index, update, 0) for index, update in canaries]

    def ordered(self) -> tuple[list[list[np.ndarray]], int]:
        """The admitted sums in partition order (fixed summation order: same seed, same model) and the number of
        client updates they hold."""
        self.contributions.sort(key=lambda item: item[0])
        return [update for _, update, _ in self.contributions], sum(n for _, _, n in self.contributions)

    @property
    def norms(self) -> list[float]:
        """The aggregated clients' pre-clip norms, in partition order."""
        return [float(m["pre_clip_norm"]) for _, m in self.clients]

    def statistics(self, clip_norm: float) -> dict[str, Any]:
        """The round record's client counts and client-derived values (outside ε; strategies/statistics.py
        decides what is published). For the non-private references they say what clipping at C would have done."""
        clients, norms = self.clients, self.norms
        return {
            "sampled": self.plan.sampled,
            "received": self.received,
            "aggregated": sum(n for _, _, n in self.contributions),
            "failed": self.counts["failed"] + (self.plan.sampled - self.received),
            "rejected_malformed": self.counts["malformed"],
            "rejected_nonfinite": self.counts["nonfinite"],
            "rejected_shape": self.counts["shape"],
            "reclipped": self.reclipped,
            "train_loss": _mean([m["train_loss"] for _, m in clients]),
            "train_accuracy": _mean([m["train_accuracy"] for _, m in clients]),
            **mech.clipping_stats(norms, clip_norm),
            "client_norms": norms,
            **{
                f"first_{key}": min((m[key] for _, m in clients if key in m), default=math.nan)
                for key in CLIENT_TIMESTAMPS
            },
        }


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


@dataclass
class RoundInFlight:
    """A round between Flower's two hooks: its plan, the replies taken so far (bound, screened, admitted), and
    whether replies may be taken as they arrive, before aggregate_train is called (only where the strategy's
    aggregate_train is the skeleton's)."""

    plan: RoundPlan
    taken: RoundReplies
    takes_early: bool = False
