"""A user's own client mechanism in a Flower app of their own, as docs/architecture.md's recipe for a mechanism has
it: the mechanism and its recipe registered in the module that defines the app's ClientApp handlers. The simulation
engine loads the ClientApp once and sends it to its Ray workers pickled, its handlers by reference to the module
that defines them: handlers of this module make every worker import it, and so the registration (re-exporting the
project's ``apps.client_app.app`` would not: its handlers are ``apps.client_app``'s, and a worker would import that
module alone). The ``serverapp``, here too, runs the rounds.

:class:`Halve` halves each client's clipped update and the server doubles the average back: exact in binary floating
point, so without noise ``ClientLevelDP(HalvedFedAvg(config))`` releases DP-FedAvg's model bit for bit, and only if
every client ran the halving (a client that skipped it would send twice its share; one that did not know the recipe
would fail its reply). The ServerApp runs both on the same grid and writes both models to ``<out>/models.npz`` and
what each run counted to ``<out>/result.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

import apps.client_app
from fl_app.config import compose_config
from fl_app.instructions import RecipeSpec
from fl_app.models import build_model_for_dataset, get_weights
from fl_app.privacy.pipeline import ClientStep, Clip, GaussianNoise, Mechanism, ServerStep, register_recipe
from strategies import ClientLevelDP, DPFedAvg, FederatedAveraging
from strategies.rounds import RoundOutcome

ROUNDS = 2
#: 8 clients on 2 SuperNodes, m = 4 a round, no noise (the halving is checked bit for bit).
CONFIG = [
    "strategy=dp_fedavg",
    f"num_rounds={ROUNDS}",
    "dataset.num_clients=8",
    "dataset.max_train_samples=400",
    "dataset.max_test_samples=200",
    "privacy.sample_rate=0.5",
    "privacy.sampling=fixed",
    "privacy.noise_multiplier=0",
]


@dataclass(frozen=True)
class Halve(Mechanism):
    """Each client sends half its clipped update; the server doubles the average back."""

    def client_step(self, update: list[np.ndarray], step: ClientStep) -> list[np.ndarray]:
        return [u * np.float32(0.5) for u in update]

    def server_step(self, average: list[np.ndarray], step: ServerStep) -> list[np.ndarray]:
        return [a * 2.0 for a in average]


register_recipe("halved", lambda p: (Clip(), Halve(), GaussianNoise()))


class HalvedFedAvg(FederatedAveraging):
    """FedAvg whose clients run the ``halved`` recipe."""

    def client_recipe(self) -> RecipeSpec:
        return RecipeSpec(kind="halved")


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """The project's train handler, called from a handler of this module (so a worker imports the registration)."""
    return apps.client_app.train(msg, context)


@client_app.query()
def query(msg: Message, context: Context) -> Message:
    return apps.client_app.query(msg, context)


class AggregatedCounts:
    """A round observer: how many clients each round aggregated."""

    def __init__(self) -> None:
        self.aggregated: list[int] = []

    def round_completed(self, strategy: object, server_round: int, outcome: RoundOutcome, record: dict) -> None:
        self.aggregated.append(int(outcome.stats["aggregated"]))


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    out = Path(str(context.run_config["out"]))
    out.mkdir(parents=True, exist_ok=True)
    config = compose_config(CONFIG)
    initial = ArrayRecord(get_weights(build_model_for_dataset("cnn", "fashion_mnist", seed=config.seed)))
    counts = {"halved": AggregatedCounts(), "dp_fedavg": AggregatedCounts()}
    halved = ClientLevelDP(HalvedFedAvg(config, observers=[counts["halved"]]))
    halved_result = halved.start(grid, initial, num_rounds=ROUNDS)
    plain = DPFedAvg(config, observers=[counts["dp_fedavg"]])
    plain_result = plain.start(grid, initial, num_rounds=ROUNDS)
    models = {"initial": initial, "halved": halved_result.arrays, "dp_fedavg": plain_result.arrays}
    np.savez(out / "models.npz", **{f"{name}_{i}": w for name, arrays in models.items()
                                    for i, w in enumerate(arrays.to_numpy_ndarrays())})  # fmt: skip
    (out / "result.json").write_text(json.dumps({
        name: {"rounds_released": strategy.rounds_released, "aggregated": counts[name].aggregated}
        for name, strategy in (("halved", halved), ("dp_fedavg", plain))
    }))  # fmt: skip
