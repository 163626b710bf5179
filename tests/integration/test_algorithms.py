"""Every algorithm runs 2 rounds under a real Flower simulation (one Hydra --multirun process per group).

Slow: each strategy's whole pipeline — the ServerApp's run_federated, the real ClientApp handler, every message
through Flower's wire format — runs in the default suite without Ray (tests/strategies/
test_every_strategy_end_to_end.py, 35 s for all eleven), and Flower's Ray engine runs DP-FedSAM, DP-FedAvg,
adaptive clipping, audits, cohorts and faults in the other integration tests. This sweep (140 s) adds only the
engine under the other eight strategies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.processes import ROOT, run_env
from tests.helpers import assert_two_round_run
from tests.integration.conftest import SMALL

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

STRATEGIES = sorted(p.stem for p in (ROOT / "conf" / "strategy").glob("*.yaml"))
#: Run under Ray by other default-suite tests (test_simulation.py: dp_fedsam; test_audit.py: dp_fedavg).
RUN_ELSEWHERE = ("dp_fedavg", "dp_fedsam", "fedavg")


def _sweep(tmp: Path, strategies: list[str]) -> dict[str, Path]:
    cmd = [
        sys.executable,
        "-m",
        "apps.main",
        "--multirun",
        f"strategy={','.join(strategies)}",
        "num_rounds=2",
        *SMALL,
        # Smaller than SMALL (24 images a client, 500 test images): nothing here depends on accuracy, and the
        # sweep's eight jobs train one after another.
        "dataset.max_train_samples=1200",
        "dataset.max_test_samples=500",
        f"hydra.sweep.dir={tmp / 'sweep'}",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=run_env(tmp), capture_output=True, text=True, timeout=1100)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    runs = {}
    for job in sorted((tmp / "sweep").iterdir()):
        if (job / "run.json").exists():
            runs[json.loads((job / "run.json").read_text())["config"]["strategy"]["name"]] = job
    return runs


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _sweep(tmp_path_factory.mktemp("algorithms"), [s for s in STRATEGIES if s not in RUN_ELSEWHERE])


@pytest.fixture(scope="module")
def sweep_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _sweep(tmp_path_factory.mktemp("algorithms_elsewhere"), list(RUN_ELSEWHERE))


@pytest.mark.slow
@pytest.mark.parametrize("name", [s for s in STRATEGIES if s not in RUN_ELSEWHERE])
def test_algorithm_runs_two_rounds_and_states_its_guarantee(sweep: dict[str, Path], name: str) -> None:
    assert_two_round_run(sweep[name], name)


@pytest.mark.slow
@pytest.mark.parametrize("name", RUN_ELSEWHERE)
def test_algorithms_run_elsewhere_also_run_two_rounds_here(sweep_elsewhere: dict[str, Path], name: str) -> None:
    assert_two_round_run(sweep_elsewhere[name], name)
