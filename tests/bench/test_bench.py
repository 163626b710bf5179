"""The benchmark harness: its measurements of process memory, round intervals and startup, and its report."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import run as bench_run
from bench.processes import PeakRSSMonitor, tree_rss


def _monitor_parent_of(child_code: str) -> tuple[int, PeakRSSMonitor]:
    """Monitor a parent process that runs ``child_code`` in a child and waits for it; (parent pid, the monitor)."""
    code = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {child_code!r}]).wait()"
    proc = subprocess.Popen([sys.executable, "-c", code])
    with PeakRSSMonitor(proc.pid, interval=0.05) as monitor:
        proc.wait(timeout=60)
    return proc.pid, monitor


def test_peak_rss_counts_the_children_of_the_process_tree() -> None:
    # A parent that starts a child holding 200 MiB: the tree's peak must include the child's memory.
    pid, monitor = _monitor_parent_of(
        'import time; b = bytearray(200 * 2**20); b[::4096] = b"x" * len(b[::4096]); time.sleep(3)'
    )
    assert monitor.peak > 200 * 2**20
    assert tree_rss(pid) == 0  # gone: nothing left to count


def test_the_monitor_counts_the_cpu_seconds_of_the_process_tree_over_time() -> None:
    # A parent that sleeps while its child spins ~0.6 s of CPU, then both idle: the tree's CPU seconds include the
    # child's, never decrease, and are known at any moment after the first sample.
    _, monitor = _monitor_parent_of(
        "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\ntime.sleep(1)"
    )
    used = [cpu for _, cpu in monitor.cpu]
    assert used == sorted(used)
    assert 0.5 <= used[-1] < 5.0
    assert monitor.cpu_seconds_at(monitor.cpu[0][0]) == used[0]
    assert math.isnan(monitor.cpu_seconds_at(time.time() + 60))  # after the last sample: not known


def test_app_round_seconds_are_the_intervals_of_rounds_3_to_T_minus_1() -> None:
    records = [{"round": t, "finished_unix": 100.0 + t * t} for t in range(1, 7)]
    # finished: 101, 104, 109, 116, 125, 136 -> intervals of rounds 3..5: 5, 7, 9
    assert bench_run._app_round_seconds(records) == [5.0, 7.0, 9.0]


def test_startup_split_adds_up(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"started_unix": 110.0}))
    record = {"round": 1, "first_fit_started_unix": 118.5, "first_train_started_unix": 120.0}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    split = bench_run._startup_split(100.0, tmp_path)
    assert split == {
        "total_s": 20.0,
        "to_serverapp_start_s": 10.0,
        "serverapp_to_first_fit_s": 8.5,
        "worker_setup_s": 1.5,
    }


def test_accounting_benchmark_meets_its_target_and_reports(tmp_path: Path) -> None:
    t = time.perf_counter()
    assert bench_run.main(["--only", "P4", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    p4 = results["P4"]
    # The pinned values of docs/mechanisms.md, 6 (q=0.1, σ=0.95, T=300, δ=1/500), as in
    # tests/privacy/test_accounting.py.
    assert p4["epsilon_rdp"] == pytest.approx(10.795, abs=1e-3)
    assert p4["epsilon_prv"] == pytest.approx(9.38, abs=0.01)
    assert p4["per_round_accounting_at_T300_s"] < 0.05
    assert time.perf_counter() - t < 30
    table = (tmp_path / "results.md").read_text()
    assert "P4 ε after T=300" in table and "| < 1 |" in table


def test_with_overrides_replaces_keys_instead_of_repeating_them() -> None:
    base = ["strategy=dp_fedsam", "dataset.num_clients=500", "privacy.sample_rate=0.04"]
    assert bench_run.with_overrides(base, "dataset.num_clients=100", "num_rounds=3") == [
        "strategy=dp_fedsam",
        "privacy.sample_rate=0.04",
        "dataset.num_clients=100",
        "num_rounds=3",
    ]
