"""One validated, typed configuration for a run — the only place where config values are range-checked.

Hydra composes ``conf/`` (from the command line in :mod:`apps.main`, or from the ``flwr run`` run-config in
:mod:`apps.server_app`), :func:`load_app_config` turns the composed tree into frozen dataclasses and rejects
bad values with one message that names the key and the allowed range, before Ray or any worker starts.

One idea a module: ``readers`` (:class:`ConfigError`, :func:`require` and the typed readers), one module a section
(``strategy_settings``, ``training`` for client, dataset and model, ``privacy`` with the run's noise key,
``simulation``, ``audit``, ``server_optimizer``, ``faults``), ``strategy_rules`` (what the strategy registered under
a config's ``strategy.name`` checks; the config package never imports strategies), ``app`` (:class:`AppConfig`,
:func:`validate`, :func:`load_app_config`) and ``overrides`` (run-config and keyword overrides,
:func:`compose_config`); every name is imported from here.
"""

from fl_app.config.app import (
    NOISE_KEY_IGNORES,
    AppConfig,
    config_differences,
    flat_settings,
    load_app_config,
    noise_stream_key,
    validate,
)
from fl_app.config.audit import AuditConfig
from fl_app.config.faults import FaultInjectionConfig
from fl_app.config.overrides import (
    CONF_DIR,
    GROUP_KEYS,
    SCALAR_KEYS,
    SETTING_SECTIONS,
    compose_config,
    overrides_from_run_config,
    settings_overrides,
)
from fl_app.config.privacy import DPConfig
from fl_app.config.readers import ConfigError, require
from fl_app.config.server_optimizer import ServerOptimizerConfig
from fl_app.config.simulation import SimulationConfig
from fl_app.config.strategy_rules import (
    LEGACY_STRATEGY_KEYS,
    StrategyRules,
    register_strategy_rules,
    registered_strategy_names,
    strategy_rules,
    upgrade_stored_config,
)
from fl_app.config.strategy_settings import MaskedConfig, SparseConfig, StrategyConfig
from fl_app.config.training import ClientConfig, DatasetConfig, ModelConfig

__all__ = [
    "CONF_DIR",
    "GROUP_KEYS",
    "LEGACY_STRATEGY_KEYS",
    "NOISE_KEY_IGNORES",
    "SCALAR_KEYS",
    "SETTING_SECTIONS",
    "AppConfig",
    "AuditConfig",
    "ClientConfig",
    "ConfigError",
    "DPConfig",
    "DatasetConfig",
    "FaultInjectionConfig",
    "MaskedConfig",
    "ModelConfig",
    "ServerOptimizerConfig",
    "SimulationConfig",
    "SparseConfig",
    "StrategyConfig",
    "StrategyRules",
    "compose_config",
    "config_differences",
    "flat_settings",
    "load_app_config",
    "noise_stream_key",
    "overrides_from_run_config",
    "register_strategy_rules",
    "registered_strategy_names",
    "require",
    "settings_overrides",
    "strategy_rules",
    "upgrade_stored_config",
    "validate",
]
