"""Flower ``NumPyClient`` under our strategies and Flower's: :class:`InstructedNumPyClient`, our client (the
server's instructions, SAM/ASAM/SGD, the client's mechanisms) as one, and :data:`app`, it behind Flower's
``ClientApp(client_fn=...)`` with :func:`~clients.numpy_mod.numpy_client_mod`.

**The mod** (clients/numpy_mod.py, re-exported here) lets any NumPyClient answer Message-API messages: Flower's
legacy handler reads ``fitins.*`` / ``evaluateins.*`` records, which no Message-API strategy sends, so the mod hands
it the message's ``arrays`` and ``config`` under those names and turns the ``FitRes`` / ``EvaluateRes`` back into
Flower's Message-API reply: the trained model with the message's array keys in order (``ArrayRecord(
model.state_dict())`` comes back under its ``state_dict`` keys, which ``ClientLevelDP`` and Flower's strategies
require) and ``num-examples`` with the metrics; for an evaluate message, one MetricRecord with ``loss``,
``num-examples`` and the metrics (what ``FedAvg.aggregate_evaluate`` averages). Our server screens the train reply
as any Flower ClientApp's (strategies/screening.py: Δ = trained − global computed by the server and, under server
placement, re-clipped to C); ``strategies.flower_dp.ClientLevelDP`` does the same around Flower's FedAvg family.

**Use.** ``app = ClientApp(client_fn=client_fn, mods=[numpy_client_mod])`` with any ``client_fn(context)`` that
returns ``SomeNumPyClient(...).to_client()`` for ``context.node_config["partition-id"]`` (set per message to the
partition our strategies sampled under ``population=virtual``; the node's own otherwise). A message carrying a
cohort (the default ``simulation.cohort_size=auto`` in simulation: one cohort per worker) calls the client once per
partition it names and answers each partition's model apart, which the server screens and clips one by one
(clients/numpy_mod.py, fl_app/partition_models.py). This module's
:data:`app` is that line with :func:`client_fn`, our client; ``flwr run`` serves it when ``[tool.flwr.app.components]``
names ``clients.numpy_client:app`` as the ``clientapp``. Under a strategy that sends no instructions of its own
(``ClientLevelDP`` around Flower's ``FedAdam``), :func:`train_config` is the ``train_config`` that has our client train
with SAM. tests/integration/test_numpy_client_flwr_run.py runs our client and a user's plain one under ``flwr run``,
each under DP-FedSAM and under ``ClientLevelDP(FedAdam)``.

**Our client as a NumPyClient.** :class:`InstructedNumPyClient.fit` reads the round's
:class:`~fl_app.instructions.TrainInstructions` from its config and trains its partition as a cohort of one through
:func:`clients.cohort.train_cohort`, the function our ClientApp calls: the same local SAM/ASAM/SGD, clip, client noise
(client placement), masks, fault injection and worker re-clip, no step written twice. It returns the trained model
global + update in the model's dtype (float32), as any NumPyClient does, so the server's Δ = trained − global is our
ClientApp's update up to that one rounding: each coordinate within half a float32 ulp of the trained weight
(tests/clients/test_numpy_client.py checks the trained model bit for bit against our ClientApp's update). A client
the cohort path rejects (diverged, non-finite, failed) raises: ``fit`` has no other way to say so, and the server
counts it as failed. Under client placement the update carries the client's noise exactly as our ClientApp's does,
but the server refuses every Flower-convention reply there: nothing in the convention says that noise was added
(run client placement with apps.client_app, whose reply format the server trusts to carry it).

:meth:`InstructedNumPyClient.evaluate` is Flower's client-side evaluation: the loss and accuracy of the global model
on the client's own partition (its training examples: the data loaders keep no per-client held-out split, and the
test split is the server's central evaluation set: docs/running.md), of the data and model the instructions name (those
in the evaluate config, else those of the node's last fit, kept in the node's state). Its numbers come from the client's
private data unnoised: like every client-reported evaluation metric, they are outside ε (our strategies send no evaluate
messages; ``ClientLevelDP`` forwards its inner strategy's evaluation and says the same). """

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.client import Client, ClientApp, NumPyClient

