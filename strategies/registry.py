"""The strategies by name: ``strategy=<name>`` (the ``name`` of conf/strategy/<name>.yaml) is the class registered
under it, and :func:`build_strategy` builds it from a validated config.

Registering a class (:func:`register_strategy`, under its ``config_name``) also hands the config package what it
checks of the strategy (:class:`fl_app.config.StrategyRules`: its settings class, the samplers its accounting admits,
what it refuses), so the config package looks a strategy up by name and never imports strategies. The project's
strategies are registered when the package is imported; a strategy of your own is one :func:`register_strategy`
call and its conf/strategy/<name>.yaml (docs/architecture.md, "Adding a strategy").
"""

from __future__ import annotations

from typing import Any, TypeVar

from fl_app.config import AppConfig, StrategyRules, register_strategy_rules, strategy_rules
from strategies.base import FederatedStrategy
from strategies.blur import DPFedAvgBLUR, DPFedAvgBLURS
from strategies.client_level_dp import RegisteredDP
from strategies.dp_fedavg import DPFedAvg
from strategies.dp_fedsam import DPFedSAM
from strategies.dp_fedsam_topk import DPFedSAMTopK
from strategies.dp_ftrl import DPFedAvgUnamplified, DPFTRLFedAvg, DPFTRLFedSAM
from strategies.fed_smp import FedSMPRandK, FedSMPTopK
from strategies.fedavg import FederatedAveraging, FedSAM
from strategies.noisy import NoisyFedAvg, NoisyFedProx

#: A strategy ``strategy=<name>`` can run: a plain strategy or one private by its own mechanism
#: (:class:`FederatedStrategy`), or a named client-level DP layer over one (:class:`RegisteredDP`).
NamedStrategy = FederatedStrategy | RegisteredDP
StrategyClass = TypeVar("StrategyClass", bound=type[NamedStrategy])

#: The project's strategies, each with its conf/strategy/<config_name>.yaml.
PROJECT_STRATEGIES: tuple[type[NamedStrategy], ...] = (
    FederatedAveraging, FedSAM, DPFedAvg, DPFedSAM, DPFedSAMTopK, FedSMPRandK, FedSMPTopK, DPFedAvgBLUR, DPFedAvgBLURS,
    NoisyFedAvg, NoisyFedProx, DPFTRLFedAvg, DPFTRLFedSAM, DPFedAvgUnamplified,
)  # fmt: skip

_CLASSES: dict[str, type[NamedStrategy]] = {}


#: Why a plain algorithm cannot run under distributed DP.
PLAIN_REFUSAL = (
    "a non-private reference clips nothing and adds no noise, so it has nothing to sum securely; run its DP "
    "strategy (e.g. dp_fedavg, dp_fedsam)"
)


def register_strategy(cls: StrategyClass) -> StrategyClass:
    """Register ``cls`` under its ``config_name`` (usable as a class decorator); registering it again does nothing.
    ValueError for a class that is neither a :class:`FederatedStrategy` nor a :class:`RegisteredDP`, has no
    ``config_name``, or whose name another class holds."""
    if not (isinstance(cls, type) and issubclass(cls, (FederatedStrategy, RegisteredDP))):
        raise ValueError(
            f"register_strategy: {cls!r} is not a subclass of strategies.base.FederatedStrategy or "
            "strategies.client_level_dp.RegisteredDP"
        )
    name = cls.config_name
    if not name:
        raise ValueError(f"register_strategy: {cls.__name__} has no config_name (its conf/strategy/<name>.yaml)")
    holder = _CLASSES.get(name)
    if holder is not None and holder is not cls:
        raise ValueError(f"register_strategy: the name {name!r} is {holder.__module__}.{holder.__qualname__}'s")
    _CLASSES[name] = cls
    distributed_refusal = cls.distributed_placement_refusal
    if distributed_refusal is None and not issubclass(cls, RegisteredDP):
        # A plain algorithm (FedAvg, FedSAM, a user's own) ignores the privacy section: refused, not run in the clear.
        distributed_refusal = PLAIN_REFUSAL
    rules = StrategyRules(
        settings_class=cls.settings_class,
        samplings=cls.samplings,
        audit_refusal=cls.audit_refusal,
        adaptive_clipping_refusal=cls.adaptive_clipping_refusal,
        client_placement_refusal=cls.client_placement_refusal,
        distributed_placement_refusal=distributed_refusal,
    )
    register_strategy_rules(name, rules)
    return cls


def strategy_class(name: str) -> type[NamedStrategy]:
    """The class registered under ``name``; a :class:`fl_app.config.ConfigError` naming the registered ones
    otherwise."""
    strategy_rules(name)  # the config's error for a name nobody registered
    return _CLASSES[name]


def build_strategy(config: AppConfig, **run: Any) -> NamedStrategy:
    """The strategy ``config.strategy.name`` names, built from ``config`` with the run's extras ``run`` (metrics,
    checkpoint_dir, resume_from, on_accounted, observers, accountant: :class:`FederatedStrategy`)."""
    return strategy_class(config.strategy.name)(config, **run)


for _cls in PROJECT_STRATEGIES:
    register_strategy(_cls)
