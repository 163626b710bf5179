"""bench/captured_step.py run to completion on the CPU at a tiny size (every step eager: no CUDA graphs there), and
its refusal of ``--device cuda`` without a GPU. On a GPU the same module captures; the figures' keys are the same."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from bench.captured_step import main

# --threads 1: the run pins the process's thread pools, and this is the test process (tests/conftest.py pins it to
# its share of the cores, one thread on two cores).
TINY = ["--clients", "3", "--samples", "8", "--epochs", "1", "--batch-size", "4", "--rounds", "2", "--steps", "2",
        "--threads", "1"]  # fmt: skip


pytestmark = pytest.mark.usefixtures("fashion_mnist")  # tests/conftest.py: skipped where it is not installed


def check_figures(result: dict, rounds: int) -> None:
    """What every run of bench.captured_step on the CPU writes (also tests/bench/test_gpu_session.py's)."""
    assert result["device"] == "cpu" and result["gpu"] is None
    assert [r["round"] for r in result["captured_rounds"]] == list(range(1, rounds + 1))
    for r in result["captured_rounds"]:
        assert r["all_finite"] and r["sum_norm"] > 0
        assert r["captures"] == r["replays"] == 0 and r["eager_steps"] == r["steps"]  # no graphs on a CPU
        assert r["capacity"] >= r["clients"]
    assert result["captured_step_ms"] is None and result["step_limit_of"].startswith("eager")
    by_shape, steps = result["step_ms_by_shape"], result["steps_by_shape"]
    assert sum(steps.values()) == result["captured_rounds"][-1]["steps"]
    assert result["round_limit_s"] == pytest.approx(sum(by_shape[k] * n for k, n in steps.items()) / 1e3)
    for key in ("worker_round_s", "last_worker_round_over_limit", "vectorized_round_s",
                "vectorized_over_last_worker_round", "eager_step_ms"):  # fmt: skip
        assert math.isfinite(result[key]) and result[key] > 0, key


def test_cpu_smoke_run_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "result.json"
    assert main(["--device", "cpu", "--profile", "--variants", *TINY, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    check_figures(result, rounds=2)
    assert result["args"]["out"] == str(out) and result["args"]["clients"] == 3  # the namespace's copy, as given
    assert [r["steps"] for r in result["captured_rounds"]] == [2, 2]  # 8 samples, B = 4, one epoch
    assert result["steps_by_shape"] == {"3": 2}  # equal clients: one shape, the cohort's
    assert result["round_limit_s"] == pytest.approx(result["step_ms_by_shape"]["3"] * 2 / 1e3)
    assert "aten::" in result["profile"]
    variants = result["step_variants"]
    assert {"default", "gemm", "bf16", "gemm+bf16"} <= set(variants)
    assert variants["gemm"]["max_abs_diff_vs_default"] < 1e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--out", str(tmp_path / "r.json")]) == 2
    assert "--device cpu" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_plan_only_counts_each_rounds_steps_k_and_shapes(tmp_path: Path) -> None:
    shrink = ["dataset.max_train_samples=400", "dataset.num_clients=12", "privacy.sample_rate=0.6"]
    out = tmp_path / "plan.json"
    assert main(["--cohorts", "app", "--override", *shrink, "--rounds", "4", "--plan-only", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["round"] for r in result["rounds"]] == [1, 2, 3, 4]
    for r in result["rounds"]:
        assert r["steps"] > 0 and 1 <= r["shapes"] <= r["distinct_k"] <= r["clients"]
    assert result["run_shapes"] <= result["run_distinct_k"]
