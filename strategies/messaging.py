"""Sending a round's messages and collecting their replies, on any Flower grid.

Flower's grids implement ``send_and_receive`` as a push, then a pull every fixed interval until every reply is in or
the timeout has passed: 0.1 s on the simulation engine's in-memory grid, 3 s on the deployment grid that talks to a
SuperLink. A round whose last reply lands between two pulls waits for the next one, on average half an interval:
about 0.05 s of a 1.2 s simulated round on two cores (docs/performance.md), 1.5 s of a deployed one.

:func:`send_and_receive` keeps Flower's contract (the same push and pull of the :class:`~flwr.serverapp.Grid`
interface, the same timeout, the replies in the order they arrived) with an interval that follows the round: a
fixed share of the time the round has taken so far, between :data:`MIN_INTERVAL_S` and :data:`MAX_INTERVAL_S`. The
wait after the last reply is then at most that share of the round (or the floor), while a minute-long round pulls
about 250 times and a longer one at most once a second. Where the engine can tell when a reply is stored (the Hydra
entry point's simulation: apps/delivery.py sets :data:`reply_stored`), the wait ends then and the pull follows the
reply at once; the interval is only the longest wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from flwr.app import Message
from flwr.serverapp import Grid

#: The interval between pulls as a share of the time the round has taken so far.
INTERVAL_SHARE = 0.02
#: Floor and ceiling of the interval (seconds): a pull of the in-memory grid costs tens of microseconds of the
#: driver's CPU, one of the deployment grid a request to the SuperLink.
MIN_INTERVAL_S = 0.005
MAX_INTERVAL_S = 1.0

#: Set by whatever stores a reply where such a hook exists (apps/delivery.py on the simulation engine), so that
#: :func:`send_and_receive` pulls at once instead of at the end of its interval; never set, it changes nothing. A
#: spurious wake (a reply of another run in the same process) costs one pull.
reply_stored = threading.Event()

#: Set by the entry point that runs Flower's simulation engine in this process (apps/main.py) when the engine has
#: ended: no reply can come any more, and :func:`send_and_receive` raises :class:`EngineStoppedError` at its next
#: pull instead of waiting out its timeout. Cleared when a new simulation starts.
engine_stopped = threading.Event()
_engine_stop_reason: list[str] = []


class EngineStoppedError(RuntimeError):
    """Flower's simulation engine ended while the ServerApp still waited for replies."""


def stop_waiting_for_replies(reason: str) -> None:
    """Tell every :func:`send_and_receive` of this process that the engine has ended, with the engine's ``reason``."""
    _engine_stop_reason[:] = [reason]
    engine_stopped.set()
    reply_stored.set()  # wakes a pull that is waiting


def pull_interval(elapsed: float) -> float:
    """Seconds to wait before the next pull, ``elapsed`` seconds after the push."""
    return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, INTERVAL_SHARE * elapsed))


def send_and_receive(
    grid: Grid,
    messages: Iterable[Message],
    timeout: float | None,
    on_arrival: Callable[[list[Message], int], None] | None = None,
    on_pushed: Callable[[], None] | None = None,
) -> list[Message]:
    """Push ``messages`` and pull their replies until all have come back or ``timeout`` seconds have passed
    (``None``: no limit), as :meth:`flwr.serverapp.Grid.send_and_receive` does, pulling at :func:`pull_interval`.
    ``on_arrival(replies, still_pending)`` is called right after each pull that brought replies, with those replies
    and how many messages are still unanswered: the server's work on the first replies runs while the last ones
    are still being computed. ``on_pushed()`` is called once the messages are out, before the first pull (the
    server's own work that need not hold the clients up)."""
    pending = set(grid.push_messages(messages))
    start = time.monotonic()
    if on_pushed is not None:
        on_pushed()
    replies: list[Message] = []
    while pending:
        if engine_stopped.is_set():
            reason = _engine_stop_reason[0] if _engine_stop_reason else "no reason given"
            raise EngineStoppedError(
                f"Flower's simulation engine has ended with {len(pending)} message(s) unanswered: {reason}"
            )
        # Cleared before the pull: a reply stored during or after it sets the signal again, so it never waits.
        reply_stored.clear()
        arrived = list(grid.pull_messages(pending))
        replies.extend(arrived)
        pending.difference_update(reply.metadata.reply_to_message_id for reply in arrived)
        if arrived and on_arrival is not None:
            on_arrival(arrived, len(pending))
        elapsed = time.monotonic() - start
        if not pending or (timeout is not None and elapsed >= timeout):
            break
        wait = pull_interval(elapsed)
        if timeout is not None:
            wait = min(wait, timeout - elapsed)
        reply_stored.wait(wait)
    return replies
