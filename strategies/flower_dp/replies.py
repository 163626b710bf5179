"""What ClientLevelDP does with a round's messages and replies: the round it planned (:class:`PlannedRound`), the
global model it sends (:func:`global_model`), each reply bound to its message, screened and clipped
(:func:`screen_replies`), the replies it forwards to the inner strategy (:func:`forwarded_replies`), and the inner
strategy's mean cast back to the model's dtypes (:func:`released_model`); and the population it samples from
(:func:`population`)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_app.privacy import mechanisms as mech
from strategies.client_dp.updates import REJECTION_KINDS, trained_update
from strategies.flower_dp.checks import UNIT_WEIGHT

#: An accepted reply: the message it answers and its clipped update Δ̃ (float64, in the round's key order).
Accepted = tuple[Message, list[np.ndarray]]


@dataclass(frozen=True)
class PlannedRound:
    """What configure_train sent in a round, for aggregate_train to bind the replies to."""

    server_round: int
    draw: int  # k: the key of the round's seeded streams
    keys: tuple[str, ...]
    global_weights: tuple[np.ndarray, ...]  # float64 copies, in ``keys`` order
    dtypes: tuple[np.dtype, ...]  # the model's dtypes, which the released model keeps
    messages: tuple[Message, ...]  # one per sampled node; the grid sets their ids on push


def global_model(arrays: ArrayRecord) -> tuple[tuple[str, ...], tuple[np.ndarray, ...], tuple[np.dtype, ...]]:
    """The global model's keys, float64 copies and dtypes; ValueError for a tensor the mechanism cannot noise."""
    keys = tuple(arrays.keys())
    if not keys:
        raise ValueError("ClientLevelDP needs a model: the ArrayRecord to train is empty")
    tensors = [np.asarray(arrays[key].numpy()) for key in keys]
    for key, tensor in zip(keys, tensors, strict=True):
        if not np.issubdtype(tensor.dtype, np.floating):
            raise ValueError(
                f"array {key!r} has dtype {tensor.dtype}: every released tensor gets Gaussian noise, so the model "
                "must be floating point (keep integer buffers out of the trained ArrayRecord)"
            )
    return keys, tuple(t.astype(np.float64) for t in tensors), tuple(t.dtype for t in tensors)


#: Seconds the first round waits for the M nodes to connect (Flower's simulation engine registers its nodes while
#: the ServerApp starts; a SuperLink's nodes connect one by one); later rounds refuse a missing node at once.
CONNECT_WAIT_S = 60.0


def population(grid: Grid, num_clients: int, wait: bool = False) -> list[int]:
    """The grid's node ids, sorted; ValueError, before any message, unless they are the M = ``num_clients`` clients.
    With ``wait`` (the first round), fewer nodes are waited for up to :data:`CONNECT_WAIT_S` seconds first."""
    deadline = time.monotonic() + (CONNECT_WAIT_S if wait else 0.0)
    waited = False
    while len(node_ids := sorted({int(node) for node in grid.get_node_ids()})) < num_clients:
        if time.monotonic() >= deadline:
            break
        if not waited:  # one line, not one a poll
            log(INFO, "Waiting for the num_clients=%d nodes to connect (%d connected)", num_clients, len(node_ids))
            waited = True
        time.sleep(0.1)
    if len(node_ids) != num_clients:
        raise ValueError(
            f"ClientLevelDP samples its clients among num_clients={num_clients} nodes (one client each), but the "
            f"grid has {len(node_ids)} connected nodes: sampling over another population breaks the accounted "
            "sampling rate; no message was sent"
        )
    return node_ids


def screen_replies(
    planned: PlannedRound, replies: list[Message], clip_norm: float
) -> tuple[list[Accepted], Counter[str], int]:
    """(accepted (message, clipped update) pairs, rejections by kind, messages answered), in our strategies'
    vocabulary (:data:`~strategies.client_dp.updates.REJECTION_KINDS`): an answer to no message of the round, from
    another node than it went to, or to an already answered one, is malformed, as a reply of the wrong layout is; an
    error reply is failed; the update is screened by :func:`~strategies.client_dp.updates.trained_update`."""
    sent = {m.metadata.message_id: m for m in planned.messages if m.metadata.message_id}
    answered: set[str] = set()
    rejected: Counter[str] = Counter()
    accepted: list[Accepted] = []
    for reply in replies:
        reply_to = reply.metadata.reply_to_message_id
        message = sent.get(reply_to)
        if message is None or reply.metadata.src_node_id != message.metadata.dst_node_id or reply_to in answered:
            rejected["malformed"] += 1  # not the first answer to this round's message from the node it went to
            continue
        answered.add(reply_to)
        if reply.has_error():
            rejected["failed"] += 1
            continue
        kind, update = _clipped_update(reply, planned, clip_norm)
        if kind is not None:
            rejected[kind] += 1
            continue
        accepted.append((message, update))
    return accepted, rejected, len(answered)


