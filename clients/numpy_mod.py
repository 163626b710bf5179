"""The mod that lets a Flower ``NumPyClient`` (any legacy ``Client`` behind ``ClientApp(client_fn=...)``) answer
Message-API messages: ours, and those of Flower's own message-API strategies (``flwr.serverapp.strategy.FedAvg``
and its family, wrapped or not in ``strategies.flower_dp.ClientLevelDP``).

Flower 1.42's legacy handler (``flwr.client.message_handler.message_handler.handle_legacy_message_from_msgtype``)
reads a train message as ``FitIns`` from the records ``fitins.parameters`` and ``fitins.config`` and an evaluate
message as ``EvaluateIns`` from ``evaluateins.parameters`` and ``evaluateins.config`` (configs of scalars only), and
answers with ``fitres.*`` / ``evaluateres.*`` records (``flwr.compat.common.recorddict_compat``). Message-API
strategies send the model as one ArrayRecord (``arrays``: FedAvg's ``arrayrecord_key``) with a ConfigRecord
(``config``) and read back, for a train reply, the trained model as one ArrayRecord with the keys they sent and one
MetricRecord with ``num-examples``; for an evaluate reply, one MetricRecord with ``num-examples`` and the metrics
(``FedAvg.aggregate_evaluate``: the ``weighted_by_key`` mean of every key). :func:`numpy_client_mod` translates, in
both directions, around Flower's own legacy handler and nothing else:

* **in**: the message's model record becomes ``fitins.parameters`` / ``evaluateins.parameters`` (the same record,
  whose values Flower's handler passes on in order) and its config the legacy config: its scalar entries; for our
  strategies' messages also the partition's fault as ``fault`` and the round's shared mask (Fed-SMP's) as
  ``mask`` bytes (:func:`pack_mask`). The partition the message names (``partition_ids``; each in turn for a
  cohort: below) becomes ``partition-id`` in the node config the ``client_fn`` reads, with ``num-partitions`` = M,
  so that under ``population=virtual`` the node trains the partition the server sampled; a message of Flower's
  strategies names none, and the node's own node config stands.
* **out, train**: the ``FitRes`` becomes Flower's Message-API reply (:class:`fl_app.instructions.FlowerReply`): the
  trained model under the key the model came under, **with the message's array keys in their order** (a
  ``NumPyClient`` returns a list: ``ArrayRecord(model.state_dict())`` comes back keyed ``0.weight``, ..., as
  sent, not ``0``, ``1``, ...; a list of another length keeps the numbered keys, and the server rejects it as
  ``shape``), ``num-examples`` and the numeric metrics under ``metrics``. Our server screens it as any Flower
  ClientApp's (strategies/screening.py: it computes Δ = trained − global itself and, under server placement,
  re-clips it to C); ClientLevelDP does the same with Flower's strategies.
* **out, evaluate**: the ``EvaluateRes`` becomes one MetricRecord ``metrics`` holding the numeric metrics,
  ``loss`` (the name Flower's own compat records give ``EvaluateRes.loss``) and ``num-examples``.
* a ``query`` (``population=nodes`` asks each node for its partition) is answered as our ClientApp answers it.

A fit or evaluate whose status is not OK (a NumPyClient without ``evaluate``: ``EVALUATE_NOT_IMPLEMENTED``) raises,
so the reply is an error the strategy counts as a failure. Legacy messages (``fitins.*``, ``evaluateins.*``) pass
through unchanged.

**A cohort, one call per partition.** A NumPyClient's reply is one client's trained model, which the server must
screen and clip as that one client's update. A train message of several partitions (a cohort:
``simulation.cohort_size`` other than 1, the default ``auto`` in simulation) is answered by calling the client once
per partition it names, each call as for a message of that one partition (its ``partition-id`` in the node config, its
own fault, the round's mask), and replying with every partition's Flower-convention model apart
(:class:`~fl_app.partition_models.PartitionModelsReply`: ``arrays.p`` and ``metrics.p`` for each partition ``p``), a
client that raises or answers an error being that partition's failure, with why. The server screens each partition's
model as the reply to a message of that partition alone (Δ computed by the server and, under server placement,
re-clipped to C: each partition is clipped on its own; refused, each, under client placement), never a sum: our
cohort reply (:class:`~fl_app.instructions.CohortReply`) carries the clients' sum, which the server can only hold to
k·C, trusting the worker to have clipped each client (docs/PRIVACY.md), and would move a NumPyClient's clip from the
server to the worker. An evaluate message names no partition (our strategies send none); one naming several raises.

The strategy's messages are not made readable by both instead: the model would travel twice per message, and the
legacy reply (``fitres.*``) would be one more format for the server to screen.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Code, parameters_to_ndarrays
from flwr.compat.common.recorddict_compat import recorddict_to_evaluateres, recorddict_to_fitres

from fl_app.instructions import FLOWER_WEIGHT_KEY
from fl_app.node_queries import answer_query
from fl_app.partition_models import PartitionModelsReply

#: What a FitIns / EvaluateIns config can hold (Flower's ``Scalar``).
_SCALARS = (bool, bytes, float, int, str)
#: The legacy records' prefixes by message type.
_LEGACY = {MessageType.TRAIN: "fitins", MessageType.EVALUATE: "evaluateins"}
#: Where an evaluate reply's loss goes (``flwr.compat.common.recorddict_compat.evaluateres_to_recorddict``'s name).
LOSS_KEY = "loss"

LegacyConfig = dict[str, bool | bytes | float | int | str]


def pack_mask(mask: Sequence[np.ndarray]) -> bytes:
    """The round's shared mask as one bytes value of a ``FitIns`` config (uint8 arrays in an ``.npz``)."""
    buffer = io.BytesIO()
    np.savez(buffer, *[np.asarray(m, dtype=np.uint8) for m in mask])
    return buffer.getvalue()


