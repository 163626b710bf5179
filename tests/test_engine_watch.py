"""apps/engine_watch.py against Flower's real engine function: its crash report stops the rounds' waiting, a
client's failure does not."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from logging import ERROR

import pytest
from flwr.common.logger import log
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.fleet.vce.metrics import VceMetrics

from apps.engine_watch import watching_the_engine
from strategies import messaging


@pytest.fixture(autouse=True)
def _engine_running() -> Iterator[None]:
    messaging.engine_stopped.clear()
    yield
    messaging.engine_stopped.clear()


def _crash_flowers_engine() -> None:
    """Flower's own ``run_api`` with a backend that cannot start, as when Ray gives the actor pool nothing."""

    def no_actors() -> vce_api.Backend:
        raise ValueError("The ActorPool is empty. The system (CPUs=2, GPUs=0) does not meet the criteria")

    with pytest.raises(RuntimeError, match="Simulation Runtime crashed"):
        vce_api.run_api(
            lambda: None,  # type: ignore[arg-type,return-value]
            no_actors,
            {},
            None,  # type: ignore[arg-type]  # not reached: the backend fails first
            {},
            threading.Event(),
            VceMetrics(),
        )


def test_the_engines_crash_report_stops_the_waiting_with_its_error() -> None:
    with watching_the_engine() as handler:
        _crash_flowers_engine()
    assert messaging.engine_stopped.is_set()
    assert handler.reason is not None and "ActorPool is empty" in handler.reason

    class SilentGrid:
        def push_messages(self, messages: object) -> list[str]:
            return ["m1"]

        def pull_messages(self, ids: object) -> list[object]:
            return []

    with pytest.raises(messaging.EngineStoppedError, match="ActorPool is empty"):
        messaging.send_and_receive(SilentGrid(), [], timeout=3600)  # type: ignore[arg-type]


def test_a_clients_error_and_a_crash_outside_the_watch_leave_the_rounds_waiting() -> None:
    with watching_the_engine():
        log(ERROR, "ClientApp raised an exception")  # from this test's function, as a worker logs a client's error
    assert not messaging.engine_stopped.is_set()
    _crash_flowers_engine()  # no watch any more: its handler is gone from Flower's logger
    assert not messaging.engine_stopped.is_set()
