"""Issue 40 (2a, 3, and the NumPyClient on Flower's engine): NumPyClients behind clients/numpy_client.py's mod on
Flower's simulation engine (``flwr.simulation.run_simulation``: Ray, a ClientApp per virtual SuperNode, every
message through Flower's wire format), as a Flower 1.42 user runs them; two SuperNodes, two rounds, small data.

* ``ClientLevelDP(FedAdam)`` with a user's own plain NumPyClient (a torch model, Flower's ``state_dict`` idioms, its
  own ``fit`` and ``evaluate``), from ``ArrayRecord(model.state_dict())``, with Flower's default
  ``fraction_evaluate=1.0``: every reply accepted, the model released under its ``state_dict`` keys, the nodes'
  evaluation aggregated every round.
* our SAM NumPyClient (``clients.numpy_client:app``'s client and mod) under DP-FedSAM through the ServerApp's
  ``run_federated`` (what ``flwr run`` runs) with the default ``simulation.cohort_size=auto``: one cohort message per
  SuperNode, answered with one model per partition (fl_app/partition_models.py) that the server clips one by one;
  every sampled client aggregated, none failed or rejected.

Each run is a subprocess (its own Ray, Flower home and temp dirs: tests/integration/conftest.py); the functions it
runs are this module's :func:`client_level_dp_run` and :func:`dp_fedsam_run`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, MessageType
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from bench.processes import ROOT, run_env
from fl_app.metrics import read_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

#: What each run gives Flower's engine: one CPU a client, its own local Ray.
BACKEND: dict[str, Any] = {
    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    "init_args": {"address": "local", "include_dashboard": False, "logging_level": "ERROR"},
}
ROUNDS = 2


# ----- a Flower user's own NumPyClient ------------------------------------------------------------------------------


def user_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))


def user_data(partition_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The node's own synthetic examples: 32 of 16 features, 3 classes."""
    rng = np.random.default_rng(partition_id)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


class UserClient(NumPyClient):
    """A user's NumPyClient as Flower's examples write one: arrays in and out in ``state_dict`` order."""

    def __init__(self, partition_id: int) -> None:
        self.model = user_model()
        self.x, self.y = user_data(partition_id)

    def _load(self, parameters: list[np.ndarray]) -> None:
        keys = self.model.state_dict().keys()
        self.model.load_state_dict({k: torch.from_numpy(np.copy(v)) for k, v in zip(keys, parameters, strict=True)})

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict]:
        self._load(parameters)
        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.5)
        for _ in range(5):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
            loss.backward()
            optimizer.step()
        weights = [v.detach().numpy() for v in self.model.state_dict().values()]
        return weights, len(self.y), {"train_loss": float(loss)}

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[float, int, dict]:
        self._load(parameters)
        with torch.no_grad():
            logits = self.model(self.x)
        accuracy = float((logits.argmax(dim=1) == self.y).float().mean())
        return float(torch.nn.functional.cross_entropy(logits, self.y)), len(self.y), {"accuracy": accuracy}


def user_client_fn(context: Context) -> Client:
    return UserClient(int(context.node_config["partition-id"])).to_client()


def client_level_dp_run(out: str) -> None:
    """The user's ServerApp: ``ClientLevelDP(FedAdam)`` from ``ArrayRecord(model.state_dict())``, Flower's ``start``
    (train and evaluate every round); what it saw goes to ``out`` (JSON)."""
    from flwr.serverapp.strategy import FedAdam
    from flwr.simulation import run_simulation

    from clients.numpy_client import numpy_client_mod
    from strategies.flower_dp import UNIT_WEIGHT, ClientLevelDP

    class Observed(ClientLevelDP):
        """Keeps every round's reply counts (``last_round_counts`` holds the last one only)."""

        counts: ClassVar[list[dict[str, Any]]] = []

        def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
            released = super().aggregate_train(server_round, replies)
            self.counts.append(dict(self.last_round_counts or {}))
            return released

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        inner = FedAdam(weighted_by_key=UNIT_WEIGHT, min_available_nodes=2, min_train_nodes=2, min_evaluate_nodes=2)
        strategy = Observed(inner, num_clients=2, sample_rate=1.0, clip_norm=1.0, noise_multiplier=0.5, delta=1e-3,
                            secure=False)  # fmt: skip
        model = user_model()
        result = strategy.start(grid, ArrayRecord(model.state_dict()), num_rounds=ROUNDS)
        evaluated = {str(r): dict(m) for r, m in result.evaluate_metrics_clientapp.items()}
        Path(out).write_text(json.dumps({
            "state_dict_keys": list(model.state_dict()),
            "released_keys": list(result.arrays.keys()),
            "counts": strategy.counts,
            "rounds_released": strategy.rounds_released,
            "epsilon": strategy.epsilon(),
            "evaluated": evaluated,
        }))  # fmt: skip

    client_app = ClientApp(client_fn=user_client_fn, mods=[numpy_client_mod])
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=2, backend_config=BACKEND)


