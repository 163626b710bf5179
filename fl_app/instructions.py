"""What the server tells a client each round: everything the client needs, nothing it must read from config.

The server builds :class:`TrainInstructions` from the validated :class:`~fl_app.config.AppConfig` and the
strategy's client recipe, sends it flattened into the ``config`` ConfigRecord of the train message
(``data.*``, ``train.*`` and top-level keys), and the client parses it back. Clients therefore hold no
configuration of their own beyond their node config.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, get_args

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fl_app.config import AppConfig, noise_stream_key
from fl_app.core.choices import LOCAL_OPTIMIZERS, NOISY_SCHEDULES, CohortEngine, LocalOptimizer, NoisySchedule

# Purposes of the random streams: simulation randomness is mech.make_rng(seed, round, purpose[, partition]),
# so every draw is a pure function of (seed, round, client) and a resumed or re-run round draws the same values.
# Noise streams (server and client noise, adaptive clipping's and the statistics' noisy counts) take one more key
# word under privacy.noise_stream=per_run: the run's key (fl_app.config.noise_stream_key; TrainInstructions.noise_key).
# With secure randomness every one of these draws comes from the OS CSPRNG instead (mech.random_source).
STREAM_SAMPLING = 0
STREAM_SERVER_NOISE = 1
STREAM_CLIENT_NOISE = 2
STREAM_CLIENT_SHUFFLE = 3
STREAM_ROUND_MASK = 4
STREAM_STATISTICS = 5
STREAM_ADAPTIVE_CLIP = 6
#: The canaries' participation (the audit's clients, drawn by the real clients' sampler: strategies/auditing.py).
STREAM_CANARY_SAMPLING = 7
#: DP-FTRL's cyclic groups (strategies/dp_ftrl.py): keyed by the run's participation key, not the round.
STREAM_PARTICIPATION_GROUPS = 8
STREAM_DISTRIBUTED_SHARE, STREAM_ROTATION = 9, 10  # distributed DP: a client's rounding and share; the rotation


@dataclass(frozen=True)
class LocalTrainingConfig:
    """Hyper-parameters of one client's local training (defaults: docs/algorithms.md, "Local training")."""

    epochs: int
    batch_size: int
    lr: float
    momentum: float = 0.5
    weight_decay: float = 5e-4
    lr_decay: float = 0.998
    optimizer: LocalOptimizer = "sgd"
    rho: float = 0.05
    adaptive: bool = False
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0.0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.momentum < 0.0:
            raise ValueError(f"momentum must be >= 0, got {self.momentum}")
        if self.weight_decay < 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not self.lr_decay > 0.0:
            raise ValueError(f"lr_decay must be > 0, got {self.lr_decay}")
        if self.optimizer not in LOCAL_OPTIMIZERS:
            raise ValueError(f"optimizer must be 'sgd' or 'sam', got {self.optimizer!r}")
        if self.rho < 0.0:
            raise ValueError(f"rho must be >= 0, got {self.rho}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be None or >= 1, got {self.max_steps}")


