"""Which SuperNode trains which client (dataset partition).

Two modes (config ``population``):

* ``virtual`` — the M clients are data partitions; a sampled partition is sent to any SuperNode (round-robin over
  the sorted node ids), which loads that partition. This is how simulations of M = 500 clients run on a handful of
  workers. Training results depend only on (seed, round, partition, global model), never on the node.
  In cohort mode a message carries several sampled partitions (strategies/cohorts.py groups them).
  Each node is asked once (a ``binding`` query, fl_app/node_queries.py) whether its ClientApp trains the partition
  a message names; a node that does not confirm it stops the run before the first train message, since its replies
  would not be the sampled clients' data.
* ``nodes`` — every SuperNode is one client and owns the partition named in its node config (``partition-id``,
  ``num-partitions``). The server asks each node once for its partition id (a ``partition`` query) and requires
  exactly the partitions 0..M-1.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from logging import INFO

from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_app.node_queries import BINDING_QUERY, PARTITION_QUERY, confirms_binding, query_message
from strategies.messaging import send_and_receive


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
        else:
            self._check_binding(grid, nodes, timeout)
        log(INFO, "Population: %d clients on %d SuperNodes (%s)", self.num_clients, len(nodes), self.mode)

    def _check_binding(self, grid: Grid, nodes: Sequence[int], timeout: float) -> None:
        """Refuse the run unless every node's ClientApp trains the partition each message names."""
        replies = send_and_receive(grid, [query_message(BINDING_QUERY, node) for node in nodes], timeout)
        answered = {reply.metadata.src_node_id: reply for reply in replies}
        for node in nodes:
            reply = answered.get(node)
            if reply is not None and confirms_binding(reply):
                continue
            answer = "no answer" if reply is None else (f"error: {_last_line(reply.error.reason)}"
                                                         if reply.has_error() else
                                                         f"an answer without {BINDING_QUERY!r}")  # fmt: skip
            raise PopulationError(
                "use this project's ClientApp (apps.client_app:app), wrap a NumPyClient's ClientApp with "
                "clients.numpy_mod.numpy_client_mod, or run with population=nodes (each SuperNode one client): "
                "population=virtual needs a ClientApp that trains the partition each message names (the server "
                f"samples partitions and sends them to any SuperNode), but SuperNode {node} did not confirm it "
                f"({answer}), so its replies would not be the sampled clients' data and epsilon would bound no data "
                "owner"
            )

    def _discover(self, grid: Grid, nodes: Sequence[int], timeout: float) -> dict[int, int]:
        messages = [query_message(PARTITION_QUERY, node) for node in nodes]
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


def _last_line(reason: str) -> str:
    """The last line of an error reason: a ClientApp's failure arrives with its whole (Ray) traceback."""
    lines = [line.strip() for line in reason.strip().splitlines() if line.strip()]
    return lines[-1] if lines else reason
