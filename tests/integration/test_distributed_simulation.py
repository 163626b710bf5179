"""Distributed DP-FedSAM from the Hydra front door on Flower's Ray engine (the shared Ray head): every round over
secure aggregation, one SuperNode per client, and both guarantees in run.json. (The wire-format checks:
tests/strategies/test_distributed_dp.py; a TLS deployment with a node killed: test_deployment.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fl_app.metrics import read_metrics
from tests.integration.conftest import run_hydra
from tests.integration.test_first_screen import first_screen_problems

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_distributed_dp_fedsam_runs_from_hydra(short_tmp: Path, shared_ray: str) -> None:
    proc = run_hydra(
        short_tmp,
        [
            "privacy=distributed",
            "strategy=dp_fedsam",
            "num_rounds=2",
            "dataset.num_clients=6",
            "privacy.sample_rate=0.5",
            "dataset.max_train_samples=1200",
            "dataset.max_test_samples=1000",
            shared_ray,
        ],
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert first_screen_problems(proc.stdout + proc.stderr) == [], proc.stdout + proc.stderr
    meta = json.loads((short_tmp / "out" / "run.json").read_text())
    assert meta["status"] == "completed" and meta["strategy"] == "DPFedSAM" and meta["placement"] == "distributed"
    assert 0 < meta["epsilon"] < meta["server_epsilon"]
    assert "against the server" in meta["dp_guarantee"]
    records = read_metrics(short_tmp / "out" / "metrics.jsonl")
    assert [r["round"] for r in records] == [1, 2]
    assert "Population: 6 clients on 6 SuperNodes" in proc.stdout + proc.stderr
