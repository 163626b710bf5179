"""The ``query`` messages a server sends to every SuperNode before its first train message, and the answers our
ClientApps give. Each names what the privacy unit needs from the node:

* ``partition`` (``population=nodes``): the partition the node owns (``partition-id``, ``num-partitions`` of its node
  config); the server requires each of the M partitions on exactly one node.
* ``binding`` (``population=virtual``): whether the node's ClientApp trains **the partition each train message
  names**. Under a virtual population a node trains whichever sampled partitions the server assigns it, so a reply
  counts as the named clients' data only if the ClientApp reads that partition. Our ClientApp (apps/client_app.py)
  and a ``NumPyClient`` behind :func:`clients.numpy_mod.numpy_client_mod` (which hands the client the named
  partition in its node config) do. A ClientApp that trains its node's own ``partition-id`` whatever the message
  says does not: one node's data would then stand for every client sent to it (a sensitivity of k·C/m for k
  messages to that node), and ε would bound no data owner. Such an app answers no ``binding`` query (a ClientApp
  without a query handler answers with an error), and the server refuses to start
  (:class:`strategies.population.Population`).

The query's kind travels as ``config["query"]``; a query without one is a ``partition`` query (what servers of
earlier versions of this app send).
"""

from __future__ import annotations

from collections.abc import Mapping

from flwr.app import ConfigRecord, Message, MessageType, RecordDict

PARTITION_QUERY = "partition"
BINDING_QUERY = "binding"
#: The answer's record and key for a ``binding`` query: 1 where the ClientApp trains the partition a message names.
BINDING_RECORD = "binding"
TRAINS_NAMED_PARTITION = "trains-named-partition"


def query_message(kind: str, node_id: int) -> Message:
    """A ``query`` of ``kind`` to ``node_id``."""
    return Message(
        RecordDict({"config": ConfigRecord({"query": kind})}), dst_node_id=node_id, message_type=MessageType.QUERY
    )


def query_kind(msg: Message) -> str:
    config = msg.content.config_records.get("config")
    return str(config.get("query", PARTITION_QUERY)) if config is not None else PARTITION_QUERY


def answer_query(msg: Message, node_config: Mapping[str, object]) -> Message:
    """The answer of a ClientApp that trains the partition each message names (ours): to a ``partition`` query its
    node's own partition (``population=nodes``), to a ``binding`` query that it trains the named partition."""
    kind = query_kind(msg)
    if kind == BINDING_QUERY:
        return Message(RecordDict({BINDING_RECORD: ConfigRecord({TRAINS_NAMED_PARTITION: 1})}), reply_to=msg)
    if kind != PARTITION_QUERY:
        raise ValueError(f"unknown query {kind!r}: this ClientApp answers {PARTITION_QUERY!r} and {BINDING_QUERY!r}")
    partition = {key: int(node_config[key]) for key in ("partition-id", "num-partitions")}  # type: ignore[call-overload]
    return Message(RecordDict({"partition": ConfigRecord(partition)}), reply_to=msg)


def confirms_binding(reply: Message) -> bool:
    """Whether ``reply`` (to a ``binding`` query) says the ClientApp trains the partition each message names."""
    if reply.has_error():
        return False
    record = reply.content.config_records.get(BINDING_RECORD)
    return record is not None and record.get(TRAINS_NAMED_PARTITION) == 1