def _clipped_update(reply: Message, planned: PlannedRound, clip_norm: float) -> tuple[str | None, list[np.ndarray]]:
    """(None, Δ̃ = clip(trained − global, C) in float64) or (the kind the reply is rejected as, [])."""
    if not reply.has_content():
        return "malformed", []
    records = list(reply.content.array_records.values())
    if len(records) != 1:
        return "malformed", []
    (record,) = records
    if set(record.keys()) != set(planned.keys):
        return "shape", []
    try:
        trained = [np.asarray(record[key].numpy()) for key in planned.keys]
    except Exception:  # undecodable bytes, a non-numpy serialisation: the client's fault, never a crash
        return "malformed", []
    kind, update, _norm = trained_update(trained, planned.global_weights)
    if kind is not None:
        return kind, []
    clipped, _ = mech.clip_update(update, clip_norm)
    return None, clipped


def forwarded_replies(
    arrayrecord_key: str, planned: PlannedRound, accepted: list[Accepted], noise: list[np.ndarray], expected: float
) -> list[Message]:
    """What the inner strategy averages: w + (n/m)·Δ̃_i + Z for each of the n accepted replies (the round's one noise
    draw Z on each), of unit weight, whose unweighted mean is w + (1/m) Σ Δ̃_i + Z over the fixed m = ``expected``;
    with no accepted reply, one synthetic reply w + Z (the noise is released whoever answers)."""
    noisy_global = [w + z for w, z in zip(planned.global_weights, noise, strict=True)]
    scale = len(accepted) / expected  # n/m: the inner mean's 1/n becomes the fixed 1/m
    forwarded = [
        forward(arrayrecord_key, planned.keys, [b + scale * d for b, d in zip(noisy_global, update, strict=True)], sent)
        for sent, update in accepted
    ]
    if not forwarded:  # nobody sampled or accepted: the round still releases w + Z
        forwarded.append(forward(arrayrecord_key, planned.keys, noisy_global, None))
    return forwarded


def forward(arrayrecord_key: str, keys: tuple[str, ...], arrays: list[np.ndarray], sent: Message | None) -> Message:
    """A reply for the inner strategy: the arrays and the unit weight, nothing the client reported."""
    content = RecordDict({
        arrayrecord_key: ArrayRecord({k: Array(a) for k, a in zip(keys, arrays, strict=True)}),
        "metrics": MetricRecord({UNIT_WEIGHT: 1}),
    })  # fmt: skip
    if sent is None:  # the synthetic reply of a round with no accepted reply
        return Message(content, dst_node_id=0, message_type=MessageType.TRAIN)
    return Message(content, reply_to=sent)


def released_model(aggregated: ArrayRecord | None, planned: PlannedRound) -> ArrayRecord:
    """The inner strategy's result in the model's keys, shapes and dtypes (a cast is post-processing)."""
    if aggregated is None or set(aggregated.keys()) != set(planned.keys):
        raise RuntimeError("the inner strategy did not aggregate the forwarded replies into the model's arrays")
    released: dict[str, Array] = {}
    for key, weights, dtype in zip(planned.keys, planned.global_weights, planned.dtypes, strict=True):
        tensor = np.asarray(aggregated[key].numpy())
        if tensor.shape != weights.shape:
            raise RuntimeError(f"the inner strategy returned array {key!r} with shape {tensor.shape}")
        released[key] = Array(np.ascontiguousarray(tensor.astype(dtype)))
    return ArrayRecord(released)


def with_unit_weight(reply: Message) -> Message:
    """An evaluation reply whose MetricRecords carry the unit weight the inner strategy averages by."""
    content = RecordDict()
    for key, record in reply.content.items():
        content[key] = MetricRecord({**record, UNIT_WEIGHT: 1}) if isinstance(record, MetricRecord) else record
    return Message(content=content, metadata=reply.metadata)


def counts(sampled: int, answered: int, replies: int, accepted: int, rejected: Counter[str]) -> dict[str, Any]:
    """``last_round_counts``: the round's reply counts (client-derived: never published)."""
    return {
        "sampled": sampled,
        "replies": replies,
        "accepted": accepted,
        "missing": sampled - answered,
        "rejected": {kind: int(rejected.get(kind, 0)) for kind in REJECTION_KINDS},
    }


def causes(round_counts: dict[str, Any]) -> dict[str, str]:
    """Why a round's sampled clients contributed nothing, from :func:`counts` (fl_app/empty_rounds.py)."""
    found = {kind: f"{n} reply(ies)" for kind, n in round_counts["rejected"].items() if n}
    if round_counts["missing"]:
        found["unanswered"] = f"{round_counts['missing']} client(s) sent no reply before the round's timeout"
    return found