from clients.cohort import train_cohort
from clients.local_update import _model, client_data
from clients.numpy_mod import numpy_client_mod, pack_mask, unpack_mask
from fl_app.allocator import freeze_imported_objects, keep_freed_memory
from fl_app.config import AppConfig
from fl_app.core.choices import LocalOptimizer
from fl_app.instructions import (
    DataSpec,
    RecipeSpec,
    TrainInstructions,
    local_training_config,
    make_train_instructions,
    resolve_cohort_engine,
)
from fl_app.models import build_model_for_dataset, evaluate, get_weights, resolve_device, set_weights
from fl_app.threads import limit_library_threads

__all__ = [
    "ClientRejectedError",
    "InstructedNumPyClient",
    "app",
    "client_fn",
    "numpy_client_mod",
    "pack_mask",
    "train_config",
    "unpack_mask",
]

Config = dict[str, bool | bytes | float | int | str]

#: The instructions' keys that say what to evaluate: the data, the model, the device.
EVALUATION_KEYS = ("model", "device", *(f"data.{f.name}" for f in fields(DataSpec)))
#: Where the node's state keeps them from its last fit.
KEPT_INSTRUCTIONS = "numpy_client.evaluation"
#: The round number Flower's strategies add to every train config (``FedAvg.configure_train``).
FLOWER_ROUND_KEY = "server-round"


def train_config(config: AppConfig, optimizer: LocalOptimizer = "sam") -> ConfigRecord:
    """The ``train_config`` that has :class:`InstructedNumPyClient` train under a strategy that sends no instructions
    of its own (Flower's ``FedAvg`` family, ``ClientLevelDP`` around it): ``config``'s data, model and local
    procedure with ``optimizer`` (SAM by default), and no client-side clipping or noise: the wrapper's server-side
    mechanism clips and noises each update. ``fit`` takes the round from Flower's ``server-round`` key, so that the
    learning-rate decay and the mini-batch shuffles move on every round as under our strategies. Pass it as
    ``strategy.start(..., train_config=train_config(config))``."""
    training = local_training_config(config, optimizer)
    instructions = make_train_instructions(
        config,
        1,
        recipe=RecipeSpec(),
        training=training,
        clip_norm=0.0,
        add_noise=False,
        noise_multiplier=0.0,
        expected_clients=1.0,
    )
    return instructions.to_config_record()


class ClientRejectedError(RuntimeError):
    """The cohort path left the client out of its sum (its ``kind``: failed, nonfinite or shape)."""


def _process_setup() -> None:
    """The per-process setup of our ClientApp's handler (apps/client_app.py says why)."""
    limit_library_threads(torch.get_num_threads())
    keep_freed_memory()
    freeze_imported_objects()


