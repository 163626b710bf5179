"""Which SuperNode trains which client (dataset partition).

Two modes (config ``population``):

* ``virtual`` — the M clients are data partitions; a sampled partition is sent to any SuperNode (round-robin over
  the sorted node ids), which loads that partition. This is how simulations of M = 500 clients run on a handful of
  workers. Training results depend only on (seed, round, partition, global model), never on the node.
  In cohort mode a message carries several sampled partitions (strategies/cohorts.py groups them).
* ``nodes`` — every SuperNode is one client and owns the partition named in its node config (``partition-id``,
  ``num-partitions``). The server asks each node once for its partition id (a ``query`` message) and requires
  exactly the partitions 0..M-1.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from logging import INFO

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from strategies.messaging import send_and_receive

PARTITION_QUERY = "partition"


class PopulationError(RuntimeError):
    """The federation does not match the configured population."""


class Population:
    """Maps partition ids (the clients of the DP analysis) to destination node ids."""

    def __init__(self, mode: str, num_clients: int) -> None:
        self.mode = mode
        self.num_clients = num_clients
        self._nodes: list[int] = []
        self._node_of_partition: dict[int, int] = {}

    def connect(self, grid: Grid, timeout: float) -> None:
        """Wait for the nodes and, in ``nodes`` mode, learn each node's partition."""
        needed = self.num_clients if self.mode == "nodes" else 1
        deadline = time.monotonic() + timeout
        while True:
            nodes = sorted(grid.get_node_ids())
            if len(nodes) >= needed or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        if len(nodes) < needed:
            raise PopulationError(
                f"population={self.mode} needs {needed} connected SuperNode(s), found {len(nodes)} after {timeout:.0f}s"
            )
        self._nodes = nodes
        if self.mode == "nodes":
            self._node_of_partition = self._discover(grid, nodes, timeout)
        log(INFO, "Population: %d clients on %d SuperNodes (%s)", self.num_clients, len(nodes), self.mode)

    def _discover(self, grid: Grid, nodes: Sequence[int], timeout: float) -> dict[int, int]:
        messages = [
            Message(
                RecordDict({"config": ConfigRecord({"query": PARTITION_QUERY})}),
                dst_node_id=node,
                message_type=MessageType.QUERY,
            )
            for node in nodes
        ]
        mapping: dict[int, int] = {}
        for reply in send_and_receive(grid, messages, timeout):
            if reply.has_error():
                raise PopulationError(f"node {reply.metadata.src_node_id} failed the partition query: {reply.error}")
            info = reply.content["partition"]
            pid, total = int(info["partition-id"]), int(info["num-partitions"])
            if total != self.num_clients:
                raise PopulationError(
                    f"node {reply.metadata.src_node_id} has num-partitions={total}, "
                    f"but dataset.num_clients={self.num_clients}"
                )
            if pid in mapping:
                raise PopulationError(f"two nodes claim partition-id={pid}")
            mapping[pid] = reply.metadata.src_node_id
        missing = sorted(set(range(self.num_clients)) - set(mapping))
        if missing:
            raise PopulationError(f"no node holds partition(s) {missing[:10]}{'...' if len(missing) > 10 else ''}")
        return mapping

    def available_clients(self, grid: Grid) -> list[int]:
        """The clients that can train now: in ``nodes`` mode those whose SuperNode is connected (a device that
        checked in), else every partition (any node trains any of them)."""
        if self.mode != "nodes":
            return list(range(self.num_clients))
        connected = set(grid.get_node_ids())
        return sorted(pid for pid, node in self._node_of_partition.items() if node in connected)

    @property
    def num_nodes(self) -> int:
        """SuperNodes found by :meth:`connect` (in simulation: the workers that train concurrently)."""
        return len(self._nodes)

    def node_for(self, partition_id: int, position: int) -> int:
        """Destination node of a sampled partition (``position`` = its index among this round's sample)."""
        if self.mode == "nodes":
            return self._node_of_partition[partition_id]
        return self._nodes[position % len(self._nodes)]
