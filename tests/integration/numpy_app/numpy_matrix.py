"""A Flower app of NumPyClients, as a Flower 1.42 user writes one, served by ``flwr run`` from this directory.

The ClientApp is Flower's ``ClientApp(client_fn=..., mods=[numpy_client_mod])``; its ``client_fn`` gives even
partitions a user's own plain NumPyClient (:class:`PlainClient`: our CNN trained with plain SGD, Flower's
``state_dict`` idioms, its own ``evaluate``) and odd partitions our SAM NumPyClient
(:class:`clients.numpy_client.InstructedNumPyClient`), so that one run puts both under one server. The ServerApp runs,
as the run-config's ``server`` says, our DP-FedSAM (``run_federated``, what the project's own ServerApp runs) or
``ClientLevelDP(FedAdam)`` from ``ArrayRecord(model.state_dict())`` with Flower's defaults (``fraction_evaluate=1.0``).
Every fit appends what it was (client kind, partition, round, how many partitions its message named) to
``<out>/fits.jsonl``; the ClientLevelDP run writes what its strategy saw to ``<out>/result.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MessageType
from flwr.client import Client, NumPyClient
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAdam

from apps.server_app import run_federated
from clients.local_update import client_data
from clients.numpy_client import InstructedNumPyClient, numpy_client_mod, train_config
from fl_app.config import compose_config
from fl_app.instructions import DataSpec
from fl_app.models import build_model_for_dataset
from strategies import DPOverFlowerMean
from strategies.flower_dp import UNIT_WEIGHT

ROUNDS = 2
#: Our DP-FedSAM over 8 clients on 2 SuperNodes: m = 4 a round, one cohort message of 2 clients per SuperNode.
DP_FEDSAM = [
    "strategy=dp_fedsam",
    f"num_rounds={ROUNDS}",
    "dataset.num_clients=8",
    "dataset.max_train_samples=400",
    "dataset.max_test_samples=200",
    "privacy.sample_rate=0.5",
    "privacy.sampling=fixed",
    "checkpoint_every=0",
]
#: What the SAM client trains under ClientLevelDP: one client per SuperNode.
CLIENT_LEVEL_DP = ["dataset.num_clients=2", "dataset.max_train_samples=400"]
FITS = "fits.jsonl"


def _record_fit(out: str, **fields: Any) -> None:
    with (Path(out) / FITS).open("a") as log:
        log.write(json.dumps(fields) + "\n")


class PlainClient(NumPyClient):
    """A user's NumPyClient: the CNN, its node's partition (``partition-id`` of ``num-partitions``, the first 400
    training images split evenly), plain SGD, arrays in and out in ``state_dict`` order."""

    def __init__(self, context: Context) -> None:
        self.partition = int(context.node_config["partition-id"])
        spec = DataSpec(
            dataset="fashion_mnist", data_dir="", download=False, partition="iid", alpha=0.0,
            num_clients=int(context.node_config["num-partitions"]), partition_seed=0, max_train_samples=400,
        )  # fmt: skip
        self.x, self.y = client_data(spec, self.partition)
        self.model = build_model_for_dataset("cnn", "fashion_mnist", seed=0)
        self.out = str(context.run_config["out"])

    def _load(self, parameters: list[np.ndarray]) -> None:
        keys = self.model.state_dict().keys()
        self.model.load_state_dict({k: torch.from_numpy(np.copy(v)) for k, v in zip(keys, parameters, strict=True)})

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict]:
        self._load(parameters)
        optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        for start in range(0, len(self.y), 32):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(self.model(self.x[start : start + 32]), self.y[start : start + 32])
            loss.backward()
            optimizer.step()
        _record_fit(self.out, kind="plain", partition=self.partition)
        return [v.detach().numpy() for v in self.model.state_dict().values()], len(self.y), {"train_loss": float(loss)}

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[float, int, dict]:
        self._load(parameters)
        with torch.no_grad():
            logits = self.model(self.x)
        accuracy = float((logits.argmax(dim=1) == self.y).float().mean())
        return float(torch.nn.functional.cross_entropy(logits, self.y)), len(self.y), {"accuracy": accuracy}


class RecordedSamClient(InstructedNumPyClient):
    """Our SAM NumPyClient, unchanged but for the record of each fit."""

    def __init__(self, context: Context) -> None:
        super().__init__(int(context.node_config["partition-id"]), context.state)
        self.out = str(context.run_config["out"])

    def fit(self, parameters: list[np.ndarray], config: Any) -> tuple[list[np.ndarray], int, Any]:
        result = super().fit(parameters, config)
        _record_fit(self.out, kind="sam", partition=self.partition_id, optimizer=config["training.optimizer"])
        return result


def client_fn(context: Context) -> Client:
    even = int(context.node_config["partition-id"]) % 2 == 0
    return (PlainClient(context) if even else RecordedSamClient(context)).to_client()


def message_log(msg: Message, context: Context, call_next: Any) -> Message:
    """How many partitions each train message named (a cohort message names several)."""
    if msg.metadata.message_type == MessageType.TRAIN:
        named = msg.content["config"].get("partition_ids", [None])
        with (Path(str(context.run_config["out"])) / "messages.jsonl").open("a") as log:
            log.write(json.dumps({"partitions": len(named)}) + "\n")  # type: ignore[arg-type]
    return call_next(msg, context)


client_app = ClientApp(client_fn=client_fn, mods=[message_log, numpy_client_mod])


class Observed(DPOverFlowerMean):
    """Keeps every round's reply counts (``last_round_counts`` holds the last one only)."""

    counts: ClassVar[list[dict[str, Any]]] = []

    def aggregate_train(self, server_round: int, replies: Any) -> Any:
        released = super().aggregate_train(server_round, replies)
        self.counts.append(dict(self.last_round_counts or {}))
        return released


