"""bench/captured_step.py run to completion on the CPU at a tiny size (every step eager: no CUDA graphs there), and
its refusal of ``--device cuda`` without a GPU. On a GPU the same module captures; the figures' keys are the same."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from bench.captured_step import main
from fl_app.data.datasets import FASHION_MNIST_SYSTEM_DIR, DatasetUnavailableError, load_dataset

# --threads 1: the run pins the process's thread pools, and this is the test process (tests/conftest.py pins it to
# its share of the cores, one thread on two cores).
TINY = ["--clients", "3", "--samples", "8", "--epochs", "1", "--batch-size", "4", "--rounds", "2", "--steps", "2",
        "--threads", "1"]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def fashion_mnist() -> None:
    try:
        load_dataset("fashion_mnist")
    except DatasetUnavailableError:
        pytest.skip(f"Fashion-MNIST not installed ({FASHION_MNIST_SYSTEM_DIR})")


def test_cpu_smoke_run_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "result.json"
    assert main(["--device", "cpu", "--profile", *TINY, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["gpu"] is None
    assert result["args"]["out"] == str(out) and result["args"]["clients"] == 3  # the namespace's copy, as given
    assert [r["round"] for r in result["captured_rounds"]] == [1, 2]
    for r in result["captured_rounds"]:
        assert r["steps"] == 2 and r["all_finite"] and r["sum_norm"] > 0  # 8 samples, B = 4, one epoch
    assert result["captured_step_ms"] is None and result["step_limit_of"].startswith("eager")
    assert result["step_limit_ms"] == result["eager_step_ms"] > 0
    assert result["round_limit_s"] == pytest.approx(result["step_limit_ms"] * 2 / 1e3)
    for key in ("worker_round_s", "worker_round_over_limit", "vectorized_round_s", "vectorized_over_worker_round"):
        assert math.isfinite(result[key]) and result[key] > 0, key
    assert "aten::" in result["profile"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--out", str(tmp_path / "r.json")]) == 2
    assert "--device cpu" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
