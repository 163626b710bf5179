"""strategies/messaging.py: Flower's send-and-receive contract with a pull interval that follows the round."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from strategies import messaging
from strategies.messaging import MAX_INTERVAL_S, MIN_INTERVAL_S, pull_interval, send_and_receive


class Clock:
    """Virtual time for the loop's ``time.monotonic`` and its wait on :data:`messaging.reply_stored` (no engine
    signals a reply here, so every wait lasts its interval): the tests are exact and instant."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def clear(self) -> None:
        pass

    def wait(self, seconds: float) -> bool:
        assert seconds >= 0
        self.now += seconds
        return False


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(messaging, "time", clock)
    monkeypatch.setattr(messaging, "reply_stored", clock)
    return clock


class TimedGrid(Grid):
    """A grid whose node answers message i ``delays[i]`` seconds after the push; counts the pulls."""

    def __init__(self, clock: Clock, delays: list[float]) -> None:
        self.time = clock
        self.delays = delays
        self.pulls = 0
        self._due: dict[str, tuple[float, Message]] = {}

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        now, ids = self.time.monotonic(), []
        for i, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"m{i}"
            self._due[f"m{i}"] = (now + self.delays[i], Message(RecordDict(), reply_to=message))
            ids.append(f"m{i}")
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulls += 1
        now = self.time.monotonic()
        ready = sorted((due, mid) for mid in message_ids if (due := self._due[mid][0]) <= now)
        return [self._due.pop(mid)[1] for _, mid in ready]

    def send_and_receive(self, messages, *, timeout=None):  # pragma: no cover - Flower's loop, not used here
        raise AssertionError("strategies.messaging must push and pull itself")

    # The rest of Flower's Grid interface, unused here.
    run = property(lambda self: None)  # type: ignore[assignment]

    def set_run(self, run_id: int) -> None:  # pragma: no cover
        pass

    def create_message(self, *args, **kwargs):  # pragma: no cover
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return [1]


def _messages(k: int) -> list[Message]:
    return [
        Message(RecordDict({"config": ConfigRecord({"i": i})}), dst_node_id=1, message_type="train") for i in range(k)
    ]


def test_the_interval_is_a_share_of_the_round_between_its_floor_and_ceiling() -> None:
    assert pull_interval(0.0) == MIN_INTERVAL_S
    assert pull_interval(1.0) == pytest.approx(0.02)
    assert pull_interval(10_000.0) == MAX_INTERVAL_S


def test_every_reply_comes_back_in_arrival_order_soon_after_the_last(clock: Clock) -> None:
    grid = TimedGrid(clock, [1.20, 0.40, 0.80])
    replies = send_and_receive(grid, _messages(3), timeout=600.0)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m1", "m2", "m0"]
    # The last reply is collected within the share of the round (Flower's in-memory grid: up to 0.1 s later,
    # its deployment grid up to 3 s), in a few hundred pulls at most.
    assert 1.20 <= clock.now <= 1.20 * (1 + messaging.INTERVAL_SHARE)
    assert grid.pulls < 200


def test_a_long_round_pulls_at_most_once_a_second(clock: Clock) -> None:
    grid = TimedGrid(clock, [3600.0])
    send_and_receive(grid, _messages(1), timeout=None)
    assert 3600.0 <= clock.now <= 3600.0 + MAX_INTERVAL_S
    assert 3600 < grid.pulls < 3600 + 400


def test_the_timeout_returns_what_arrived_without_waiting_past_it(clock: Clock) -> None:
    grid = TimedGrid(clock, [0.05, 30.0])
    replies = send_and_receive(grid, _messages(2), timeout=0.4)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert clock.now == pytest.approx(0.4)


class SignallingGrid(TimedGrid):
    """A grid on real time whose reply is stored ``delay`` seconds after the push by another thread, which then
    signals it as the simulation engine's hook does (apps/delivery.py)."""

    def __init__(self, delay: float) -> None:
        super().__init__(Clock(), [0.0])
        self.delay = delay
        self.stored = threading.Event()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = list(super().push_messages(messages))

        def answer() -> None:
            time.sleep(self.delay)
            self.stored.set()
            messaging.reply_stored.set()

        threading.Thread(target=answer, daemon=True).start()
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        self.pulls += 1
        return [self._due.pop(mid)[1] for mid in list(message_ids) if self.stored.is_set() and mid in self._due]


def test_a_signalled_reply_is_pulled_at_once_not_at_the_end_of_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messaging, "MIN_INTERVAL_S", 5.0)  # without the signal, the loop would wait 5 s
    grid = SignallingGrid(delay=0.2)
    started = time.monotonic()
    replies = send_and_receive(grid, _messages(1), timeout=60.0)
    assert len(replies) == 1
    assert time.monotonic() - started < 2.0 and grid.pulls == 2  # the first pull, then the one the signal woke


def test_on_arrival_gets_each_pull_s_replies_right_after_it_with_the_count_still_pending(clock: Clock) -> None:
    grid = TimedGrid(clock, [0.30, 0.90, 0.30])
    calls: list[tuple[float, int, int]] = []
    replies = send_and_receive(
        grid, _messages(3), timeout=600.0, on_arrival=lambda got, left: calls.append((clock.now, len(got), left))
    )
    assert len(replies) == 3
    # Two replies came in the same pull, then the last: one call each, with what is still outstanding.
    assert [(n, left) for _, n, left in calls] == [(2, 1), (1, 0)]
    # Within one interval of the first replies, long before the last one.
    assert 0.30 <= calls[0][0] <= 0.30 * (1 + messaging.INTERVAL_SHARE) + MIN_INTERVAL_S
    assert calls[1][0] >= 0.90