# ----- our SAM NumPyClient under DP-FedSAM --------------------------------------------------------------------------

DP_FEDSAM = [
    "strategy=dp_fedsam",
    f"num_rounds={ROUNDS}",
    "dataset.num_clients=10",
    "dataset.max_train_samples=600",
    "dataset.max_test_samples=200",
    "privacy.sample_rate=0.4",  # m = 4
    "privacy.sampling=fixed",
    "checkpoint_every=0",  # simulation.cohort_size=auto: a cohort message of 2 clients per SuperNode
]
#: Where each node writes what it saw of every train message (JSON lines: :func:`logged_mod`).
TRAIN_LOG = "train_messages.jsonl"


def logged_mod(out: str) -> Any:
    """A mod that appends, for every train message, how many partitions it named and the records of its reply to
    ``out``/:data:`TRAIN_LOG` (the nodes are other processes: the log is how the test sees cohort messages)."""

    def mod(msg: Message, context: Context, call_next: Any) -> Message:
        reply = call_next(msg, context)
        if msg.metadata.message_type == MessageType.TRAIN:
            seen = {"partitions": len(msg.content["config"]["partition_ids"]), "records": sorted(reply.content.keys())}
            with (Path(out) / TRAIN_LOG).open("a") as log:
                log.write(json.dumps(seen) + "\n")
        return reply

    return mod


def dp_fedsam_run(out: str) -> None:
    """Our ServerApp's ``run_federated`` (DP-FedSAM) against ``clients.numpy_client:app``, writing into ``out``."""
    from flwr.simulation import run_simulation

    from apps.server_app import make_server_app
    from clients.numpy_client import client_fn, numpy_client_mod
    from fl_app.config import compose_config

    server_app = make_server_app(compose_config(DP_FEDSAM), Path(out), progress=False)
    Path(out).mkdir(parents=True, exist_ok=True)
    client_app = ClientApp(client_fn=client_fn, mods=[logged_mod(out), numpy_client_mod])
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=2, backend_config=BACKEND)


def _run(tmp: Path, function: str, out: Path) -> None:
    code = f"import sys; from tests.integration.test_numpy_client_flwr_run import {function}; {function}(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, env=run_env(tmp), capture_output=True,
                          text=True, timeout=500)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_client_level_dp_fedadam_with_a_users_numpy_client_on_flowers_engine(short_tmp: Path) -> None:
    out = short_tmp / "result.json"
    _run(short_tmp, "client_level_dp_run", out)
    result = json.loads(out.read_text())
    # Every reply, both rounds, accepted: the trained arrays came back under the state_dict's keys (before: every one
    # rejected as "shape").
    assert [(c["sampled"], c["accepted"]) for c in result["counts"]] == [(2, 2)] * ROUNDS
    assert all(sum(c["rejected"].values()) == 0 for c in result["counts"])
    assert result["released_keys"] == result["state_dict_keys"]
    assert result["rounds_released"] == ROUNDS and 0 < result["epsilon"] < math.inf
    # Every round evaluated by both nodes' own evaluate (before: KeyError 'evaluateins.parameters' on each).
    assert sorted(result["evaluated"]) == [str(r) for r in range(1, ROUNDS + 1)]
    for metrics in result["evaluated"].values():
        assert {"loss", "accuracy"} <= set(metrics) and math.isfinite(metrics["loss"])
        assert 0.0 <= metrics["accuracy"] <= 1.0


def test_our_sam_numpy_client_under_dp_fedsam_on_flowers_engine(short_tmp: Path) -> None:
    out = short_tmp / "out"
    _run(short_tmp, "dp_fedsam_run", out)
    records = read_metrics(out / "metrics.jsonl")
    assert len(records) == ROUNDS
    for record in records:
        assert record["sampled"] == record["received"] == record["aggregated"] == 4
        assert record["failed"] == record["rejected_malformed"] == record["rejected_shape"] == 0
        assert record["rejected_nonfinite"] == 0
        assert math.isfinite(record["test_loss"]) and record["epsilon"] > 0
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "completed" and run["rounds_completed"] == ROUNDS
    # Every train message was a cohort (one a SuperNode a round), answered with each partition's model apart.
    seen = [json.loads(line) for line in (out / TRAIN_LOG).read_text().splitlines()]
    assert [s["partitions"] for s in seen] == [2] * 2 * ROUNDS
    assert all("partition_models" in s["records"] and len(s["records"]) == 1 + 2 * 2 for s in seen)
