"""Helpers for integration tests: real Flower simulations (Hydra front door and `flwr run` against a real
SuperLink process on 127.0.0.1), each with its own Ray temp dir and Flower home, and every process stopped."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.processes import ROOT, run_env

# A small Fashion-MNIST setting: 50 clients over the first 6000 training images (120 each), 2000 test images,
# q = 0.2 (about 10 clients a round).
SMALL = [
    "dataset.num_clients=50",
    "dataset.max_train_samples=6000",
    "dataset.max_test_samples=2000",
    "privacy.sample_rate=0.2",
]


def run_hydra(tmp: Path, overrides: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m fl_app.main <overrides>` writing into tmp/out."""
    cmd = [
        sys.executable,
        "-m",
        "fl_app.main",
        *overrides,
        f"output_dir={tmp / 'out'}",
        f"hydra.run.dir={tmp / 'hydra'}",
    ]
    return subprocess.run(cmd, cwd=ROOT, env=run_env(tmp), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dpfs", dir="/tmp") as d:
        yield Path(d)
