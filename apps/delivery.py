"""Prompt delivery of a round's messages on Flower's simulation engine (the engine's cost per round).

Flower 1.42's simulation engine moves a message from the ServerApp to a ClientApp worker in three hops: the
ServerApp's grid stores it in the in-memory LinkState, an *extractor* thread
(``flwr.server.superlink.fleet.vce.vce_api.add_messages_to_queue``) polls that state and puts what it finds on the
workers' queue, and a worker thread hands it to a Ray actor. The extractor looks at most one message per SuperNode
per pass and sleeps 0.1 s between passes, whether or not a message is waiting. A round's messages therefore wait
0.05 s on average (up to 0.1 s) before any client starts, and a SuperNode with k messages waits k × 0.1 s for the
last of them. Measured with timing probes on the P2 benchmark round (bench/peer.py, 2 cores, DP-FedAvg, cohort
mode): 0.06 s of a 0.93 s round went from the grid's push to the first worker's fit.

:func:`deliver_promptly` puts in Flower's place an extractor that does the same work (the same LinkState calls, the
same queue, the same stop event, one message per SuperNode per pass) but goes round again at once after a pass
that found a message, and otherwise waits on a signal raised when the ServerApp stores one (with Flower's 0.1 s as
the longest wait, so a message stored by any other route is still picked up as before). Nothing else changes: the
messages, their order per SuperNode, the Ray actors and the replies' path are Flower's. The other way, a reply the
engine stores sets :data:`strategies.messaging.reply_stored`, so the ServerApp's pull loop takes it at once rather
than at the end of its interval (~8 ms a round at P2's size). The replacement is made only where this project
launches the engine itself (the Hydra entry point, apps/main.py); ``flwr run`` keeps Flower's own extractor.
Flower's function is checked by signature first: if a later Flower changes it, the original is kept and a warning
says so.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from queue import Queue
from typing import Any, Protocol

from strategies.messaging import reply_stored

__all__ = ["POLL_CEILING_S", "deliver_promptly", "prompt_extractor"]

#: The longest wait between two passes over the LinkState: Flower's own interval.
POLL_CEILING_S = 0.1
#: The parameters of Flower 1.42's ``add_messages_to_queue`` that the replacement takes.
_FLOWER_PARAMETERS = ("state", "queue", "nodes_mapping", "f_stop")


class _MessageStore(Protocol):
    """The part of Flower's LinkState the extractor uses."""

    def store_message_ins(self, message: Any) -> Any: ...

    def get_message_ins(self, node_id: int, limit: int | None) -> list[Any]: ...

    def store_message_res(self, message: Any) -> Any: ...


def _then_set(store: Callable[[Any], Any], signal: threading.Event) -> Callable[[Any], Any]:
    """``store``, then ``signal`` set."""

    def store_and_signal(message: Any) -> Any:
        result = store(message)
        signal.set()
        return result

    return store_and_signal


def prompt_extractor(
    state: _MessageStore, queue: Queue[Any], nodes_mapping: Mapping[int, Any], f_stop: threading.Event
) -> None:
    """Move undelivered messages from ``state`` to ``queue`` until ``f_stop`` is set (see the module docstring)."""
    stored = threading.Event()
    # On the instance only: the grid calls state.store_message_ins, so its pushes now wake this thread; the
    # engine's injector calls state.store_message_res, so a reply wakes the ServerApp's pull loop.
    state.store_message_ins = _then_set(state.store_message_ins, stored)  # type: ignore[method-assign]
    state.store_message_res = _then_set(state.store_message_res, reply_stored)  # type: ignore[method-assign]
    try:
        while not f_stop.is_set():
            # Cleared before the pass: a message stored during or after it sets the signal again, so it is
            # never left waiting for the ceiling.
            stored.clear()
            found = False
            for node_id in nodes_mapping:
                for message in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(message)
                    found = True
            if not found:
                stored.wait(POLL_CEILING_S)
    finally:
        del state.store_message_ins, state.store_message_res  # back to the class's methods


def deliver_promptly() -> bool:
    """Make Flower's simulation engine use :func:`prompt_extractor`; True when it is in place. Idempotent."""
    from flwr.server.superlink.fleet.vce import vce_api

    current: Callable[..., None] = vce_api.add_messages_to_queue
    if current is prompt_extractor:
        return True
    if tuple(inspect.signature(current).parameters) != _FLOWER_PARAMETERS:
        logging.getLogger(__name__).warning(
            "Flower's simulation extractor changed (%s); its own message delivery is kept", inspect.signature(current)
        )
        return False
    # run_api looks the function up by its module-level name when it starts the extractor thread.
    vce_api.add_messages_to_queue = prompt_extractor
    return True
