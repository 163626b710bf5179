"""Flower ClientApp: hands each train message to the NumPyClient of :mod:`clients.numpy_client`.

Uses the Message API (``@app.train()``/``@app.query()``), the non-deprecated path in the pinned Flower; the
NumPyClient keeps the familiar ``fit(parameters, config)`` contract for the local logic. The same app serves
``flwr run`` simulations, the Hydra entry point and real SuperNodes.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients.numpy_client import DPClient, LocalTrainingDivergedError

app = ClientApp()

#: Error code of a reply whose local training diverged (loss NaN/Inf); the server counts it as failed.
ERROR_DIVERGED = 1001


@app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    shared_mask = None
    if "mask" in msg.content:
        shared_mask = [m.astype(bool) for m in msg.content["mask"].to_numpy_ndarrays()]
    client = DPClient(partition_id=int(config["partition_id"]), shared_mask=shared_mask)
    parameters = msg.content["arrays"].to_numpy_ndarrays()
    try:
        update, num_examples, metrics = client.fit(parameters, dict(config))
    except LocalTrainingDivergedError as exc:
        return Message(Error(code=ERROR_DIVERGED, reason=str(exc)), reply_to=msg)
    content = RecordDict(
        {"arrays": ArrayRecord(update), "metrics": MetricRecord({**metrics, "num_examples": num_examples})}
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
