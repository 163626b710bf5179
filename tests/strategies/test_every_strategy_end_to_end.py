"""Every algorithm end to end without Ray: the ServerApp's ``run_federated`` (strategy, ledger, release log,
run.json, metrics) against the real ClientApp handler, every message and reply through Flower's wire format
(:class:`tests.helpers.InProcessGrid`), 2 rounds on a small Fashion-MNIST subset, cohort mode as in simulation.

Flower's Ray engine itself runs in tests/integration (DP-FedSAM, DP-FedAvg, FedAvg, adaptive clipping, audits,
cohorts, faults, deployments); the same sweep of every strategy under Ray is tests/integration/test_algorithms.py
(slow: this file covers each strategy's pipeline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.server_app import run_federated
from fl_app.config import CONF_DIR, compose_config
from fl_app.metrics import read_metrics
from tests.helpers import InProcessGrid, assert_two_round_run
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

STRATEGIES = sorted(p.stem for p in (Path(CONF_DIR) / "strategy").glob("*.yaml"))
SMALL = [
    "num_rounds=2",
    "dataset.num_clients=50",
    "dataset.max_train_samples=1200",  # 24 images a client
    "dataset.max_test_samples=500",
    "privacy.sample_rate=0.2",
]


def test_there_are_fourteen_strategies() -> None:
    assert len(STRATEGIES) == 14


@pytest.mark.parametrize("name", STRATEGIES)
def test_every_strategy_runs_two_rounds_and_states_its_guarantee(tmp_path: Path, name: str) -> None:
    grid = InProcessGrid(nodes=2)
    run_federated(grid, compose_config([f"strategy={name}", *SMALL]), tmp_path, progress=False)
    assert grid.sent == [2, 2]  # one cohort message per node and round (simulation, cohort_size=auto)
    assert json.loads((tmp_path / "run.json").read_text())["rounds_completed"] == 2
    assert_two_round_run(tmp_path, name)


def test_non_private_fedavg_beats_chance_by_a_wide_margin(tmp_path: Path) -> None:
    overrides = [
        "strategy=fedavg",
        "num_rounds=3",
        "client.local_epochs=3",
        "dataset.num_clients=50",
        "dataset.max_train_samples=6000",
        "dataset.max_test_samples=2000",
        "privacy.sample_rate=0.2",
    ]
    run_federated(InProcessGrid(nodes=2), compose_config(overrides), tmp_path, progress=False)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert records[-1]["test_accuracy"] > 0.55  # 10 classes: chance is 0.1
    assert records[-1]["epsilon"] is None
    assert json.loads((tmp_path / "run.json").read_text())["dp_guarantee"].startswith("none")