@dataclass(frozen=True)
class NoisyLocalConfig:
    """Local hyper-parameters of Noisy-FedAvg / Noisy-FedProx (seed 004, App. B Alg. 1; docs/algorithms.md).

    ``steps`` is K (local steps per round, independent of the client's data size), ``lr`` the paper's constant μ
    in the step size η_{k,t} (see :func:`noisy_step_lr`; not the GDP μ of the privacy bound), ``grad_clip`` the
    per-step minibatch-gradient bound V and ``prox_coef`` the FedProx α (0 gives Noisy-FedAvg).
    """

    steps: int
    batch_size: int
    lr: float
    schedule: NoisySchedule
    grad_clip: float
    prox_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not (self.lr > 0.0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be finite and > 0, got {self.lr}")
        if self.schedule not in NOISY_SCHEDULES:
            raise ValueError(f"schedule must be one of {NOISY_SCHEDULES}, got {self.schedule!r}")
        # V enters the privacy bound (sensitivity of each step), so it must be a real, finite bound.
        if not (self.grad_clip > 0.0 and math.isfinite(self.grad_clip)):
            raise ValueError(f"grad_clip (V) must be finite and > 0, got {self.grad_clip}")
        if not (self.prox_coef >= 0.0 and math.isfinite(self.prox_coef)):
            raise ValueError(f"prox_coef (alpha) must be finite and >= 0, got {self.prox_coef}")


def resolve_cohort_engine(requested: str, device_is_gpu: bool) -> CohortEngine:
    """``auto`` = captured on a GPU (the vectorized step as CUDA graphs, about twice as fast a round as the
    vectorized engine: docs/performance.md), sequential on a CPU. A cohort the captured engine
    does not train (Noisy-FedAvg/FedProx's noisy local steps) takes the vectorized engine, as ``captured`` does
    (:func:`clients.cohort.train_cohort`). ``captured`` needs a GPU: on a CPU it is refused (at config validation;
    here as a ValueError)."""
    if requested == "captured" and not device_is_gpu:
        raise ValueError("cohort_engine=captured needs a CUDA device (CUDA graphs); use vectorized or sequential")
    if requested in get_args(CohortEngine):
        return requested  # type: ignore[return-value]
    return "captured" if device_is_gpu else "sequential"


@dataclass(frozen=True)
class DataSpec:
    """Which data a client trains on; also the cache key of its partition."""

    dataset: str
    data_dir: str  # "" = default cache dir (ConfigRecord has no None)
    download: bool
    partition: str
    alpha: float
    num_clients: int
    # The dataset's layout (which examples form partition i), not a seed of any draw of the mechanism: sampling,
    # masks, noise and shuffles do not derive from it when randomness is secure.
    partition_seed: int
    max_train_samples: int  # 0 = all


@dataclass(frozen=True)
class RecipeSpec:
    """Which client-side recipe runs (clients/recipes.py holds the order of the steps for each kind).

    kinds: ``dense`` (clip → noise), ``topk_noisy`` / ``topk_clean`` (DP-FedSAM-topk: per-layer top-k of the
    noisy / clean update after noising), ``shared_mask`` (Fed-SMP with the round's server mask), ``topk_local``
    (Fed-SMP-topk, client-local mask), ``lus`` (BLUR+LUS: top-k before clipping, dense noise), ``noisy_model``
    (Noisy-FedAvg/FedProx: absolute Gaussian noise on the uploaded model, no update clipping).
    """

    kind: str = "dense"
    sparsity: float = 1.0
    rescale: bool = False
    blur_coef: float = 0.0
    noise_std: float = 0.0


@dataclass(frozen=True)
class TrainInstructions:
    server_round: int
    # The seed of the simulation's random streams (client noise, mini-batch shuffles); None (not sent at all) when
    # randomness is secure: then a client draws its shuffles and noise from the OS CSPRNG.
    seed: int | None
    data: DataSpec
    model: str
    recipe: RecipeSpec
    # Exactly one of the two local procedures is set.
    training: LocalTrainingConfig | None
    noisy_training: NoisyLocalConfig | None
    # client-side mechanism (docs/mechanisms.md, 2 and 4): clip_norm 0 = no clipping (non-private references)
    clip_norm: float
    add_noise: bool
    noise_multiplier: float
    expected_clients: float
    secure_noise: bool
    # torch threads are not sent: Ray sets OMP_NUM_THREADS to the CPUs it assigns; a SuperNode uses its cores.
    device: str
    # How a worker trains a cohort message (clients/cohort.py): auto | sequential | vectorized.
    cohort_engine: str = "auto"
    # The run's noise key (privacy.noise_stream=per_run: fl_app.config.noise_stream_key), the last key word of the
    # client's noise stream; None (not sent) = the seed's shared noise, or secure randomness.
    noise_key: int | None = None
    # Distributed DP: the update leaves only masked (clients/secure_aggregation.py); a plain train message is refused.
    secure_aggregation: bool = False

    def to_config_record(self) -> ConfigRecord:
        flat: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if value is None:
                continue
            if isinstance(value, dict):  # nested dataclass: "data.*", "training.*", ...
                flat.update({f"{key}.{k}": v for k, v in value.items() if v is not None})
            else:
                flat[key] = value
        return ConfigRecord(flat)

    @classmethod
    def from_config(cls, config: Any) -> TrainInstructions:
        def pick(target: type, prefix: str = "") -> dict[str, Any]:
            # Optional fields (defaults) may be absent; ConfigRecord cannot hold None.
            return {f.name: config[prefix + f.name] for f in fields(target) if prefix + f.name in config}

        nested = {
            "data": DataSpec,
            "recipe": RecipeSpec,
            "training": LocalTrainingConfig,
            "noisy_training": NoisyLocalConfig,
        }
        try:
            top = {f.name: config[f.name] for f in fields(cls) if f.name not in nested and f.name in config}
            top.setdefault("seed", None)
            parts = {
                name: target(**pick(target, f"{name}.")) if any(str(k).startswith(f"{name}.") for k in config) else None
                for name, target in nested.items()
            }
            return cls(**top, **parts)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed train instructions: {exc}") from exc


#: Per-client statistics a cohort reply carries as lists aligned with its accepted partitions.
COHORT_CLIENT_METRICS = ("pre_clip_norm", "train_loss", "train_accuracy", "num_steps")
#: Why a worker left a client out of its sum, as the server counts it.
COHORT_REJECTIONS = ("failed", "nonfinite", "shape")
#: Optional wall-clock stamps a reply may carry (startup profiling, bench/); the round keeps the earliest.
CLIENT_TIMESTAMPS = ("fit_started_unix", "train_started_unix")


@dataclass
class CohortReply:
    """The reply to a cohort message, the one place its wire format is written (the ClientApp) and read (the
    server, which checks what it read: :func:`strategies.screening.screen_cohort_reply`).

    ``total`` is the float64 sum of the accepted clients' updates; ``accepted`` their partitions, with
    ``metrics`` (:data:`COHORT_CLIENT_METRICS`) aligned to them; ``rejected`` the partitions left out, by kind
    (:data:`COHORT_REJECTIONS`); ``reclipped`` how many the worker had to clip again. ``num_examples`` is Flower's
    convention and is not read back.
    """

    total: list[np.ndarray]
    accepted: list[float]
    metrics: dict[str, list[float]]
    rejected: dict[str, list[float]]
    reclipped: float
    num_examples: int = 0
    timestamps: dict[str, float] = field(default_factory=dict)

    def to_record(self) -> RecordDict:
        metrics: dict[str, Any] = {
            "cohort_ids": list(self.accepted),
            **{k: list(v) for k, v in self.metrics.items()},
            **{f"{kind}_ids": list(self.rejected.get(kind, [])) for kind in COHORT_REJECTIONS},
            "reclipped": self.reclipped,
            "num_examples": self.num_examples,
            **self.timestamps,
        }
        return RecordDict({"arrays": ArrayRecord(self.total), "metrics": MetricRecord(metrics)})

    @classmethod
    def from_record(cls, content: RecordDict) -> CohortReply:
        """Read what a worker sent. Anything it can send wrong raises: undecodable arrays, metrics that are not a
        MetricRecord (a ConfigRecord could smuggle bools, strings or bytes), a missing or non-numeric field."""
        total = content["arrays"].to_numpy_ndarrays()
        sent = content["metrics"]
        if not isinstance(sent, MetricRecord):
            raise TypeError("metrics must be a MetricRecord")
        return cls(
            total=total,
            accepted=[float(v) for v in sent["cohort_ids"]],
            metrics={k: [float(v) for v in sent[k]] for k in COHORT_CLIENT_METRICS},
            rejected={kind: [float(v) for v in sent[f"{kind}_ids"]] for kind in COHORT_REJECTIONS},
            reclipped=float(sent["reclipped"]),
            timestamps={k: float(sent[k]) for k in CLIENT_TIMESTAMPS if k in sent},
        )


#: Flower's Message-API convention for a train reply (``flwr.serverapp.strategy.FedAvg`` and Flower's ClientApp
#: templates): the trained model as the one ArrayRecord, under the key the strategy sent it (``arrays``), and one
#: MetricRecord (``metrics``) holding the number of training examples under this key.
FLOWER_WEIGHT_KEY = "num-examples"
#: The client statistics a Flower-convention reply may carry, each under the keys Flower apps use for it (the first
#: one present is read); ``pre_clip_norm`` and ``num_steps`` are what clients.numpy_client's client reports.
FLOWER_CLIENT_METRICS = {
    "train_loss": ("train_loss", "train-loss"),
    "train_accuracy": ("train_accuracy", "train_acc", "train-accuracy", "train-acc"),
    "pre_clip_norm": ("pre_clip_norm",),
    "num_steps": ("num_steps",),
}


class MalformedReply(ValueError):
    """A reply that does not follow the format it is read as; the message says why."""


def is_cohort_reply(content: RecordDict) -> bool:
    """Whether a reply is in our format (:class:`CohortReply`): its ``metrics`` record names the clients it accounts
    for (``cohort_ids``). Any other is Flower's convention (:class:`FlowerReply`), or one per partition of a cohort
    (fl_app/partition_models.py: a NumPyClient's cohort, each partition's reply screened as one)."""
    return "metrics" in content and "cohort_ids" in content["metrics"]


@dataclass
class FlowerReply:
    """One client's reply in Flower's Message-API convention: ``trained`` the trained model (not an update),
    ``num_examples`` Flower's weight and ``metrics`` the statistics found (:data:`FLOWER_CLIENT_METRICS`).

    Any Flower ClientApp writes it; clients.numpy_client writes it for a ``NumPyClient``; the server reads it
    (strategies/screening.py) and computes the update itself. The server's sum is unweighted: ``num_examples`` is
    checked (a reply without a whole, non-negative count is not in the convention) and not used.
    """

    trained: list[np.ndarray]
    num_examples: int
    metrics: dict[str, float] = field(default_factory=dict)

    def to_record(self) -> RecordDict:
        metrics: dict[str, Any] = {**self.metrics, FLOWER_WEIGHT_KEY: self.num_examples}
        return RecordDict({"arrays": ArrayRecord(self.trained), "metrics": MetricRecord(metrics)})

    @classmethod
    def from_record(cls, content: RecordDict) -> FlowerReply:
        """Read a reply in Flower's convention. A record other than exactly ``arrays`` (an ArrayRecord) and
        ``metrics`` (a MetricRecord), an absent, negative or fractional ``num-examples``, or a statistic that is not
        a number raises :class:`MalformedReply`; undecodable arrays raise what decoding raises."""
        keys = sorted(content.keys())
        if keys != ["arrays", "metrics"]:
            raise MalformedReply(f"a Flower-convention reply holds exactly 'arrays' and 'metrics', not {keys[:5]}")
        arrays, sent = content["arrays"], content["metrics"]
        if not isinstance(arrays, ArrayRecord) or not isinstance(sent, MetricRecord):
            raise MalformedReply(
                "a Flower-convention reply holds an ArrayRecord under 'arrays' and a MetricRecord under 'metrics', not "
                f"{type(arrays).__name__} and {type(sent).__name__}"
            )
        weight = sent.get(FLOWER_WEIGHT_KEY)
        whole = isinstance(weight, (int, float)) and math.isfinite(weight) and float(weight).is_integer()
        if not (whole and weight >= 0):
            raise MalformedReply(f"'{FLOWER_WEIGHT_KEY}' absent or not a whole number >= 0: {str(weight)[:40]}")
        metrics: dict[str, float] = {}
        for name, aliases in FLOWER_CLIENT_METRICS.items():
            key = next((alias for alias in aliases if alias in sent), None)
            if key is None:
                continue
            value = sent[key]
            if not isinstance(value, (int, float)):  # a list: MetricRecord holds no bools or strings
                raise MalformedReply(f"metric '{key}' is not a number")
            metrics[name] = float(value)
        return cls(trained=arrays.to_numpy_ndarrays(), num_examples=int(weight), metrics=metrics)


def local_training_config(config: AppConfig, optimizer: LocalOptimizer) -> LocalTrainingConfig:
    """The standard local procedure (docs/algorithms.md) from the client config, with the strategy's optimizer."""
    c = config.client
    return LocalTrainingConfig(
        epochs=c.local_epochs,
        batch_size=c.batch_size,
        lr=c.lr,
        momentum=c.momentum,
        weight_decay=c.weight_decay,
        lr_decay=c.lr_decay,
        optimizer=optimizer,
        rho=c.rho,
        adaptive=c.adaptive,
    )


def make_train_instructions(
    config: AppConfig,
    server_round: int,
    *,
    recipe: RecipeSpec,
    training: LocalTrainingConfig | NoisyLocalConfig,
    clip_norm: float,
    add_noise: bool,
    noise_multiplier: float,
    expected_clients: float,
    secure_noise: bool = False,
    secure_aggregation: bool = False,
) -> TrainInstructions:
    d = config.dataset
    data = DataSpec(dataset=d.name, data_dir=d.data_dir or "", download=d.download, partition=d.partition,
                    alpha=d.alpha, num_clients=d.num_clients, partition_seed=config.seed,
                    max_train_samples=d.max_train_samples or 0)  # fmt: skip
    return TrainInstructions(
        server_round=server_round,
        # Secure randomness sends no seed: nothing a client receives re-derives who was sampled or any noise.
        seed=None if secure_noise else config.seed,
        data=data,
        model=config.model.name,
        recipe=recipe,
        training=training if isinstance(training, LocalTrainingConfig) else None,
        noisy_training=training if isinstance(training, NoisyLocalConfig) else None,
        clip_norm=clip_norm,
        add_noise=add_noise,
        noise_multiplier=noise_multiplier,
        expected_clients=expected_clients,
        secure_noise=secure_noise,
        secure_aggregation=secure_aggregation,
        device=config.simulation.device,
        cohort_engine=config.simulation.cohort_engine,
        noise_key=None if secure_noise else noise_stream_key(config),
    )
