"""Flower ``NumPyClient`` under our strategies: a mod that lets any NumPyClient answer our train messages, and
:class:`InstructedNumPyClient`, our client (the server's instructions, SAM/ASAM/SGD, the client's mechanisms) as one.

**Why a mod.** Flower 1.42 keeps ``NumPyClient`` in ``flwr.compat.client.numpy_client`` (exported as
``flwr.client.NumPyClient``). A ``ClientApp(client_fn=...)`` hands every message to Flower's legacy handler
(``flwr.client.message_handler.message_handler.handle_legacy_message_from_msgtype``), which reads a train message as
``FitIns`` from the records ``fitins.parameters`` and ``fitins.config`` (``recorddict_to_fitins``; a config of scalars
only) and answers with ``fitres.parameters``, ``fitres.num_examples``, ``fitres.metrics`` and ``fitres.status``
(``fitres_to_recorddict``). Message-API strategies, ours and Flower's own (``flwr.serverapp.strategy.FedAvg``), send
``arrays`` and ``config`` and read back ``arrays`` and a MetricRecord with ``num-examples``: a bare
``ClientApp(client_fn=...)`` fails every train message with a KeyError, and our config holds lists (the message's
``partition_ids`` and ``faults``) that ``FitIns`` cannot. Flower's way to wrap a ClientApp is a mod, so
:func:`numpy_client_mod` translates, in both directions, around Flower's own legacy handler and nothing else:

* a train message's ``arrays`` become ``fitins.parameters`` (the same record) and its ``config`` ``fitins.config``
  (its scalar entries; the one partition's fault as ``fault``, the round's shared mask, Fed-SMP's, as ``mask``
  bytes); the message's partition (a NumPyClient trains one client: ``simulation.cohort_size=1``) becomes
  ``partition-id`` in the node config the ``client_fn`` reads, with ``num-partitions`` = M, so that under
  ``population=virtual`` the node trains the partition the server sampled, as our ClientApp does;
* the ``FitRes`` becomes Flower's Message-API reply (:class:`fl_app.instructions.FlowerReply`: the trained model
  under ``arrays``, ``num-examples`` and the numeric metrics under ``metrics``), which the server screens like any
  Flower ClientApp's (strategies/screening.py: it computes Δ = trained − global itself and, under server placement,
  re-clips it to C);
* a ``query`` (``population=nodes`` asks each node for its partition) is answered as our ClientApp answers it.

The strategy's messages are not made readable by both instead: the model would travel twice per message, and the
legacy reply (``fitres.*``) would be one more format for the server to screen.

**Use.** ``app = ClientApp(client_fn=client_fn, mods=[numpy_client_mod])`` with any ``client_fn(context)`` that
returns ``SomeNumPyClient(...).to_client()`` for ``context.node_config["partition-id"]``, and
``simulation.cohort_size=1`` (one partition a message). This module's :data:`app` is that line with
:func:`client_fn`, our client; ``clientapp = "clients.numpy_client:app"`` in ``[tool.flwr.app.components]`` would
serve it under ``flwr run`` (the tests run it in process, not under Flower's engine).

**Our client as a NumPyClient.** :class:`InstructedNumPyClient.fit` reads the round's
:class:`~fl_app.instructions.TrainInstructions` from its config and trains its partition as a cohort of one through
:func:`clients.cohort.train_cohort`, the function our ClientApp calls: the same local SAM/ASAM/SGD, clip, client noise
(client placement), masks, fault injection and worker re-clip, no step written twice. It returns the trained model
global + update in the model's dtype (float32), as any NumPyClient does, so the server's Δ = trained − global is our
ClientApp's update up to that one rounding: each coordinate within half a float32 ulp of the trained weight
(tests/clients/test_numpy_client.py checks the trained model bit for bit against our ClientApp's update). A client
the cohort path rejects (diverged, non-finite, failed) raises: ``fit`` has no other way to say so, and the server
counts it as failed. Under client placement the update carries the client's noise exactly as our ClientApp's does,
but the server refuses every Flower-convention reply there: nothing in the convention says that noise was added
(run client placement with apps.client_app, whose reply format the server trusts to carry it).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client import Client, ClientApp, NumPyClient
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Code, parameters_to_ndarrays
from flwr.compat.common.recorddict_compat import recorddict_to_fitres

from clients.cohort import train_cohort
from fl_app.allocator import freeze_imported_objects, keep_freed_memory
from fl_app.instructions import FlowerReply, TrainInstructions, resolve_cohort_engine
from fl_app.models import build_model_for_dataset, get_weights, resolve_device
from fl_app.threads import limit_library_threads

#: What a FitIns config can hold (Flower's ``Scalar``).
_SCALARS = (bool, bytes, float, int, str)


def pack_mask(mask: Sequence[np.ndarray]) -> bytes:
    """The round's shared mask as one bytes value of a ``FitIns`` config (uint8 arrays in an ``.npz``)."""
    buffer = io.BytesIO()
    np.savez(buffer, *[np.asarray(m, dtype=np.uint8) for m in mask])
    return buffer.getvalue()


def unpack_mask(data: bytes) -> list[np.ndarray]:
    """:func:`pack_mask`'s arrays as the boolean mask our ClientApp reads from its message."""
    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        return [arrays[f"arr_{i}"].astype(bool) for i in range(len(arrays.files))]


