"""apps/delivery.py: the simulation engine's extractor moves a stored message at once, keeps Flower's one message
per SuperNode per pass and its stop event, and is installed only over the Flower function it was written for."""

from __future__ import annotations

import threading
import time
from queue import Queue

from apps.delivery import POLL_CEILING_S, deliver_promptly, prompt_extractor
from strategies.messaging import reply_stored


class _Store:
    """The LinkState calls the extractor makes and wraps, over a list of (node, message) and one of replies."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, str]] = []
        self.replies: list[str] = []
        self.lock = threading.Lock()

    def store_message_ins(self, message: tuple[int, str]) -> str:
        with self.lock:
            self.pending.append(message)
        return message[1]

    def get_message_ins(self, node_id: int, limit: int | None) -> list[tuple[int, str]]:
        with self.lock:
            mine = [m for m in self.pending if m[0] == node_id][:limit]
            for m in mine:
                self.pending.remove(m)
        return mine

    def store_message_res(self, message: str) -> None:
        with self.lock:
            self.replies.append(message)


def _start(store: _Store, nodes: dict[int, int]) -> tuple[Queue[tuple[int, str]], threading.Event, threading.Thread]:
    queue: Queue[tuple[int, str]] = Queue()
    stop = threading.Event()
    thread = threading.Thread(target=prompt_extractor, args=(store, queue, nodes, stop), daemon=True)
    thread.start()
    time.sleep(0.05)  # the extractor is waiting on an empty store
    return queue, stop, thread


def test_a_stored_message_is_delivered_at_once_not_at_the_next_poll() -> None:
    store = _Store()
    queue, stop, thread = _start(store, {1: 0, 2: 1})
    try:
        latencies = []
        for i in range(5):
            sent = time.monotonic()
            store.store_message_ins((1 + i % 2, f"m{i}"))
            assert queue.get(timeout=1.0) == (1 + i % 2, f"m{i}")
            latencies.append(time.monotonic() - sent)
        # Flower's extractor waits 0.1 s between passes (0.05 s on average); the signal wakes this one.
        assert max(latencies) < POLL_CEILING_S / 2, latencies
    finally:
        stop.set()
        thread.join(timeout=2 * POLL_CEILING_S + 1)
    assert not thread.is_alive()


def test_a_burst_for_one_node_goes_one_per_pass_without_waiting_between_passes() -> None:
    store = _Store()
    queue, stop, thread = _start(store, {7: 0})
    try:
        sent = time.monotonic()
        for i in range(10):
            store.store_message_ins((7, f"m{i}"))
        got = [queue.get(timeout=1.0) for _ in range(10)]
        elapsed = time.monotonic() - sent
    finally:
        stop.set()
        thread.join(timeout=2 * POLL_CEILING_S + 1)
    assert got == [(7, f"m{i}") for i in range(10)]  # in the order they were stored
    assert elapsed < 5 * POLL_CEILING_S  # Flower's loop: one a pass, 0.1 s apart, ~1 s for ten


def test_the_store_gets_its_own_method_back_when_the_extractor_stops() -> None:
    store = _Store()
    _, stop, thread = _start(store, {1: 0})
    assert {"store_message_ins", "store_message_res"} <= set(vars(store))  # wrapped on the instance while running
    stop.set()
    thread.join(timeout=2 * POLL_CEILING_S + 1)
    assert not {"store_message_ins", "store_message_res"} & set(vars(store))


def test_a_stored_reply_is_kept_and_wakes_the_servers_pull_loop() -> None:
    store = _Store()
    _, stop, thread = _start(store, {1: 0})
    try:
        reply_stored.clear()
        store.store_message_res("r0")
        assert store.replies == ["r0"]
        assert reply_stored.wait(timeout=0)  # set by the time the store returns
    finally:
        stop.set()
        thread.join(timeout=2 * POLL_CEILING_S + 1)


def test_installed_over_flowers_extractor_once() -> None:
    from flwr.server.superlink.fleet.vce import vce_api

    original = vce_api.add_messages_to_queue
    try:
        assert deliver_promptly()
        assert vce_api.add_messages_to_queue is prompt_extractor
        assert deliver_promptly()  # idempotent
        assert vce_api.add_messages_to_queue is prompt_extractor
    finally:
        vce_api.add_messages_to_queue = original


def test_a_changed_flower_function_is_left_in_place() -> None:
    from flwr.server.superlink.fleet.vce import vce_api

    original = vce_api.add_messages_to_queue

    def other(state, queue, f_stop):  # type: ignore[no-untyped-def]  # a later Flower's different signature
        return None

    vce_api.add_messages_to_queue = other
    try:
        assert not deliver_promptly()
        assert vce_api.add_messages_to_queue is other
    finally:
        vce_api.add_messages_to_queue = original
