"""A Flower user's own ServerApp, written here, builds ``DPFedAvg`` with keyword arguments and runs it
with Flower's ``strategy.start(grid, initial_arrays, num_rounds=..., evaluate_fn=...)``, against our ClientApp on
Flower's simulation engine, exactly as they would run Flower's ``FedAvg``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.processes import ROOT, run_env
from fl_app.privacy.accountants import compute_epsilon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SERVER_APP = """
import json, sys
import numpy as np
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from apps.client_app import app as client_app
from fl_app.models import build_model_for_dataset, get_weights
from strategies.dp_fedavg import DPFedAvg

OUT = sys.argv[1]
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    strategy = DPFedAvg(num_clients=20, sample_rate=0.5, clip_norm=0.5, noise_multiplier=1.0,
                        max_train_samples=600, max_test_samples=200, local_epochs=1)
    initial = get_weights(build_model_for_dataset("cnn", "fashion_mnist", seed=0))
    rounds_seen = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        rounds_seen.append(server_round)
        weights = arrays.to_numpy_ndarrays()
        return MetricRecord({"norm": float(sum(np.square(w.astype(np.float64)).sum() for w in weights))})

    result = strategy.start(grid, ArrayRecord(initial), num_rounds=2, evaluate_fn=evaluate_fn)
    final = result.arrays.to_numpy_ndarrays()
    with open(OUT, "w") as fh:
        json.dump({
            "epsilon": strategy.epsilon(),
            "rounds_seen": rounds_seen,
            "evaluated": sorted(result.evaluate_metrics_serverapp),
            "train_metrics_rounds": sorted(result.train_metrics_clientapp),
            "moved": max(float(np.abs(a - b).max()) for a, b in zip(final, initial)),
            "noise_source": strategy.dp_guarantee()["noise_source"],
        }, fh)


run_simulation(server_app=app, client_app=client_app, num_supernodes=2, backend_config={
    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    "init_args": {"address": "local", "include_dashboard": False, "logging_level": "ERROR"},
})
"""


def test_dp_fedavg_runs_in_a_users_own_server_app(short_tmp: Path) -> None:
    script, out = short_tmp / "my_server_app.py", short_tmp / "result.json"
    script.write_text(textwrap.dedent(SERVER_APP))
    proc = subprocess.run([sys.executable, str(script), str(out)], cwd=ROOT, env=run_env(short_tmp),
                          capture_output=True, text=True, timeout=500)  # fmt: skip
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["rounds_seen"] == [0, 1, 2] and result["evaluated"] == [0, 1, 2]
    assert result["train_metrics_rounds"] == [1, 2]  # simulation: raw client statistics
    assert result["moved"] > 0
    assert result["epsilon"] == pytest.approx(compute_epsilon(1.0, 0.5, 2, 1 / 20), rel=1e-9)
    assert result["noise_source"].startswith("seeded")  # resolved from Flower's simulation grid
