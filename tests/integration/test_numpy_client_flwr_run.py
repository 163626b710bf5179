"""NumPyClients under ``flwr run``, as a Flower 1.42 user runs them: the Flower app in tests/integration/numpy_app/
(a user's plain NumPyClient on even partitions, our SAM NumPyClient on odd ones, both behind Flower's
``ClientApp(client_fn=..., mods=[numpy_client_mod])``), served by a real ``flower-superlink --simulation`` (Ray, two
SuperNodes, every message through Flower's wire format), under each of two servers:

* our DP-FedSAM (the project's ``run_federated``) with the default ``simulation.cohort_size=auto``: one cohort message
  of two clients per SuperNode, each client called once and its model screened and clipped apart
  (fl_app/partition_models.py); every sampled client aggregated, none failed or rejected;
* ``ClientLevelDP(FedAdam)`` from ``ArrayRecord(model.state_dict())`` with Flower's default ``fraction_evaluate=1.0``:
  every reply accepted, the model released under its ``state_dict`` keys (before: every reply rejected as ``shape``),
  both nodes' own ``evaluate`` aggregated every round (before: ``KeyError: 'evaluateins.parameters'``); our SAM
  client trains with SAM from ``clients.numpy_client.train_config``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.processes import ROOT
from fl_app.metrics import read_metrics
from tests.integration.conftest import flwr_run_app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

APP = ROOT / "tests" / "integration" / "numpy_app"
ROUNDS = 2


def _flwr_run(superlink: tuple[str, dict[str, str], Path], server: str) -> tuple[Path, str]:
    """The run's output directory and what ``flwr run --stream`` printed."""
    out = superlink[2] / server
    resources = "num-supernodes=2 client-resources-num-cpus=1"
    proc = flwr_run_app(superlink, APP, f"server='{server}' out='{out}'", resources)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout[-5000:] + proc.stderr[-3000:]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_users_numpy_client_and_ours_under_dp_fedsam(shared_superlink: tuple[str, dict[str, str], Path]) -> None:
    out, printed = _flwr_run(shared_superlink, "dp_fedsam")
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "completed" and run["rounds_completed"] == ROUNDS, printed
    records = read_metrics(out / "metrics.jsonl")
    assert len(records) == ROUNDS
    for record in records:
        assert record["sampled"] == record["received"] == record["aggregated"] == 4
        assert record["failed"] == record["rejected_malformed"] == record["rejected_shape"] == 0
        assert record["rejected_nonfinite"] == 0
        assert math.isfinite(record["test_loss"]) and record["epsilon"] > 0
    # Every train message a cohort of two (one a SuperNode a round), each client of it called once.
    assert [m["partitions"] for m in _lines(out / "messages.jsonl")] == [2] * 2 * ROUNDS
    fits = _lines(out / "fits.jsonl")
    assert len(fits) == 4 * ROUNDS
    assert {f["kind"] for f in fits} == {"plain", "sam"}  # both clients trained under the one server
    assert all(f["partition"] % 2 == (f["kind"] == "sam") for f in fits)
    assert all(f["optimizer"] == "sam" for f in fits if f["kind"] == "sam")


def test_a_users_numpy_client_and_ours_under_client_level_dp_fedadam(
    shared_superlink: tuple[str, dict[str, str], Path],
) -> None:
    out, printed = _flwr_run(shared_superlink, "client_level_dp_fedadam")
    result = json.loads((out / "result.json").read_text())
    assert [(c["sampled"], c["accepted"]) for c in result["counts"]] == [(2, 2)] * ROUNDS, printed
    assert all(sum(c["rejected"].values()) == 0 for c in result["counts"])
    assert result["released_keys"] == result["state_dict_keys"]
    assert result["rounds_released"] == ROUNDS and 0 < result["epsilon"] < math.inf
    assert sorted(result["evaluated"]) == [str(r) for r in range(1, ROUNDS + 1)]
    for metrics in result["evaluated"].values():
        assert {"loss", "accuracy"} <= set(metrics) and math.isfinite(metrics["loss"])
        assert 0.0 <= metrics["accuracy"] <= 1.0
    fits = _lines(out / "fits.jsonl")
    assert sorted((f["kind"], f["partition"]) for f in fits) == sorted([("plain", 0), ("sam", 1)] * ROUNDS)
    assert all(f["optimizer"] == "sam" for f in fits if f["kind"] == "sam")
