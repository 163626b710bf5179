"""A run whose clients cannot start fails loudly and at once: a resource setting this machine cannot host is refused
before Ray starts (exit 2, the setting named), and if Flower's simulation engine ends anyway (here: the same
setting with the check bypassed, so that Flower builds an empty actor pool) the ServerApp stops waiting for replies
within seconds, run.json says ``failed`` with the engine's error, and the process exits non-zero — instead of waiting
``round_timeout`` every round, releasing noise-only models and ending ``completed``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench.processes import ROOT, kill_processes_mentioning, run_env, simulation_superlink
from tests.integration.conftest import flwr_run_simulation, run_hydra

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU"),
]

TINY = ["dataset.num_clients=20", "dataset.max_train_samples=400", "dataset.max_test_samples=100", "num_rounds=2"]


def test_a_gpu_per_client_without_a_gpu_is_refused_before_ray_starts(short_tmp: Path) -> None:
    start = time.monotonic()
    result = run_hydra(short_tmp, [*TINY, "simulation.client_gpus=1"], timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "simulation.client_gpus=1.0: no CUDA GPU is visible" in result.stderr
    assert not (short_tmp / "out" / "run.json").exists()
    assert time.monotonic() - start < 60


ENGINE_DIES = """
import sys
from pathlib import Path
import strategies  # registers the strategy names a config is validated by
from apps.main import run
from apps.server_app import ServerRun
from fl_app.config import compose_config
run(ServerRun.prepare(compose_config(sys.argv[2:]), Path(sys.argv[1]), progress=False))
"""


def test_when_the_engine_dies_the_run_fails_in_seconds_with_its_error(short_tmp: Path) -> None:
    out = short_tmp / "out"
    env = run_env(short_tmp)
    start = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-c", ENGINE_DIES, str(out), *TINY, "simulation.client_gpus=1", "round_timeout=3600"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    finally:
        kill_processes_mentioning(env["RAY_TMPDIR"])
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert elapsed < 120  # not round_timeout (3,600 s) per round
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "failed"
    assert "EngineStoppedError" in meta["error"] and "ActorPool is empty" in meta["error"]
    assert meta["rounds_released"] == 0 and meta["epsilon"] == 0  # nothing left the server
    assert not (out / "final_model.npz").exists()


def test_under_flwr_run_the_engines_death_fails_the_run_in_seconds(short_tmp: Path) -> None:
    """The same engine death under ``flwr run`` (the federation asks a GPU per client): Flower's process exits five
    seconds after its engine, so the ServerApp must notice the crash itself (apps/engine_watch.py)."""
    out = short_tmp / "out"
    overrides = " ".join(TINY[:3])
    start = time.monotonic()
    with simulation_superlink(short_tmp) as (connection, env):  # its own: the engine dies under it
        result = flwr_run_simulation(
            (connection, env, short_tmp),
            f"num_rounds=2 round_timeout=3600 output_dir='{out}' overrides='{overrides}'",
            resources="client-resources-num-cpus=1 client-resources-num-gpus=1",
        )
    assert time.monotonic() - start < 150, result.stdout[-3000:]  # not round_timeout (3,600 s) per round
    meta = json.loads((out / "run.json").read_text())
    assert meta["status"] == "failed", meta
    assert "EngineStoppedError" in meta["error"] and "ActorPool is empty" in meta["error"]
    assert meta["rounds_released"] == 0 and meta["epsilon"] == 0
    assert not (out / "final_model.npz").exists()