def numpy_client_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Let a ``ClientApp(client_fn=...)`` (a NumPyClient, or any legacy ``Client``) answer Message-API train messages
    in Flower's convention (the module docstring says how and why); answer ``query`` messages as our ClientApp does.
    Legacy messages (``fitins.*``) and other message types pass through unchanged."""
    if msg.metadata.message_type == MessageType.QUERY:
        # The node's partition, as apps.client_app.query answers it (an app, a layer above clients/: not imported).
        partition = {key: int(context.node_config[key]) for key in ("partition-id", "num-partitions")}
        return Message(RecordDict({"partition": ConfigRecord(partition)}), reply_to=msg)
    if msg.metadata.message_type != MessageType.TRAIN or "arrays" not in msg.content:
        return call_next(msg, context)
    config = msg.content["config"]
    fit_config: dict[str, bool | bytes | float | int | str] = {
        k: v for k, v in config.items() if isinstance(v, _SCALARS)
    }
    node_config = dict(context.node_config)
    if "partition_ids" in config:  # our strategies' messages name the partitions they carry
        partitions = [int(pid) for pid in config["partition_ids"]]
        if len(partitions) != 1:
            raise ValueError(
                f"a NumPyClient trains one client, this message carries {len(partitions)}: set simulation.cohort_size=1"
            )
        node_config.update({"partition-id": partitions[0], "num-partitions": int(config["data.num_clients"])})
        fit_config["fault"] = str(config["faults"][0])
    if "mask" in msg.content:
        fit_config["mask"] = pack_mask(msg.content["mask"].to_numpy_ndarrays())
    legacy = Message(
        RecordDict({"fitins.parameters": msg.content["arrays"], "fitins.config": ConfigRecord(fit_config)}),
        metadata=msg.metadata,
    )
    client_context = Context(
        run_id=context.run_id,
        node_id=context.node_id,
        node_config=node_config,
        state=context.state,  # the node's own state, kept across rounds
        run_config=context.run_config,
        series_id=context.series_id,
    )
    answer = call_next(legacy, client_context)
    if answer.has_error():
        return Message(answer.error, reply_to=msg)
    fit_res = recorddict_to_fitres(answer.content, keep_input=True)
    if fit_res.status.code != Code.OK:
        raise RuntimeError(f"fit failed: {fit_res.status.message}")
    metrics = {k: v for k, v in fit_res.metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    reply = FlowerReply(
        trained=parameters_to_ndarrays(fit_res.parameters),
        num_examples=int(fit_res.num_examples),
        metrics=metrics,  # type: ignore[arg-type]
    )
    return Message(reply.to_record(), reply_to=msg)


class ClientRejectedError(RuntimeError):
    """The cohort path left the client out of its sum (its ``kind``: failed, nonfinite or shape)."""


class InstructedNumPyClient(NumPyClient):
    """Our client of partition ``partition_id`` as a Flower NumPyClient: it trains as the round's
    :class:`~fl_app.instructions.TrainInstructions` (its ``fit`` config) say, through the cohort path (module
    docstring)."""

    def __init__(self, partition_id: int) -> None:
        self.partition_id = int(partition_id)
        #: The model its last fit trained (global + its privatised update); empty before the first.
        self.trained: list[np.ndarray] = []

    def get_parameters(self, config: dict[str, bool | bytes | float | int | str]) -> list[np.ndarray]:
        """The model its last fit trained; before any, the initial model the instructions in ``config`` name
        (``model``, ``data.dataset``, ``seed``: built as the ServerApp builds it), else none."""
        if self.trained or "model" not in config or "data.dataset" not in config:
            return list(self.trained)
        seed = int(config.get("seed", 0))
        return get_weights(build_model_for_dataset(str(config["model"]), str(config["data.dataset"]), seed=seed))

    def fit(
        self, parameters: list[np.ndarray], config: dict[str, bool | bytes | float | int | str]
    ) -> tuple[list[np.ndarray], int, dict[str, bool | bytes | float | int | str]]:
        """Train the partition from the global ``parameters`` as a cohort of one of :func:`train_cohort` (what our
        ClientApp's handler calls for the message's partitions) and return global + the privatised update in the
        model's dtype, the number of examples, and the client's statistics (``pre_clip_norm``, ``train_loss``,
        ``train_accuracy``, ``num_steps``)."""
        # The per-process setup of our ClientApp's handler (apps/client_app.py says why).
        limit_library_threads(torch.get_num_threads())
        keep_freed_memory()
        freeze_imported_objects()
        ins = TrainInstructions.from_config(config)
        shared_mask = unpack_mask(config["mask"]) if "mask" in config else None  # type: ignore[arg-type]
        engine = resolve_cohort_engine(ins.cohort_engine, resolve_device(ins.device).type == "cuda")
        fault = str(config.get("fault", ""))
        result = train_cohort(list(parameters), ins, [self.partition_id], [fault], engine, shared_mask)
        if not result.accepted:
            kind = next((kind for kind, ids in result.rejected.items() if ids), "failed")
            raise ClientRejectedError(f"partition {self.partition_id}: {kind}")
        # One rounding, global + update to the model's dtype: what a NumPyClient sends is a model.
        self.trained = [
            (np.asarray(p, dtype=np.float64) + total).astype(np.asarray(p).dtype)
            for p, total in zip(parameters, result.total, strict=True)
        ]
        metrics: dict[str, bool | bytes | float | int | str] = {k: float(v[0]) for k, v in result.metrics.items()}
        return list(self.trained), int(result.num_examples), metrics


def client_fn(context: Context) -> Client:
    """Flower's ``client_fn``: our client of the partition in the node config (``partition-id``, set per message by
    :func:`numpy_client_mod` under ``population=virtual``, the node's own under ``population=nodes``)."""
    return InstructedNumPyClient(int(context.node_config["partition-id"])).to_client()


#: Our client as a NumPyClient behind Flower's ``ClientApp(client_fn=...)``.
app = ClientApp(client_fn=client_fn, mods=[numpy_client_mod])
