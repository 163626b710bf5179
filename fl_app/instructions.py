"""What the server tells a client each round: everything the client needs, nothing it must read from config.

The server builds :class:`TrainInstructions` from the validated :class:`~fl_app.config.AppConfig` and the
strategy's client recipe, sends it flattened into the ``config`` ConfigRecord of the train message
(``data.*``, ``train.*`` and top-level keys), and the client parses it back. Clients therefore hold no
configuration of their own beyond their node config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from flwr.app import ConfigRecord

from clients.training import LocalTrainingConfig
from fl_app.config import AppConfig

# Purposes of the random streams: simulation randomness is mech.make_rng(seed, round, purpose[, partition]),
# so every draw is a pure function of (seed, round, client) and a resumed or re-run round draws the same values.
STREAM_SAMPLING = 0
STREAM_SERVER_NOISE = 1
STREAM_CLIENT_NOISE = 2
STREAM_CLIENT_SHUFFLE = 3


@dataclass(frozen=True)
class DataSpec:
    """Which data a client trains on; also the cache key of its partition."""

    dataset: str
    data_dir: str  # "" = default cache dir (ConfigRecord has no None)
    download: bool
    partition: str
    alpha: float
    num_clients: int
    seed: int
    max_train_samples: int  # 0 = all


@dataclass(frozen=True)
class TrainInstructions:
    server_round: int
    seed: int
    data: DataSpec
    model: str
    training: LocalTrainingConfig
    # client-side mechanism (SPEC §2): clip_norm 0 = no clipping (non-private references)
    clip_norm: float
    add_noise: bool
    noise_multiplier: float
    expected_clients: float
    secure_noise: bool
    # torch threads are not sent: Ray sets OMP_NUM_THREADS to the CPUs it assigns; a SuperNode uses its cores.
    device: str

    def to_config_record(self) -> ConfigRecord:
        flat: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if isinstance(value, dict):  # nested dataclass: "data.*", "training.*"
                flat.update({f"{key}.{k}": v for k, v in value.items() if v is not None})
            else:
                flat[key] = value
        return ConfigRecord(flat)

    @classmethod
    def from_config(cls, config: Any) -> TrainInstructions:
        def pick(target: type, prefix: str = "") -> dict[str, Any]:
            # Optional fields (defaults) may be absent; ConfigRecord cannot hold None.
            return {f.name: config[prefix + f.name] for f in fields(target) if prefix + f.name in config}

        try:
            top = {f.name: config[f.name] for f in fields(cls) if f.name not in ("data", "training")}
            return cls(
                **top,
                data=DataSpec(**pick(DataSpec, "data.")),
                training=LocalTrainingConfig(**pick(LocalTrainingConfig, "training.")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed train instructions: {exc}") from exc


def make_train_instructions(
    config: AppConfig,
    server_round: int,
    optimizer: Literal["sgd", "sam"],
    clip_norm: float,
    add_noise: bool,
    noise_multiplier: float,
    expected_clients: float,
) -> TrainInstructions:
    c, d = config.client, config.dataset
    return TrainInstructions(
        server_round=server_round,
        seed=config.seed,
        data=DataSpec(
            dataset=d.name,
            data_dir=d.data_dir or "",
            download=d.download,
            partition=d.partition,
            alpha=d.alpha,
            num_clients=d.num_clients,
            seed=config.seed,
            max_train_samples=d.max_train_samples or 0,
        ),
        model=config.model.name,
        training=LocalTrainingConfig(
            epochs=c.local_epochs,
            batch_size=c.batch_size,
            lr=c.lr,
            momentum=c.momentum,
            weight_decay=c.weight_decay,
            lr_decay=c.lr_decay,
            optimizer=optimizer,
            rho=c.rho,
            adaptive=c.adaptive,
        ),
        clip_norm=clip_norm,
        add_noise=add_noise,
        noise_multiplier=noise_multiplier,
        expected_clients=expected_clients,
        secure_noise=config.privacy.secure_noise,
        device=config.simulation.device,
    )