def unpack_mask(data: bytes) -> list[np.ndarray]:
    """:func:`pack_mask`'s arrays as the boolean mask our ClientApp reads from its message."""
    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        return [arrays[f"arr_{i}"].astype(bool) for i in range(len(arrays.files))]


def model_record_key(content: RecordDict) -> str | None:
    """The key of the message's model: ``arrays`` (ours, and FedAvg's default ``arrayrecord_key``), else the one
    ArrayRecord it holds; None when neither (not a Message-API train or evaluate message)."""
    if isinstance(content.get("arrays"), ArrayRecord):
        return "arrays"
    keys = list(content.array_records.keys())
    return keys[0] if len(keys) == 1 else None


def _message_config(content: RecordDict) -> ConfigRecord:
    """The message's config: ``config`` (ours, and FedAvg's default ``configrecord_key``), else its one
    ConfigRecord, else none."""
    if isinstance(content.get("config"), ConfigRecord):
        return content["config"]  # type: ignore[return-value]
    records = list(content.config_records.values())
    return records[0] if len(records) == 1 else ConfigRecord()


def message_partitions(content: RecordDict) -> list[int]:
    """The partitions a message names (``partition_ids``: our strategies' messages); none for Flower's."""
    config = _message_config(content)
    return [int(pid) for pid in config["partition_ids"]] if "partition_ids" in config else []  # type: ignore[union-attr]


def legacy_config(content: RecordDict, node_config: dict[str, Any], position: int = 0) -> LegacyConfig:
    """The legacy config of a Message-API message (module docstring) for the partition at ``position`` of those it
    names: sets ``partition-id`` and ``num-partitions`` in ``node_config`` when it names any."""
    config = _message_config(content)
    legacy: LegacyConfig = {k: v for k, v in config.items() if isinstance(v, _SCALARS)}
    partitions = message_partitions(content)
    if partitions:  # our strategies' messages name the partitions they carry
        node_config.update({"partition-id": partitions[position], "num-partitions": int(config["data.num_clients"])})  # type: ignore[arg-type]
    if "faults" in config:
        legacy["fault"] = str(config["faults"][position])  # type: ignore[index]
    if isinstance(content.get("mask"), ArrayRecord):
        legacy["mask"] = pack_mask(content["mask"].to_numpy_ndarrays())  # type: ignore[union-attr]
    return legacy


def keyed(arrays: list[np.ndarray], keys: list[str]) -> ArrayRecord:
    """``arrays`` under ``keys`` in order (the message's keys); a list of another length keeps Flower's numbered
    keys (the server screens it as a model of other shapes)."""
    if len(arrays) != len(keys):
        return ArrayRecord(arrays)
    return ArrayRecord({key: Array(np.asarray(a)) for key, a in zip(keys, arrays, strict=True)})


