"""The reference loops of the benchmark (bench/parallel.py, bench/batched.py), their helpers, the thread pinning
(fl_app/threads.py) and the harness's new pure helpers and report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from bench import run as bench_run
from bench.baseline import local_steps, run_baseline
from bench.batched import active_counts, client_batches, run_batched, stack_schedule
from bench.parallel import balance_by_steps, run_parallel
from fl_app.config import compose_config
from fl_app.threads import library_thread_counts, limit_library_threads

# 20 clients over the first 600 training images (Dirichlet 0.6: unequal sizes), about 4 a round, batch 16.
TINY = [
    "dataset.num_clients=20",
    "dataset.max_train_samples=600",
    "privacy.sample_rate=0.2",
    "client.batch_size=16",
    "num_rounds=2",
]


@pytest.fixture
def one_torch_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the app's Ray workers and the parallel loops
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        limit_library_threads(threads)


def _max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return bench_run.max_abs_diff(a, b)


# --- fl_app/threads.py ----------------------------------------------------------------------------------------


def test_limit_library_threads_pins_blas_to_one_and_openmp_to_the_torch_count() -> None:
    threads = torch.get_num_threads()
    try:
        limit_library_threads(threads)
        limit_library_threads(threads)  # idempotent
        for pool in threadpool_info():
            if pool["user_api"] == "blas" and "torch" not in pool["filepath"]:
                assert pool["num_threads"] == 1, pool
            if pool["user_api"] == "openmp":
                assert pool["num_threads"] == threads, pool
        assert torch.get_num_threads() == threads
        counts = library_thread_counts()
        assert counts and all(isinstance(v, int) for v in counts.values())
        # torch moved its OpenMP pool: the next call puts it back, although no module was imported in between.
        torch.set_num_threads(1)
        limit_library_threads(threads)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(threads)
        limit_library_threads(threads)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_limit_library_threads_rejects_non_positive_integers(bad: Any) -> None:
    with pytest.raises(ValueError):
        limit_library_threads(bad)


# --- bench/parallel.py ----------------------------------------------------------------------------------------


def test_balance_by_steps_is_longest_first_to_the_least_loaded() -> None:
    steps = {3: 4, 7: 4, 1: 9, 2: 1, 5: 6, 9: 0}
    # 1 (9) -> r0; 5 (6) -> r1; 3 (4) -> r1 (6 < 9); 7 (4) -> r0 (9 < 10); 2 (1) -> r1 (10 < 13); 9 (0) -> r1.
    assert balance_by_steps(steps, 2) == [[1, 7], [2, 3, 5, 9]]
    assert balance_by_steps(steps, 1) == [sorted(steps)]
    shares = balance_by_steps(steps, 4)
    assert sorted(pid for share in shares for pid in share) == sorted(steps)
    assert balance_by_steps({}, 3) == [[], [], []]
    with pytest.raises(ValueError):
        balance_by_steps(steps, 0)


def test_local_steps_counts_the_short_last_batch_and_every_epoch() -> None:
    config = compose_config(["client.local_epochs=3", "client.batch_size=32"])
    assert [local_steps(n, config) for n in (0, 1, 32, 33, 120)] == [0, 3, 3, 6, 12]


def test_parallel_loops_reach_the_loop_s_model(one_torch_thread: None) -> None:
    config = compose_config(["strategy=dp_fedsam", *TINY])
    parallel = run_parallel(config, procs=2, threads=1)
    loop = run_baseline(config)
    assert parallel.clients_per_round == loop.clients_per_round
    assert len(parallel.round_seconds) == 2 and all(len(b) == 2 for b in parallel.busy_seconds)
    # Both processes got work, and the split is by steps.
    assert all(min(steps) > 0 for steps in parallel.rank_steps)
    # Only the float64 summation order differs.
    assert _max_abs_diff(parallel.weights, loop.weights) <= 1e-6
    initial = run_baseline(config, num_rounds=0).weights
    assert _max_abs_diff(loop.weights, initial) > 1e-3


# --- bench/batched.py -----------------------------------------------------------------------------------------


def test_client_batches_replay_one_randperm_per_epoch() -> None:
    generator = torch.Generator().manual_seed(5)
    batches = client_batches(10, 2, 4, generator)
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    replay = torch.Generator().manual_seed(5)
    first, second = torch.randperm(10, generator=replay), torch.randperm(10, generator=replay)
    assert torch.equal(torch.cat(batches[:3]), first) and torch.equal(torch.cat(batches[3:]), second)
    assert client_batches(0, 3, 4, generator) == []


def test_stack_schedule_pads_short_batches_and_shrinks_to_the_clients_still_training() -> None:
    schedules = [
        [torch.tensor([0, 1, 2]), torch.tensor([3, 4])],  # 5 samples, 2 steps (short last batch)
        [torch.tensor([1, 0])],  # 2 samples, 1 step
    ]
    rows = [np.array([10, 11, 12, 13, 14]), np.array([20, 21])]
    index, weight, active = stack_schedule(schedules, rows, batch_size=3)
    assert active == [2, 1]
    assert index.shape == weight.shape == (2, 2, 3)
    assert index[0, 0].tolist() == [10, 11, 12] and weight[0, 0].tolist() == [1, 1, 1]
    assert index[1, 0].tolist()[:2] == [13, 14] and weight[1, 0].tolist() == [1, 1, 0]
    assert index[0, 1].tolist()[:2] == [21, 20] and weight[0, 1].tolist() == [1, 1, 0]
    assert weight[1, 1].sum() == 0  # finished: never computed (outside the active prefix)
    assert active_counts([3, 3, 1, 0]) == [3, 2, 2]
    with pytest.raises(ValueError):
        active_counts([1, 2])


@pytest.mark.parametrize(
    "extra",
    [
        ["strategy=dp_fedsam"],
        ["strategy=dp_fedsam", "client.adaptive=true", "client.rho=0.5"],
        ["strategy=dp_fedavg", "client.local_epochs=2"],
        ["strategy=fedavg"],
    ],
    ids=["sam", "asam", "sgd-2-epochs", "non-private"],
)
def test_batched_loop_reaches_the_loop_s_model(extra: list[str], one_torch_thread: None) -> None:
    config = compose_config([*extra, *TINY])
    # In float64: batched kernels break max-pool ties and sum in other orders, which float32 ReLU networks turn
    # into differences of 1e-4..1e-2 that depend on the CPU's kernels (tests/clients/test_vectorized.py; 1.3e-4
    # for ASAM on an AMD EPYC, where float32 passed 1e-4 elsewhere); in float64 the two loops agree to rounding.
    batched = run_batched(config, device="cpu", dtype=torch.float64)
    loop = run_baseline(config, dtype=torch.float64)
    assert batched.clients_per_round == loop.clients_per_round
    assert len(set(batched.steps_per_round)) >= 1 and max(batched.steps_per_round) > 1
    assert _max_abs_diff(batched.weights, loop.weights) <= 1e-10
    initial = run_baseline(config, num_rounds=0).weights
    assert _max_abs_diff(loop.weights, initial) > 1e-3


def test_asam_is_not_plain_sam_in_the_loop(one_torch_thread: None) -> None:
    sam = run_baseline(compose_config(["strategy=dp_fedsam", "client.rho=0.5", *TINY]), num_rounds=1)
    asam = run_baseline(compose_config(["strategy=dp_fedsam", "client.rho=0.5", "client.adaptive=true", *TINY]), 1)
    assert _max_abs_diff(sam.weights, asam.weights) > 1e-6


def test_batched_loop_refuses_cuda_without_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="CUDA"):
        run_batched(compose_config(TINY), num_rounds=1, device="cuda")


# --- bench/run.py ---------------------------------------------------------------------------------------------


def test_steady_and_overlap_windows() -> None:
    assert bench_run.steady([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 6) == [3.0, 4.0, 5.0]
    # Three runs of 6 rounds, 1 s a round; run 2 started 1.5 s late. Window: after the last round-2 finish (3.5)
    # and before the first round-5 finish (5.0): rounds 5 of runs 0 and 1, round 3 of run 2.
    early = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert bench_run.overlap_rounds([early, early, [t + 1.5 for t in early]], 6) == [[1.0], [1.0], [1.0]]
    assert bench_run.overlap_rounds([early, [t + 10 for t in early]], 6) == [[], []]  # never together
    together = [[float(t) for t in range(1, 7)]] * 3
    assert bench_run.overlap_rounds(together, 6) == [[1.0, 1.0, 1.0]] * 3


def _run(round_s: float, **extra: Any) -> dict[str, Any]:
    return {"round_s": round_s, "updates_per_s": 20 / round_s, "clients_phase_s": 1.0, "aggregate_s": 0.1,
            "other_s": 0.05, **extra}  # fmt: skip


def test_report_renders_the_fair_comparison_the_gpu_case_and_failures() -> None:
    p2_entry = {
        "app_per_client": _run(3.0),
        "app_cohort": None,
        "loop": _run(2.5, threads=2),
        "parallel_loops": _run(2.0, procs=2, threads=1, busy_fraction=0.9),
        "ratio_cohort_over_parallel": None,
        "ratio_cohort_over_loop": None,
        "ratio_per_client_over_loop": 1.2,
        "ratio_per_client_over_parallel": 1.5,
        "final_model_max_abs_diff": {"app_per_client_vs_parallel": 0.0},
        "errors": {"app_cohort": "RuntimeError: boom\nmore"},
    }
    gpu = {
        "gpu": "H100",
        "rounds_measured": "3..5",
        "app_per_client": _run(6.0),
        "app_cohort_gpus_1": _run(1.2),
        "app_cohort_gpus_0.5": _run(1.4),
        "batched_loop": _run(1.0),
        "cohort_round_s": 1.2,
        "ratio_cohort_over_batched": 1.2,
        "ratio_per_client_over_batched": 6.0,
        "ratio_per_client_over_cohort": 5.0,
        "ratio_shared_over_alone": 1.6,
        "shared": {"runs": 3, "round_s_each_run": [1.9, 1.8, 1.7], "fully_overlapped": True, "round_s": 1.9},
    }
    results = {
        "machine": bench_run.machine(),
        "overrides": ["strategy=dp_fedsam"],
        "command": "python -m bench",
        "P2": {"thread_env": bench_run.THREAD_ENV, "rounds_measured": "3..7", "dp_fedsam": p2_entry},
        "P3": {"peak_rss_mib": {"100": 2000.0, "500": 2100.0, "5000": 2200.0}, "ratio_largest_over_smallest": 1.1},
        "GPU": gpu,
        "P1": {
            "python_imports_s": 7.0,
            "ray_init_alone_s": 4.0,
            "superlink_start_s": 2.0,
            "flwr_run_packaging": {
                "cli_imports_s": 1.9,
                "collect_files_s": 5.5,
                "build_s": 0.5,
                "files_walked": 44010,
                "files_walked_in_venv": 42631,
                "fab_bytes": 2005840,
            },
            "hydra": {
                "total_s": 9.5,
                "to_serverapp_start_s": 5.0,
                "serverapp_to_first_fit_s": 4.0,
                "worker_setup_s": 0.5,
            },
            "flwr_run": {
                "total_s": 12.0,
                "to_serverapp_start_s": 7.0,
                "serverapp_to_first_fit_s": 4.5,
                "worker_setup_s": 0.5,
            },
        },
    }
    table = bench_run.to_markdown(results)
    assert "| P2 dp_fedsam: cohort / parallel loops | **n/a** | ≤ 1.1 | n/a |" in table
    assert "app cohort mode (`cohort_size=auto`): failed" in table
    assert "| P2 dp_fedsam app_cohort FAILED | RuntimeError: boom |" in table
    assert "| P3 peak RSS at the default M=500 (MiB) | **2100** | ≤ 3 GB (2861 MiB) | yes |" in table
    assert "| GPU cohort / batched loop | **1.200** | ≤ 1.3 | yes |" in table
    assert "slowest / alone | **1.600** (s/round each: 1.90, 1.80, 1.70) | ≤ 1.5 | **no** |" in table
    assert "OPENBLAS_NUM_THREADS=1" in table
    assert (
        "| P1 startup, hydra (s) | 9.5 = 5.0 to ServerApp + 4.0 to first fit + 0.5 worker setup | ≤ 10 | yes |" in table
    )
    assert "| P1 startup, flwr_run (s) | 12.0" in table and "| ≤ 10 | **no** |" in table
    assert "walk of 44010 files (42631 in .venv) 5.5, FAB build 0.5" in table


def test_gpu_case_fails_clearly_without_cuda(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        bench_run.main(["--only", "GPU", "--out", str(tmp_path)])


def test_gpu_case_assembles_its_contenders_and_ratios(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The GPU case's plumbing, without a GPU: which runs it starts with which overrides, and what it computes."""
    model = [np.zeros((2, 2), dtype=np.float32)]
    np.savez(tmp_path / "m.npz", *model)
    calls: list[tuple[str, list[str]]] = []

    def fake_app_run(overrides: list[str], num_rounds: int, tmp: Path, label: str, env: dict[str, str]) -> Any:
        calls.append((label, overrides))
        assert env == bench_run.THREAD_ENV and num_rounds == 6
        round_s = {"app_per_client": 8.0, "app_cohort_gpus_1": 1.2, "app_cohort_captured": 0.6}.get(label, 1.5)
        return {"round_s": round_s, "model_file": str(tmp_path / "m.npz")}

    def fake_loop(cmd: list[str], env: dict[str, str], log: Path) -> Any:
        if cmd[2] == "bench.captured_step":
            calls.append(("step", cmd))
            return {"round_limit_s": 0.5, "captured_step_ms": 4.2}
        calls.append(("batched", cmd))
        return {"round_seconds": [5.0, 2.0, 1.0, 1.0, 1.0, 3.0], "clients_per_round": [50] * 6,
                "weights_file": str(tmp_path / "m.npz")}  # fmt: skip

    def fake_shared(overrides: list[str], num_rounds: int, tmp: Path, count: int) -> Any:
        calls.append(("shared", overrides))
        assert count == 3 and num_rounds == 12
        return {"runs": 3, "round_s_each_run": [1.5, 1.6, 1.8], "fully_overlapped": True, "round_s": 1.8}

    monkeypatch.setattr(bench_run.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench_run.torch.cuda, "get_device_name", lambda index=0: "Fake GPU")
    monkeypatch.setattr(bench_run, "_app_run", fake_app_run)
    monkeypatch.setattr(bench_run, "_run_loop", fake_loop)
    monkeypatch.setattr(bench_run, "_shared_app_runs", fake_shared)
    result = bench_run.gpu_paper_scale(bench_run.GPU_OVERRIDES, 6, tmp_path)
    labels = dict(calls[:4])
    assert (
        "simulation.client_gpus=0.1" in labels["app_per_client"]
        and "simulation.cohort_size=1" in labels["app_per_client"]
    )
    assert "simulation.client_gpus=0.5" in labels["app_cohort_gpus_0.5"]
    assert all("simulation.device=cuda" in o for o in labels.values())
    assert "simulation.cohort_engine=captured" in labels["app_cohort_captured"]
    assert all("simulation.cohort_engine=vectorized" in labels[n] for n in ("app_cohort_gpus_1", "app_cohort_gpus_0.5"))
    batched_cmd = calls[4][1]
    assert batched_cmd[2] == "bench.batched" and "--device" in batched_cmd and "num_rounds=6" in batched_cmd
    assert "+scale=paper" in batched_cmd and "dataset.num_clients=167" in batched_cmd
    step_cmd = calls[5][1]
    assert step_cmd[2] == "bench.captured_step" and step_cmd[step_cmd.index("--cohorts") + 1] == "app"
    assert "simulation.client_gpus=1" in calls[6][1] and "simulation.cohort_engine=captured" in calls[6][1]
    assert result["captured_round_s"] == 0.6
    assert result["ratio_captured_over_limit"] == pytest.approx(1.2)
    assert result["ratio_captured_over_batched"] == pytest.approx(0.6)
    assert result["batched_loop"]["round_s"] == 1.0  # median of rounds 3..5
    assert result["cohort_round_s"] == 1.2  # the better of client_gpus 1 and 0.5
    assert result["ratio_cohort_over_batched"] == pytest.approx(1.2)
    # The three shared runs against the captured engine's run alone (0.6 s): the engine a GPU run gets by default.
    assert result["ratio_shared_over_alone"] == pytest.approx(3.0)
    assert result["shared"]["ratio_each_run_over_alone"] == pytest.approx([2.5, 1.6 / 0.6, 3.0])
    assert result["final_model_max_abs_diff"]["app_per_client_vs_batched"] == 0.0
    table = bench_run.to_markdown(
        {"machine": bench_run.machine(), "overrides": [], "command": "python -m bench", "GPU": result}
    )
    assert "GPU cohort / batched loop | **1.200** | ≤ 1.3 | yes" in table
    assert "| GPU captured cohort s/round | **0.60** | ≤ 0.5 | **no** |" in table
    assert (
        "| GPU captured / its step's limit | **1.200** (limit 0.50 s/round = 4.20 ms a step) | ≤ 1.3 | yes |" in table
    )
