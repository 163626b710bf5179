"""Flower ClientApp: hands each train message to the NumPyClient of :mod:`clients.numpy_client`.

Uses the Message API (train and query handlers), the non-deprecated path in the pinned Flower; the NumPyClient keeps
the familiar ``fit(parameters, config)`` contract for the local logic. The same app serves ``flwr run`` simulations,
the Hydra entry point and real SuperNodes.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients.numpy_client import DPClient, LocalTrainingDivergedError

app = ClientApp()

#: Error code of a reply whose local training diverged (loss NaN/Inf); the server counts it as failed.
ERROR_DIVERGED = 1001


def inject_fault(fault: str, update: list[np.ndarray]) -> list[np.ndarray]:
    """Chaos testing (config ``fault_injection``): corrupt what this client sends, as a broken client would."""
    if fault == "nan":
        update = [u.copy() for u in update]
        update[0].flat[0] = np.nan
    elif fault == "wrong_shape":
        update = [*update, np.zeros(3, dtype=np.float32)]
    elif fault == "huge_norm":
        update = [u * np.float32(1e6) for u in update]
    return update


@app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    shared_mask = None
    if "mask" in msg.content:
        shared_mask = [m.astype(bool) for m in msg.content["mask"].to_numpy_ndarrays()]
    client = DPClient(partition_id=int(config["partition_id"]), shared_mask=shared_mask)
    parameters = msg.content["arrays"].to_numpy_ndarrays()
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
