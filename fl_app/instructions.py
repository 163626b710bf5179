"""What the server tells a client each round: everything the client needs, nothing it must read from config.

The server builds :class:`TrainInstructions` from the validated :class:`~fl_app.config.AppConfig` and the
strategy's client recipe, sends it as the ``config`` ConfigRecord of the train message, and the client parses it
back. Clients therefore hold no configuration of their own beyond their node config (partition id).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from flwr.app import ConfigRecord

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
    data_dir: str  # "" = default cache dir
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
    # data
    dataset: str
    data_dir: str
    download: bool
    partition: str
    alpha: float
    num_clients: int
    max_train_samples: int  # 0 = all (ConfigRecord has no None)
    model: str
    # local optimisation (SPEC §3)
    optimizer: Literal["sgd", "sam"]
    local_epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    lr_decay: float
    rho: float
    adaptive: bool
    # client-side mechanism (SPEC §2): clip_norm 0 = no clipping (non-private references)
    clip_norm: float
    add_noise: bool
    noise_multiplier: float
    expected_clients: float
    secure_noise: bool
    # execution (torch threads: Ray sets OMP_NUM_THREADS to the CPUs it assigns a ClientApp; a SuperNode uses all)
    device: str

    @property
    def data_spec(self) -> DataSpec:
        return DataSpec(
            dataset=self.dataset,
            data_dir=self.data_dir,
            download=self.download,
            partition=self.partition,
            alpha=self.alpha,
            num_clients=self.num_clients,
            seed=self.seed,
            max_train_samples=self.max_train_samples,
        )

    def to_config_record(self) -> ConfigRecord:
        return ConfigRecord(dict(asdict(self)))

    @classmethod
    def from_config(cls, config: Any) -> TrainInstructions:
        missing = [f.name for f in fields(cls) if f.name not in config]
        if missing:
            raise ValueError(f"train instructions are missing {', '.join(missing)}")
        return cls(**{f.name: config[f.name] for f in fields(cls)})


def make_train_instructions(
    config: AppConfig,
    server_round: int,
    optimizer: Literal["sgd", "sam"],
    clip_norm: float,
    add_noise: bool,
    noise_multiplier: float,
    expected_clients: float,
) -> TrainInstructions:
    c = config.client
    return TrainInstructions(
        server_round=server_round,
        seed=config.seed,
        dataset=config.dataset.name,
        data_dir=config.dataset.data_dir or "",
        download=config.dataset.download,
        partition=config.dataset.partition,
        alpha=config.dataset.alpha,
        num_clients=config.dataset.num_clients,
        max_train_samples=config.dataset.max_train_samples or 0,
        model=config.model.name,
        optimizer=optimizer,
        local_epochs=c.local_epochs,
        batch_size=c.batch_size,
        lr=c.lr,
        momentum=c.momentum,
        weight_decay=c.weight_decay,
        lr_decay=c.lr_decay,
        rho=c.rho,
        adaptive=c.adaptive,
        clip_norm=clip_norm,
        add_noise=add_noise,
        noise_multiplier=noise_multiplier,
        expected_clients=expected_clients,
        secure_noise=config.privacy.secure_noise,
        device=config.simulation.device,
    )
