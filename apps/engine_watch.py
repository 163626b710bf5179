"""Notice, from inside the ServerApp, that Flower's simulation engine has crashed, on every front door.

Flower runs the ServerApp in a thread beside its simulation engine, in one process, under ``flwr run`` as under the
Hydra entry point. When the engine cannot go on (an actor pool Ray cannot fill, a ClientApp that cannot be loaded)
it logs the error from its ``run_api`` / ``start_vce`` and ends, while the ServerApp's thread keeps waiting for
replies: ``round_timeout`` every round, releasing noise-only models. Under ``flwr run`` the process then exits five
seconds later (Flower's forced exit) and run.json would keep saying ``starting``. :func:`watching_the_engine` hands
that error to :func:`strategies.messaging.stop_waiting_for_replies`, so that the round raises
:class:`~strategies.messaging.EngineStoppedError` at once and the run is recorded as failed with the engine's error.

The engine reports through Flower's logger, not through anything the ServerApp can hold, so the watch reads those
records: ERROR records logged by Flower's engine module itself (``vce_api``) from those two functions. A client's
own failure is logged from ``worker`` and is a failed reply, not a crash: it is left alone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path

from flwr.common.logger import FLOWER_LOGGER

from strategies.messaging import stop_waiting_for_replies

#: The engine's functions whose ERROR records mean the engine itself has ended.
ENGINE_CRASH_FUNCTIONS = frozenset({"run_api", "start_vce"})
#: Where the engine module lives, found without importing it (a deployed ServerApp never loads the engine).
_ENGINE_MODULE = Path(str(importlib.util.find_spec("flwr.server.superlink.fleet.vce.vce_api").origin)).resolve()


class EngineCrashHandler(logging.Handler):
    """A handler on Flower's logger that stops the rounds' waiting on the engine's first crash report."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.reason: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.reason is not None or record.funcName not in ENGINE_CRASH_FUNCTIONS:
            return
        if Path(record.pathname).resolve() != _ENGINE_MODULE:
            return
        self.reason = f"Flower's simulation engine: {record.getMessage()}"
        stop_waiting_for_replies(self.reason)


@contextlib.contextmanager
def watching_the_engine() -> Iterator[EngineCrashHandler]:
    """While the block runs, an engine crash reported on Flower's logger ends the rounds' waiting."""
    handler = EngineCrashHandler()
    FLOWER_LOGGER.addHandler(handler)
    try:
        yield handler
    finally:
        FLOWER_LOGGER.removeHandler(handler)
