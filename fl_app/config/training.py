"""The ``client``, ``dataset`` and ``model`` sections: local training's settings, the dataset and its partition
over the clients, and the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fl_app.config.readers import _boolean, _choice, _integer, _known_keys, _number, _optional_integer, _require
from fl_app.core.choices import MODEL_NAMES


@dataclass(frozen=True)
class ClientConfig:
    local_epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    lr_decay: float
    rho: float
    adaptive: bool


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    data_dir: str | None
    download: bool
    partition: str
    alpha: float
    num_clients: int
    max_train_samples: int | None
    max_test_samples: int | None


@dataclass(frozen=True)
class ModelConfig:
    name: str


def _validate_client(section: Mapping[str, Any]) -> ClientConfig:
    _known_keys(section, ClientConfig, "client")
    p = "client"
    cfg = ClientConfig(
        local_epochs=_integer(section, "local_epochs", p, 1),
        batch_size=_integer(section, "batch_size", p, 1),
        lr=_number(section, "lr", p),
        momentum=_number(section, "momentum", p),
        weight_decay=_number(section, "weight_decay", p),
        lr_decay=_number(section, "lr_decay", p),
        rho=_number(section, "rho", p),
        adaptive=_boolean(section, "adaptive", p),
    )
    _require(cfg.lr > 0, "client.lr", cfg.lr, "> 0")
    _require(0 <= cfg.momentum < 1, "client.momentum", cfg.momentum, "[0, 1)")
    _require(cfg.weight_decay >= 0, "client.weight_decay", cfg.weight_decay, ">= 0")
    _require(0 < cfg.lr_decay <= 1, "client.lr_decay", cfg.lr_decay, "(0, 1]")
    _require(cfg.rho >= 0, "client.rho", cfg.rho, ">= 0")
    return cfg


def _validate_dataset(section: Mapping[str, Any]) -> DatasetConfig:
    from fl_app.data.datasets import DATASETS
    from fl_app.data.partition import SCHEMES

    _known_keys(section, DatasetConfig, "dataset")
    p = "dataset"
    data_dir = section.get("data_dir")
    _require(data_dir is None or isinstance(data_dir, str), "dataset.data_dir", data_dir, "a path or null")
    cfg = DatasetConfig(
        name=_choice(section, "name", p, DATASETS),
        data_dir=data_dir,
        download=_boolean(section, "download", p),
        partition=_choice(section, "partition", p, SCHEMES),
        alpha=_number(section, "alpha", p),
        num_clients=_integer(section, "num_clients", p, 1),
        max_train_samples=_optional_integer(section, "max_train_samples", p, 1),
        max_test_samples=_optional_integer(section, "max_test_samples", p, 1),
    )
    _require(cfg.alpha > 0, "dataset.alpha", cfg.alpha, "> 0")
    return cfg


def _validate_model(section: Mapping[str, Any]) -> ModelConfig:
    _known_keys(section, ModelConfig, "model")
    return ModelConfig(name=_choice(section, "name", "model", MODEL_NAMES))
