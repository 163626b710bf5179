"""Step 5 of the round: screening a reply bound to one of the round's messages (SPEC §2: nothing a client sends is
trusted). A reply is classified as ("ok", :class:`~strategies.rounds.Contribution`) or (rejection kind, reason);
the strategy then admits the contribution (the round's mask, the server's re-clip) and counts the rest."""

from __future__ import annotations

import math

from flwr.app import Message

from fl_app.instructions import COHORT_CLIENT_METRICS, CohortReply
from fl_app.privacy import mechanisms as mech
from strategies.rounds import Contribution, RoundPlan


def screen(plan: RoundPlan, reply: Message, ids: list[int]) -> tuple[str, Contribution | str]:
    """Classify a reply (for the partitions ``ids`` its message carried: a cohort, or a cohort of one) as ("ok",
    :class:`Contribution`) or (kind, reason), checking in this order: the reply accounts for exactly the partitions
    it was sent, each once, with statistics aligned to the accepted ones (else malformed); its sum has the model's
    shapes and is finite (else shape / nonfinite); the statistics' values are finite and in range (else malformed).
    Nothing a client sends is trusted: anything else it can send wrong (an error, undecodable arrays, metrics of
    another record type, a missing or non-numeric field) rejects it.
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
    kind, norm = mech.measure_update(total, plan.shapes)
    if kind is not None:
        return kind, f"cohort {ids[:5]}... sent a sum with {kind} values"
    if not all(math.isfinite(v) for v in stats["pre_clip_norm"]) or min(stats["pre_clip_norm"], default=0.0) < 0:
        return "malformed", "cohort reply has non-finite or negative pre_clip_norm"
    if not (worker_reclipped.is_integer() and 0 <= worker_reclipped <= len(accepted_ids)):
        # NaN and ±Inf fail is_integer(); a count outside [0, k] would corrupt the published clip statistics.
        return "malformed", f"cohort reply claims {worker_reclipped} re-clipped of {len(accepted_ids)} accepted"
    clients = [
        (int(pid), {**{k: stats[k][i] for k in COHORT_CLIENT_METRICS}, "partition_id": pid, **stamps})
        for i, pid in enumerate(accepted_ids)
    ]
    rejections = {kind: [int(v) for v in value] for kind, value in rejected.items()}
    return "ok", Contribution(
        total=total, clients=clients, rejections=rejections, reclipped=int(worker_reclipped), norm=norm
    )
