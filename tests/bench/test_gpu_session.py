"""bench/gpu_session.py: its summary is the app's round against the worker's round on the app's own cohorts and that
round's limit. (The session run to completion at a tiny size on the CPU, with its app run on Ray:
tests/integration/test_gpu_session.py.)"""

from __future__ import annotations

import pytest

from bench.gpu_session import summarize


def test_the_summary_compares_the_apps_round_with_the_workers_and_its_limit() -> None:
    step = {"worker_round_s": 2.0, "round_limit_s": 1.6,
            "captured_rounds": [{"captures": 7, "eager_steps": 0}, {"captures": 1, "eager_steps": 0}]}  # fmt: skip
    summary = summarize(step, {"round_s": 2.5})
    assert summary["app_over_worker_round"] == pytest.approx(1.25)
    assert summary["worker_over_limit"] == pytest.approx(1.25)
    assert summary["captures_each_round"] == [7, 1] and summary["eager_steps_each_round"] == [0, 0]
    assert summarize(None, None) == {"app_round_s": None, "worker_round_s": None, "round_limit_s": None}
