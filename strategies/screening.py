"""Step 5 of the round: screening a reply bound to one of the round's messages (nothing a client sends is trusted:
docs/PRIVACY.md, 4). A reply is classified as ("ok", :class:`~strategies.rounds.Contribution`) or (rejection kind,
reason); the strategy then admits the contribution (the round's mask, the server's re-clip) and counts the rest.

Two reply formats become the same :class:`Contribution`: ours (:class:`~fl_app.instructions.CohortReply`: a
cohort's float64 sum of updates, each client's statistics and fate), and Flower's Message-API convention
(:class:`~fl_app.instructions.FlowerReply`: one client's trained model and ``num-examples``), which any Flower
ClientApp, a ``NumPyClient`` behind clients.numpy_client's mod included, sends. For the latter the server computes
the update itself, Δ = trained − the round's global model in float64, and admits it as a cohort of one, re-clipped to
C like every reply under server placement. A reply is ours when its metrics name their clients (``cohort_ids``:
:func:`~fl_app.instructions.is_cohort_reply`); any other is read, and screened, as Flower's.

A third format answers a cohort message with one Flower-convention model per partition
(:class:`~fl_app.partition_models.PartitionModelsReply`: a ``NumPyClient`` called once per partition by
clients.numpy_mod's mod). :func:`screen_each` screens each of its partitions as the Flower-convention reply to a
message of that one partition, so each update is computed by the server and re-clipped to C on its own; entries for a
partition the message did not carry, or for one already answered, are rejected together like one reply bound to no
message (however many it lists, they count once), and a partition it carries no result for is counted as failed."""

from __future__ import annotations

import math

from flwr.app import Message, RecordDict

from fl_app.instructions import COHORT_CLIENT_METRICS, CohortReply, FlowerReply, MalformedReply, is_cohort_reply
from fl_app.partition_models import PartitionModelsReply, is_partition_models_reply
from fl_app.privacy import mechanisms as mech
from strategies.client_dp.updates import trained_update
from strategies.rounds import Contribution, RoundPlan

#: One result of screening a reply: the partitions it accounts for, and ("ok", :class:`Contribution`) or (kind,
#: reason). No partitions: an entry that answers none of its message's partitions, counted like a reply bound to no
#: message (malformed, not received, no client's failure).
Screened = tuple[list[int], str, Contribution | str]


def screen_each(plan: RoundPlan, reply: Message, ids: list[int]) -> list[Screened]:
    """The results of a reply bound to the message of partitions ``ids``: one for the whole reply (ours, Flower's
    convention: :func:`screen`), or one per partition of a reply of per-partition models
    (:func:`screen_partition_models`)."""
    if not reply.has_error() and is_partition_models_reply(reply.content):
        return screen_partition_models(plan, reply.content, ids)
    return [(ids, *screen(plan, reply, ids))]


def screen(plan: RoundPlan, reply: Message, ids: list[int]) -> tuple[str, Contribution | str]:
    """Classify a reply (for the partitions ``ids`` its message carried: a cohort, or a cohort of one) as ("ok",
    :class:`Contribution`) or (kind, reason), checking in this order: the reply accounts for exactly the partitions
    it was sent, each once, with statistics aligned to the accepted ones (else malformed); its sum has the model's
    shapes and is finite (else shape / nonfinite); the statistics' values are finite and in range (else malformed).
    Nothing a client sends is trusted: anything else it can send wrong (an error, undecodable arrays, metrics of
    another record type, a missing or non-numeric field) rejects it. A reply in Flower's convention is screened by
    :func:`screen_flower_reply`.
    """
    if reply.has_error():
        return "failed", str(reply.error.reason or "")[:300]
    if not is_cohort_reply(reply.content):
        return screen_flower_reply(plan, reply.content, ids)
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


