"""Configs made from other inputs: Hydra overrides from ``flwr run --run-config`` values
(:func:`overrides_from_run_config`) and from the keyword settings of a strategy built in a user's ServerApp
(:func:`settings_overrides`), and :func:`compose_config`, which composes ``conf/`` with overrides outside a Hydra
app and validates it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from fl_app.config.app import AppConfig, load_app_config
from fl_app.config.audit import AuditConfig
from fl_app.config.known_keys import check_override_keys
from fl_app.config.privacy import DPConfig
from fl_app.config.readers import ConfigError, _fail
from fl_app.config.server_optimizer import ServerOptimizerConfig
from fl_app.config.simulation import SimulationConfig
from fl_app.config.strategy_settings import StrategyConfig
from fl_app.config.training import ClientConfig, DatasetConfig, ModelConfig

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


# --- flwr run front door ---------------------------------------------------------------------------------------

# Run-config keys (pyproject [tool.flwr.app.config]) that select a Hydra config group.
GROUP_KEYS = ("strategy", "client", "dataset", "model", "privacy", "simulation", "audit", "server_optimizer")
# Run-config keys that set a top-level scalar of conf/config.yaml.
SCALAR_KEYS = ("seed", "num_rounds", "eval_every", "population", "round_timeout", "checkpoint_every")
#: Settings of the Hydra path's own simulation engine, which ``flwr run`` does not read (the federation's engine is
#: Flower's, configured by ``--federation-config``): refused rather than silently ignored.
ENGINE_SETTINGS = {
    "simulation.client_cpus": "client-resources-num-cpus",
    "simulation.client_gpus": "client-resources-num-gpus",
    "simulation.total_cpus": "init-args-num-cpus",
    "simulation.ray_address": "RAY_ADDRESS in the SuperLink's environment",
}


def overrides_from_run_config(run_config: Mapping[str, Any]) -> list[str]:
    """Translate ``flwr run --run-config`` values into Hydra overrides.

    Group choices and top-level scalars are keys of their own; anything else goes through the ``overrides`` key,
    a space-separated list of Hydra overrides (``overrides='privacy.clip_norm=0.5 dataset.alpha=0.3'``).
    """
    unknown = sorted(set(run_config) - set(GROUP_KEYS) - set(SCALAR_KEYS) - {"overrides", "output_dir"})
    if unknown:
        raise ConfigError(f"unknown run-config key(s) {', '.join(unknown)}")
    result = [f"{key}={run_config[key]}" for key in GROUP_KEYS if key in run_config]
    result += [f"{key}={run_config[key]}" for key in SCALAR_KEYS if key in run_config]
    output_dir = run_config.get("output_dir")
    if output_dir:
        result.append(f"output_dir={output_dir}")
    extra = run_config.get("overrides", "")
    if not isinstance(extra, str):
        raise _fail("overrides", extra, "a string of space-separated Hydra overrides")
    result += extra.split()
    for override in result:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in ENGINE_SETTINGS:
            raise ConfigError(
                f"{key} in flwr run's overrides: flwr run does not read it (the federation's simulation engine is "
                f"Flower's); set {ENGINE_SETTINGS[key]} in --federation-config instead (docs/running.md)"
            )
    return result


# --- keyword construction (a strategy built in a user's ServerApp) ---------------------------------------------

#: The sections a keyword setting can name a field of, in AppConfig order.
SETTING_SECTIONS: dict[str, type] = {
    "strategy": StrategyConfig,
    "client": ClientConfig,
    "dataset": DatasetConfig,
    "model": ModelConfig,
    "privacy": DPConfig,
    "simulation": SimulationConfig,
    "audit": AuditConfig,
    "server_optimizer": ServerOptimizerConfig,
}


def settings_overrides(
    strategy: str, settings: Mapping[str, Any], strategy_settings: type[StrategyConfig] = StrategyConfig
) -> list[str]:
    """Hydra overrides for ``strategy`` (a conf/strategy name, whose settings class is ``strategy_settings``) and
    keyword ``settings``.

    A setting is a top-level key (``num_rounds=5``), a group choice given as a string (``dataset="cifar10"``,
    ``server_optimizer="adam"``), a section given as a dict (``privacy={"clip_norm": 0.5}``), a dotted key
    (``**{"client.momentum": 0.5}``), or the bare name of a field that exactly one section has
    (``clip_norm=0.5`` is ``privacy.clip_norm``). An unknown or ambiguous name raises TypeError naming the
    candidates, as a wrong keyword argument does.
    """
    overrides = [f"strategy={strategy}"]
    groups = [(key, value) for key, value in settings.items() if key in GROUP_KEYS and isinstance(value, str)]
    overrides += [f"{key}={value}" for key, value in groups]  # choices first: a field then overrides the choice
    for key, value in settings.items():
        if key == "strategy":
            raise TypeError("the strategy is the class; pass its settings, not strategy=")
        if key in GROUP_KEYS and isinstance(value, str):
            continue
        if key in SETTING_SECTIONS and isinstance(value, Mapping):
            overrides += [f"{key}.{name}={_override_value(v)}" for name, v in value.items()]
            continue
        overrides.append(f"{_setting_key(key, {**SETTING_SECTIONS, 'strategy': strategy_settings})}="
                         f"{_override_value(value)}")  # fmt: skip
    return overrides


def _setting_key(name: str, sections: Mapping[str, type]) -> str:
    if "." in name or name in SCALAR_KEYS or name in ("resume", "output_dir"):
        return name
    owners = [section for section, cls in sections.items() if name in {f.name for f in fields(cls)}]
    if len(owners) == 1:
        return f"{owners[0]}.{name}"
    if not owners:
        raise TypeError(f"unknown setting {name!r}: a top-level key ({', '.join(SCALAR_KEYS)}), a group, or a "
                        f"field of {', '.join(SETTING_SECTIONS)}")  # fmt: skip
    raise TypeError(
        f"ambiguous setting {name!r}: " + " or ".join(f"{o}.{name}" for o in owners) + " (pass the dotted key)"
    )


def _override_value(value: Any) -> str:
    """A Python value as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def compose_config(overrides: Iterable[str] = ()) -> AppConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides outside a Hydra app, and validate it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides)
    check_override_keys(overrides, CONF_DIR)  # a misspelt key named with its fix, not Hydra's "+key" advice
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc
    return load_app_config(cfg)
