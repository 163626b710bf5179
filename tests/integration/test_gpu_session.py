"""bench/gpu_session.py run to completion at a tiny size on the CPU, as CI can (no CUDA tests there):
bench.captured_step on the app's unequal cohorts and on equal ones, and the app's own rounds on Ray, summarised."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu_session import session
from tests.bench.test_captured_step import check_figures

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600), pytest.mark.usefixtures("fashion_mnist")]


def test_a_tiny_session_on_the_cpu_writes_every_step(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step but the CUDA tests, on the app's unequal cohorts (a Dirichlet partition, Poisson cohorts of
    different sizes, several step shapes) and equal ones, and the app's own rounds."""
    monkeypatch.setenv("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    summary = session(short_tmp / "out", None, rounds=4, tiny=True)
    assert summary["errors"] == {} and summary["gpu"] is None and summary["cuda_tests"] is None
    assert sorted(p.name for p in (short_tmp / "out").iterdir()) == [
        "app_metrics.jsonl", "step_app.json", "step_equal.json", "summary.json"
    ]  # fmt: skip
    assert json.loads((short_tmp / "out" / "summary.json").read_text()) == json.loads(json.dumps(summary, default=str))
    step_app = json.loads((short_tmp / "out" / "step_app.json").read_text())
    check_figures(step_app, rounds=3)
    assert len({r["clients"] for r in step_app["captured_rounds"]}) > 1 and len(step_app["steps_by_shape"]) > 1
    check_figures(json.loads((short_tmp / "out" / "step_equal.json").read_text()), rounds=2)
    assert summary["app"]["clients_per_round"] > 0 and summary["app_round_s"] > 0
    assert "simulation.device=cpu" in summary["overrides"] and summary["worker_over_limit"] > 0
