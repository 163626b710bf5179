"""bench/round_split.py: the parts of a round, from the timed calls of the run loop."""

from __future__ import annotations

import pytest

from bench.round_split import split


def _events(rounds: int) -> tuple[dict[str, list[tuple[float, float]]], list[float]]:
    """Rounds of 1 s: push at t, first fit at t + 0.01, replies at t + 0.80 and t + 0.83, the last one taken and
    aggregated (2 + 8 ms), digest 3 ms, log line 1 ms, plan 2 ms, observers 15 ms after the push."""
    events: dict[str, list[tuple[float, float]]] = {}
    fits = []
    for index in range(rounds):
        t = 100.0 + index
        fits.append(t + 0.01)
        events.setdefault("push", []).append((t, 0.0))
        events.setdefault("observers", []).append((t + 0.001, 0.015))
        events.setdefault("arrival", []).extend([(t + 0.80, 1.0), (t + 0.83, 1.0)])
        events.setdefault("take", []).extend([(t + 0.80, 0.002), (t + 0.831, 0.002)])  # the first one is off-path
        events.setdefault("aggregate", []).append((t + 0.833, 0.008))
        events.setdefault("digest", []).append((t + 0.842, 0.003))
        events.setdefault("release_log", []).append((t + 0.846, 0.001))
        events.setdefault("plan", []).append((t + 0.998, 0.002))
    return events, fits


def test_split_names_each_part_of_the_steady_rounds() -> None:
    events, fits = _events(8)
    parts = split(events, fits)
    expected = {
        "round_s": 1.0,
        "push_to_first_fit_s": 0.01,
        "first_to_last_reply_s": 0.03,
        "last_reply_to_next_push_s": 0.17,
        "aggregate_after_last_reply_s": 0.010,  # the last reply's take and the aggregation, not the first take
        "digest_s": 0.003,
        "release_log_s": 0.001,
        "plan_s": 0.002,  # the next round's plan (before its push)
        "observers_after_push_s": 0.015,
    }
    assert parts.keys() == expected.keys()
    for key, value in expected.items():
        assert parts[key] == pytest.approx(value, abs=1e-9), key