class InstructedNumPyClient(NumPyClient):
    """Our client of partition ``partition_id`` as a Flower NumPyClient: it trains as the round's
    :class:`~fl_app.instructions.TrainInstructions` (its ``fit`` config) say, through the cohort path, and evaluates
    the global model on its partition (module docstring). ``state`` is the node's (``context.state``): where a fit
    keeps what an evaluate without instructions evaluates."""

    def __init__(self, partition_id: int, state: RecordDict | None = None) -> None:
        self.partition_id = int(partition_id)
        self.state = state
        #: The model its last fit trained (global + its privatised update); empty before the first.
        self.trained: list[np.ndarray] = []

    def get_parameters(self, config: Config) -> list[np.ndarray]:
        """The model its last fit trained; before any, the initial model the instructions in ``config`` name
        (``model``, ``data.dataset``, ``seed``: built as the ServerApp builds it), else none."""
        if self.trained or "model" not in config or "data.dataset" not in config:
            return list(self.trained)
        seed = int(config.get("seed", 0))
        return get_weights(build_model_for_dataset(str(config["model"]), str(config["data.dataset"]), seed=seed))

    def fit(self, parameters: list[np.ndarray], config: Config) -> tuple[list[np.ndarray], int, Config]:
        """Train the partition from the global ``parameters`` as a cohort of one of :func:`train_cohort` (what our
        ClientApp's handler calls for the message's partitions) and return global + the privatised update in the
        model's dtype, the number of examples, and the client's statistics (``pre_clip_norm``, ``train_loss``,
        ``train_accuracy``, ``num_steps``)."""
        _process_setup()
        ins = TrainInstructions.from_config(config)
        if FLOWER_ROUND_KEY in config:  # a Flower strategy's round, with the instructions of train_config()
            ins = replace(ins, server_round=int(config[FLOWER_ROUND_KEY]))
        if self.state is not None:  # what a later evaluate of this node evaluates, if its config does not say
            self.state[KEPT_INSTRUCTIONS] = ConfigRecord({k: config[k] for k in EVALUATION_KEYS if k in config})
        shared_mask = unpack_mask(config["mask"]) if "mask" in config else None  # type: ignore[arg-type]
        engine = resolve_cohort_engine(ins.cohort_engine, resolve_device(ins.device).type == "cuda")
        fault = str(config.get("fault", ""))
        result = train_cohort(list(parameters), ins, [self.partition_id], [fault], engine, shared_mask)
        if not result.accepted:
            kind = next((kind for kind, ids in result.rejected.items() if ids), "failed")
            raise ClientRejectedError(f"partition {self.partition_id}: {kind}")
        # One rounding, global + update to the model's dtype: what a NumPyClient sends is a model.
        self.trained = [
            (np.asarray(p, dtype=np.float64) + total).astype(np.asarray(p).dtype)
            for p, total in zip(parameters, result.total, strict=True)
        ]
        metrics: Config = {k: float(v[0]) for k, v in result.metrics.items()}
        return list(self.trained), int(result.num_examples), metrics

    def evaluate(self, parameters: list[np.ndarray], config: Config) -> tuple[float, int, Config]:
        """The mean cross-entropy and the accuracy (``accuracy``) of the global ``parameters`` on the partition's
        examples, and their number (module docstring). Raises ValueError when neither ``config`` nor the node's
        last fit names the data and model."""
        spec, model_name, device = self._evaluation_target(config)
        _process_setup()
        model = _model(model_name, spec.dataset, str(device))  # the worker's cached model, as training uses it
        set_weights(model, parameters)
        x, y = client_data(spec, self.partition_id)
        loss, accuracy = evaluate(model, x, y, device)
        return float(loss), int(x.shape[0]), {"accuracy": float(accuracy)}

    def _evaluation_target(self, config: Config) -> tuple[DataSpec, str, torch.device]:
        """(the data, the model name, the device) named by ``config``'s instructions, else by the last fit's."""
        needed = [k for k in EVALUATION_KEYS if k != "device"]
        kept = self.state.get(KEPT_INSTRUCTIONS) if self.state is not None else None
        source = config if all(k in config for k in needed) else kept
        if not isinstance(source, (dict, ConfigRecord)) or not all(k in source for k in needed):
            raise ValueError(
                "evaluate needs the data and model to evaluate: the train instructions' keys "
                f"({', '.join(needed)}) in its config, or a fit on this node before it"
            )
        spec = DataSpec(**{f.name: source[f"data.{f.name}"] for f in fields(DataSpec)})  # type: ignore[arg-type]
        return spec, str(source["model"]), resolve_device(str(source.get("device", "auto")))


def client_fn(context: Context) -> Client:
    """Flower's ``client_fn``: our client of the partition in the node config (``partition-id``, set per message by
    :func:`numpy_client_mod` under ``population=virtual``, the node's own under ``population=nodes``), with the
    node's state."""
    return InstructedNumPyClient(int(context.node_config["partition-id"]), context.state).to_client()


#: Our client as a NumPyClient behind Flower's ``ClientApp(client_fn=...)``.
app = ClientApp(client_fn=client_fn, mods=[numpy_client_mod])