def client_level_dp_fedadam(grid: Grid, out: Path) -> None:
    """A user's ServerApp: ``ClientLevelDP(FedAdam)`` from the CNN's ``state_dict``, Flower's ``start``."""
    # Flower's default eta = 0.1 moves every weight by about 0.1 a round under Adam's normalisation of the noise: a
    # CNN diverges in two rounds. Reddi et al.'s tuned values for a small CNN are closer to these.
    inner = FedAdam(eta=1e-2, tau=1e-3, weighted_by_key=UNIT_WEIGHT, min_available_nodes=2, min_train_nodes=2,
                    min_evaluate_nodes=2)  # fmt: skip
    strategy = Observed(inner, num_clients=2, sample_rate=1.0, clip_norm=1.0, noise_multiplier=0.5, delta=1e-3,
                        secure=False)  # fmt: skip
    model = build_model_for_dataset("cnn", "fashion_mnist", seed=0)
    config = train_config(compose_config(CLIENT_LEVEL_DP))  # what our SAM client trains; the plain one ignores it
    result = strategy.start(grid, ArrayRecord(model.state_dict()), num_rounds=ROUNDS, train_config=config)
    evaluated = {str(r): dict(m) for r, m in result.evaluate_metrics_clientapp.items()}
    (out / "result.json").write_text(json.dumps({
        "state_dict_keys": list(model.state_dict()),
        "released_keys": list(result.arrays.keys()),
        "counts": strategy.counts,
        "rounds_released": strategy.rounds_released,
        "epsilon": strategy.epsilon(),
        "evaluated": evaluated,
    }))  # fmt: skip


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    out = Path(str(context.run_config["out"]))
    out.mkdir(parents=True, exist_ok=True)
    if context.run_config["server"] == "dp_fedsam":
        run_federated(grid, compose_config(DP_FEDSAM), out, progress=False)
    else:
        client_level_dp_fedadam(grid, out)