def _numeric(metrics: dict[str, Any]) -> dict[str, float | int]:
    """The numbers of a legacy metrics dict (a MetricRecord holds no bools, strings or bytes)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def train_reply(answer: RecordDict, model_key: str, keys: list[str]) -> RecordDict:
    """The ``FitRes`` records as Flower's Message-API train reply (module docstring)."""
    fit_res = recorddict_to_fitres(answer, keep_input=True)
    if fit_res.status.code != Code.OK:
        raise RuntimeError(f"fit failed: {fit_res.status.message}")
    trained = keyed(parameters_to_ndarrays(fit_res.parameters), keys)
    metrics = {**_numeric(fit_res.metrics), FLOWER_WEIGHT_KEY: int(fit_res.num_examples)}
    return RecordDict({model_key: trained, "metrics": MetricRecord(metrics)})


def evaluate_reply(answer: RecordDict) -> RecordDict:
    """The ``EvaluateRes`` records as Flower's Message-API evaluate reply: one MetricRecord (module docstring)."""
    res = recorddict_to_evaluateres(answer)
    if res.status.code != Code.OK:
        raise RuntimeError(f"evaluate failed: {res.status.message}")
    metrics = {**_numeric(res.metrics), LOSS_KEY: float(res.loss), FLOWER_WEIGHT_KEY: int(res.num_examples)}
    return RecordDict({"metrics": MetricRecord(metrics)})


def _call_client(msg: Message, context: Context, call_next: ClientAppCallable, position: int) -> Message:
    """The client's answer (Flower's legacy handler's) for the message's partition at ``position``: the message as
    ``fitins.*`` / ``evaluateins.*`` records, the node config naming that partition, the node's own state."""
    prefix = _LEGACY[msg.metadata.message_type]
    node_config = dict(context.node_config)
    legacy = Message(
        RecordDict({
            f"{prefix}.parameters": msg.content[model_record_key(msg.content)],  # type: ignore[index]
            f"{prefix}.config": ConfigRecord(legacy_config(msg.content, node_config, position)),
        }),
        metadata=msg.metadata,
    )  # fmt: skip
    client_context = Context(
        run_id=context.run_id,
        node_id=context.node_id,
        node_config=node_config,
        state=context.state,  # the node's own state, kept across rounds and partitions
        run_config=context.run_config,
        series_id=context.series_id,
    )
    return call_next(legacy, client_context)


def partition_models(msg: Message, context: Context, call_next: ClientAppCallable) -> RecordDict:
    """A cohort train message's answer: the client called once per partition it names, every partition's trained
    model apart (:class:`~fl_app.partition_models.PartitionModelsReply`; module docstring)."""
    keys = list(msg.content[model_record_key(msg.content)].keys())  # type: ignore[index,union-attr]
    answers: list[tuple[int, RecordDict]] = []
    failures: list[tuple[int, str]] = []
    for position, pid in enumerate(message_partitions(msg.content)):
        try:
            answer = _call_client(msg, context, call_next, position)
            if answer.has_error():
                raise RuntimeError(answer.error.reason)
            answers.append((pid, train_reply(answer.content, "arrays", keys)))
        except Exception as exc:  # one client's failure is its partition's, not the cohort's
            failures.append((pid, f"{type(exc).__name__}: {exc}"))
    return PartitionModelsReply(answers=answers, failures=failures).to_record()


def numpy_client_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Let a ``ClientApp(client_fn=...)`` (a NumPyClient, or any legacy ``Client``) answer Message-API train and
    evaluate messages in Flower's convention, a cohort train message with one model per partition (the module
    docstring says how and why); answer ``query`` messages as our ClientApp does. Legacy messages (``fitins.*``,
    ``evaluateins.*``) and other message types pass through."""
    message_type = msg.metadata.message_type
    if message_type == MessageType.QUERY:
        # As our ClientApp answers (fl_app/node_queries.py): this mod hands the client the partition a message names.
        return answer_query(msg, context.node_config)
    prefix = _LEGACY.get(message_type)
    model_key = model_record_key(msg.content) if prefix is not None else None
    if prefix is None or model_key is None or f"{prefix}.parameters" in msg.content:
        return call_next(msg, context)
    if len(message_partitions(msg.content)) > 1:
        if message_type != MessageType.TRAIN:
            raise ValueError("an evaluate message names one partition at most (a NumPyClient evaluates one)")
        return Message(partition_models(msg, context, call_next), reply_to=msg)
    answer = _call_client(msg, context, call_next, 0)
    if answer.has_error():
        return Message(answer.error, reply_to=msg)
    if message_type == MessageType.TRAIN:
        content = train_reply(answer.content, model_key, list(msg.content[model_key].keys()))  # type: ignore[union-attr]
    else:
        content = evaluate_reply(answer.content)
    return Message(content, reply_to=msg)
