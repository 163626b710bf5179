"""Helpers for integration tests: real Flower simulations (Hydra front door and `flwr run` against a real
SuperLink process on 127.0.0.1), each with its own Ray temp dir and Flower home, and every process stopped."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from bench.processes import (
    BIN,
    ROOT,
    free_port,
    kill_processes_mentioning,
    processes_mentioning,
    run_env,
    simulation_superlink,
)
from fl_app.checkpoint import load_checkpoint
from fl_app.metrics import read_metrics
from tests.integration.app_dir import app_dir

# A small Fashion-MNIST setting: 50 clients over the first 6000 training images (120 each), 2000 test images,
# q = 0.2 (about 10 clients a round).
SMALL = [
    "dataset.num_clients=50",
    "dataset.max_train_samples=6000",
    "dataset.max_test_samples=2000",
    "privacy.sample_rate=0.2",
]


def run_hydra(tmp: Path, overrides: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m apps.main <overrides>` writing into tmp/out."""
    cmd = [
        sys.executable,
        "-m",
        "apps.main",
        *overrides,
        f"output_dir={tmp / 'out'}",
        f"hydra.run.dir={tmp / 'hydra'}",
    ]
    return subprocess.run(cmd, cwd=ROOT, env=run_env(tmp), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dpfs", dir="/tmp") as d:
        yield Path(d)


def start_and_kill_when(
    tmp: Path, overrides: list[str], ready: Callable[[Path], bool], what: str, timeout: float = 300
) -> Path:
    """Run ``python -m apps.main <overrides>`` into tmp/out and SIGKILL its whole process tree (server, Ray) as
    soon as ``ready(run dir)`` holds; returns the run dir. ``what`` names the awaited event in a timeout failure."""
    out = tmp / "out"
    env = run_env(tmp)
    log_path = tmp / "killed.log"
    cmd = [sys.executable, "-m", "apps.main", *overrides, f"output_dir={out}", f"hydra.run.dir={tmp / 'h1'}"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while not ready(out):
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, f"{what} did not happen in time"
                time.sleep(0.02)
            os.killpg(proc.pid, signal.SIGKILL)  # mid-run
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            kill_processes_mentioning(env["RAY_TMPDIR"])
    return out


def resume_run(tmp: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``python -m apps.main resume=<out>`` to the end."""
    return subprocess.run(
        [sys.executable, "-m", "apps.main", f"resume={out}", f"hydra.run.dir={tmp / 'h2'}"],
        cwd=ROOT, env=run_env(tmp), capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def _a_round_written(out: Path) -> bool:
    metrics_path = out / "metrics.jsonl"
    return metrics_path.exists() and bool(metrics_path.read_text().strip())


def kill_after_a_round_then_resume(tmp: Path, overrides: list[str], rounds: int) -> tuple[Path, int]:
    """Kill a run as soon as its first round's metrics line is written, resume it; (run dir, checkpointed round)."""
    out = start_and_kill_when(tmp, overrides, _a_round_written, "a round")
    done_before_kill = len(read_metrics(out / "metrics.jsonl"))
    assert done_before_kill < rounds, "the run finished before it could be killed"
    checkpointed = load_checkpoint(out).round if (out / "checkpoint.npz").exists() else 0
    assert done_before_kill - checkpointed <= 1  # at most one round is redone
    resumed = resume_run(tmp, out)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    return out, checkpointed


@pytest.fixture(scope="session")
def shared_superlink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str], Path]]:
    """One ``flower-superlink --simulation`` for the tests that only ``flwr run`` an app on it (each ``flwr run`` is
    a run of its own, with its own Ray): (connection, env, a directory for the runs' outputs)."""
    tmp = tmp_path_factory.mktemp("shared_superlink")
    with simulation_superlink(tmp) as (connection, env):
        yield connection, env, tmp


def flwr_run_app(
    superlink: tuple[str, dict[str, str], Path], app: Path, run_config: str, federation_config: str
) -> subprocess.CompletedProcess[str]:
    """``flwr run <app> --run-config <run_config> --stream`` on ``superlink`` (:func:`shared_superlink`)."""
    connection, env, _ = superlink
    return subprocess.run(
        ["flwr", "run", str(app), connection, "--federation-config", federation_config, "--run-config", run_config,
         "--stream"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def flwr_run_simulation(
    superlink: tuple[str, dict[str, str], Path],
    run_config: str,
    num_supernodes: int = 2,
    resources: str = "client-resources-num-cpus=1",
) -> subprocess.CompletedProcess[str]:
    """``flwr run <app> --run-config <run_config>`` (tests/integration/app_dir.py) on a real ``--simulation``
    SuperLink (:func:`shared_superlink`, or one of a test's own: (connection, env, directory))."""
    return flwr_run_app(superlink, app_dir(), run_config, f"num-supernodes={num_supernodes} {resources}")


def stop_processes_mentioning(marker: str, grace: float = 10.0) -> None:
    """SIGTERM (Ray's daemons shut down their children on it), then SIGKILL whatever is left."""
    procs = processes_mentioning(marker)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    psutil.wait_procs(procs, timeout=grace)
    kill_processes_mentioning(marker)


@contextlib.contextmanager
def ray_cluster(num_cpus: int = 2) -> Iterator[tuple[str, str]]:
    """A one-node Ray cluster on 127.0.0.1 (``ray start --head``); yields (address, its temp dir). Stopped on exit,
    also on failure, by the temp dir its processes name: never ``ray stop``, which kills every Ray on the machine."""
    temp_dir = tempfile.mkdtemp(prefix="rayc", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    env = run_env(Path(temp_dir))
    env["RAY_TMPDIR"] = temp_dir  # the daemons inherit it: that is how cleanup finds every one of them
    cmd = [
        str(BIN / "ray"), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", f"--num-cpus={num_cpus}",
        "--num-gpus=0", "--disable-usage-stats", "--include-dashboard=false",
        # Its default, 10001, is fixed: a second cluster on the machine (another test run) would collide.
        f"--ray-client-server-port={free_port()}", f"--temp-dir={temp_dir}",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        yield f"127.0.0.1:{port}", temp_dir
    finally:
        stop_processes_mentioning(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_ray() -> Iterator[str]:
    """One Ray head for the Hydra runs that do not need a Ray of their own, as the override that joins it
    (``simulation.ray_address=...``): Ray's daemons start once for all of them instead of once a run (about 6 s of
    both cores each). Sized as a local Ray would be (this machine's cores), so the runs simulate as many SuperNodes
    and train the same models (results do not depend on it: strategies/population.py). A run killed mid-round
    leaves the cluster running; its resume joins the same cluster (the checkpoint's config names it)."""
    with ray_cluster(os.cpu_count() or 1) as (address, _):
        yield f"simulation.ray_address={address}"