def screen_flower_reply(plan: RoundPlan, content: RecordDict, ids: list[int]) -> tuple[str, Contribution | str]:
    """Classify a reply in Flower's convention (:class:`~fl_app.instructions.FlowerReply`) as ("ok", a cohort of one
    whose sum is the update the server computed) or (kind, reason), checking in this order: the round lets the server
    compute updates (no client noise to wait for) and the message named exactly one partition (else malformed); the
    records, ``num-examples`` and the statistics' types follow the convention (else malformed); the trained arrays
    have the model's shapes and a floating dtype (else shape); Δ = trained − global, in float64, is finite with a
    finite norm (else nonfinite); a reported ``pre_clip_norm`` is finite and >= 0 (else malformed).

    The client's statistics are what the reply carries of them (train loss and accuracy under Flower's usual keys,
    NaN when absent: the round's means skip them); its pre-clip norm is the one it reports (a client that clips, such
    as clients.numpy_client's, measured it before clipping), else the norm of Δ the server measured (a plain client
    sends its update unclipped). ``num-examples`` is not used: the round's sum is unweighted, over the fixed
    denominator m (a weight chosen by the client would let it scale its own influence past C/m).
    """
    ins = plan.instructions
    if ins.add_noise or ins.recipe.kind == "noisy_model":
        return "malformed", (
            "a Flower-convention reply (trained arrays and num-examples) carries no client noise, and this round's "
            "clients add their share of it (privacy.placement=client or a noisy-model recipe)"
        )
    if len(ids) != 1:
        return "malformed", f"a Flower-convention reply answers for one client, its message carried {len(ids)}"
    try:
        parsed = FlowerReply.from_record(content)
    except MalformedReply as exc:
        return "malformed", str(exc)
    except Exception as exc:  # anything a client can send (undecodable arrays) is its fault
        return "malformed", f"Flower-convention reply: undecodable arrays ({type(exc).__name__})"
    kind, update, norm = trained_update(parsed.trained, plan.global_weights)
    if kind == "shape":
        return kind, f"partition {ids[0]} sent a model with other shapes or a non-floating dtype"
    if kind is not None:
        return kind, f"partition {ids[0]} sent a model whose update has {kind} values"
    stats = {"pre_clip_norm": norm, "train_loss": math.nan, "train_accuracy": math.nan, "num_steps": math.nan}
    stats.update(parsed.metrics)
    if not (math.isfinite(stats["pre_clip_norm"]) and stats["pre_clip_norm"] >= 0):
        return "malformed", "Flower-convention reply has a non-finite or negative pre_clip_norm"
    client = (ids[0], {**stats, "partition_id": float(ids[0])})
    return "ok", Contribution(total=update, clients=[client], norm=norm)


def screen_partition_models(plan: RoundPlan, content: RecordDict, ids: list[int]) -> list[Screened]:
    """Screen a reply of per-partition models (:class:`~fl_app.partition_models.PartitionModelsReply`) to the message
    of partitions ``ids``, one result per partition, in the order it lists them (models, then failures): a model is
    screened as the Flower-convention reply to a message of that one partition (:func:`screen_flower_reply`: refused
    where clients add the noise; else Δ computed here, admitted as a cohort of one and re-clipped to C); a failure is
    "failed" with the client's reason. Entries for a partition ``ids`` does not hold, or for one already answered,
    account for no partition and are rejected together, as one extra reply (module docstring); a partition of
    ``ids`` the reply gives no result for is "failed".
    A reply whose layout is broken is malformed for every partition of ``ids``."""
    try:
        parsed = PartitionModelsReply.from_record(content)
    except MalformedReply as exc:
        return [(ids, "malformed", str(exc))]
    except Exception as exc:  # anything a client can send (records of other types) is its fault
        return [(ids, "malformed", f"per-partition models reply: unreadable ({type(exc).__name__})")]
    pending, results, strays = set(ids), [], []
    entries: list[tuple[int, RecordDict | str]] = [*parsed.answers, *parsed.failures]
    for pid, answer in entries:
        if pid not in pending:
            strays.append(f"partition {pid} {'answered twice' if pid in ids else 'not one its message carried'}")
            continue
        pending.discard(pid)
        if isinstance(answer, str):
            results.append(([pid], "failed", f"partition {pid}: {answer[:300]}"))
        else:
            results.append(([pid], *screen_flower_reply(plan, answer, [pid])))
    if strays:  # one rejection however many: a reply cannot inflate the counts past one extra reply's
        results.append(([], "malformed", f"per-partition models reply: {len(strays)} entries rejected, {strays[:5]}"))
    missing = [pid for pid in ids if pid in pending]
    results += [([pid], "failed", f"per-partition models reply has no result for partition {pid}") for pid in missing]
    return results
