"""Flower ClientApp: hands each train message to the NumPyClient of :mod:`clients.numpy_client`.

Uses the Message API (train and query handlers), the non-deprecated path in the pinned Flower; the NumPyClient keeps
the familiar ``fit(parameters, config)`` contract for the local logic. A message that names several partitions
(``partition_ids``: cohort mode, issue 12) is trained by :func:`clients.cohort.train_cohort` and answered with the
cohort's sum and per-client statistics. The same app serves ``flwr run`` simulations, the Hydra entry point and
real SuperNodes.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients.cohort import train_cohort
from clients.faults import inject_fault
from clients.numpy_client import DPClient, LocalTrainingDivergedError
from fl_app.instructions import CohortReply, TrainInstructions, resolve_cohort_engine
from fl_app.models import resolve_device
from fl_app.threads import limit_library_threads

app = ClientApp()

#: Error code of a reply whose local training diverged (loss NaN/Inf); the server counts it as failed.
ERROR_DIVERGED = 1001


@app.train()
def train(msg: Message, context: Context) -> Message:
    # torch's threads are the CPUs Ray gave this worker; NumPy's BLAS must not spin on the other cores.
    limit_library_threads(torch.get_num_threads())
    config = msg.content["config"]
    shared_mask = None
    if "mask" in msg.content:
        shared_mask = [m.astype(bool) for m in msg.content["mask"].to_numpy_ndarrays()]
    parameters = msg.content["arrays"].to_numpy_ndarrays()
    if "partition_ids" in config:
        return _train_cohort(msg, parameters, shared_mask)
    client = DPClient(partition_id=int(config["partition_id"]), shared_mask=shared_mask)
    fault = str(config.get("fault", ""))
    if fault == "raise":
        raise RuntimeError(f"fault injection: client {client.partition_id} raises in fit")
    try:
        update, num_examples, metrics = client.fit(parameters, dict(config))
    except LocalTrainingDivergedError as exc:
        return Message(Error(code=ERROR_DIVERGED, reason=str(exc)), reply_to=msg)
    content = RecordDict(
        {
            "arrays": ArrayRecord(inject_fault(fault, update)),
            "metrics": MetricRecord({**metrics, "num_examples": num_examples}),
        }
    )
    return Message(content, reply_to=msg)


def _train_cohort(msg: Message, parameters: list[np.ndarray], shared_mask: list[np.ndarray] | None) -> Message:
    fit_started = time.time()
    config = msg.content["config"]
    ins = TrainInstructions.from_config(config)
    partition_ids = [int(pid) for pid in config["partition_ids"]]
    faults = [str(f) for f in config["faults"]]
    engine = resolve_cohort_engine(ins.cohort_engine, resolve_device(ins.device).type == "cuda")
    result = train_cohort(parameters, ins, partition_ids, faults, engine, shared_mask)
    stamps = {"fit_started_unix": fit_started}
    if result.accepted:
        stamps["train_started_unix"] = result.train_started_unix
    reply = CohortReply(
        total=result.total,
        accepted=result.accepted,  # type: ignore[arg-type]
        metrics=result.metrics,
        rejected=result.rejected,  # type: ignore[arg-type]
        reclipped=result.reclipped,
        num_examples=result.num_examples,
        timestamps=stamps,
    )
    return Message(reply.to_record(), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which partition this node owns (used with ``population=nodes``)."""
    info = ConfigRecord(
        {
            "partition-id": int(context.node_config["partition-id"]),
            "num-partitions": int(context.node_config["num-partitions"]),
        }
    )
    return Message(RecordDict({"partition": info}), reply_to=msg)
