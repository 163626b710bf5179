"""Step 5 of the round: screening a reply bound to one of the round's messages (SPEC §2: nothing a client sends is
trusted). A reply is classified as ("ok", :class:`~strategies.rounds.Contribution`) or (rejection kind, reason);
the strategy then admits the contribution (the round's mask, the server's re-clip) and counts the rest."""

from __future__ import annotations

import math

from flwr.app import Message, MetricRecord

from fl_app.instructions import CLIENT_TIMESTAMPS, COHORT_CLIENT_METRICS, CohortReply
from fl_app.privacy import mechanisms as mech
from strategies.rounds import Contribution, RoundPlan

#: Metrics every client reply must carry (clients/numpy_client.py writes them).
REQUIRED_CLIENT_METRICS = ("partition_id", "pre_clip_norm", "train_loss", "train_accuracy")


def screen(plan: RoundPlan, reply: Message, ids: list[int]) -> tuple[str, Contribution | str]:
    """Step 5's screening of a bound reply (for the partitions ``ids`` its message carried): ("ok",
    :class:`Contribution`) or (rejection kind, reason), in the reply format of the plan's messages."""
    if plan.cohort_mode:
        return screen_cohort_reply(plan, reply, ids)
    return screen_reply(plan, reply, ids[0])


def screen_reply(plan: RoundPlan, reply: Message, partition_id: int) -> tuple[str, Contribution | str]:
    """Classify the reply for ``partition_id`` (the partition its message carried, :meth:`RoundPlan.bind`) as
    ("ok", a :class:`Contribution` of one client) or (rejection kind, reason).

    Nothing a client sends is trusted: an error, a missing or malformed field, a partition id other than the
    one its message carried, wrong shapes or dtypes, NaN/Inf anywhere, or a norm that overflows rejects it.
    """
    if reply.has_error():
        return "failed", str(reply.error.reason or "")[:300]
    try:
        update = reply.content["arrays"].to_numpy_ndarrays()
        sent = reply.content["metrics"]
        if not isinstance(sent, MetricRecord):  # a ConfigRecord could smuggle bools, strings or bytes
            raise TypeError("metrics must be a MetricRecord")
        metrics = {k: float(sent[k]) for k in REQUIRED_CLIENT_METRICS}
        metrics.update({k: float(sent[k]) for k in CLIENT_TIMESTAMPS if k in sent})
    except Exception as exc:  # anything a client can send (undecodable arrays, wrong record types) is its fault
        return "malformed", f"missing or non-numeric field ({type(exc).__name__})"
    if metrics["partition_id"] != partition_id:  # NaN, ±Inf, fractions and other partitions all differ
        return "malformed", f"reply claims partition {metrics['partition_id']}, its message carried another"
    if (kind := mech.screen_update(update, plan.shapes)) is not None:
        return kind, f"the update has {kind} values"
    if not (math.isfinite(metrics["pre_clip_norm"]) and metrics["pre_clip_norm"] >= 0):
        return "malformed", f"pre_clip_norm={metrics['pre_clip_norm']}"
    return "ok", Contribution(total=update, clients=[(partition_id, metrics)])


def screen_cohort_reply(plan: RoundPlan, reply: Message, ids: list[int]) -> tuple[str, Contribution | str]:
    """Classify a cohort reply (for the cohort ``ids`` its message carried) as ("ok", :class:`Contribution`) or
    (kind, reason). The worker's accounting must cover exactly the cohort it was sent, each partition once; the
    sum must have the model's shapes and be finite.
    """
    if reply.has_error():
        return "failed", str(reply.error.reason or "")[:300]
    try:
        parsed = CohortReply.from_record(reply.content)
    except Exception as exc:  # anything a client can send (undecodable arrays, wrong record types) is its fault
        return "malformed", f"cohort reply: missing or non-numeric field ({type(exc).__name__})"
    total, accepted_ids, stats, rejected = parsed.total, parsed.accepted, parsed.metrics, parsed.rejected
    worker_reclipped, stamps = parsed.reclipped, parsed.timestamps
    claimed = accepted_ids + [pid for ids_ in rejected.values() for pid in ids_]
    aligned = all(len(v) == len(accepted_ids) for v in stats.values())
    if sorted(claimed) != sorted(float(pid) for pid in ids) or not aligned:
        return "malformed", f"cohort reply does not account for exactly its partitions {ids[:5]}..."
    if not all(math.isfinite(v) for v in stats["pre_clip_norm"]) or min(stats["pre_clip_norm"], default=0.0) < 0:
        return "malformed", "cohort reply has non-finite or negative pre_clip_norm"
    if not (worker_reclipped.is_integer() and 0 <= worker_reclipped <= len(accepted_ids)):
        # NaN and ±Inf fail is_integer(); a count outside [0, k] would corrupt the published clip statistics.
        return "malformed", f"cohort reply claims {worker_reclipped} re-clipped of {len(accepted_ids)} accepted"
    if (kind := mech.screen_update(total, plan.shapes)) is not None:
        return kind, f"cohort {ids[:5]}... sent a sum with {kind} values"
    clients = [
        (int(pid), {**{k: stats[k][i] for k in COHORT_CLIENT_METRICS}, "partition_id": pid, **stamps})
        for i, pid in enumerate(accepted_ids)
    ]
    rejections = {kind: [int(v) for v in value] for kind, value in rejected.items()}
    return "ok", Contribution(total=total, clients=clients, rejections=rejections, reclipped=int(worker_reclipped))
