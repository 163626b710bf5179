"""What the config knows of a strategy, by its name (``strategy=<name>``, the ``name`` of conf/strategy/<name>.yaml):
its settings class and what it refuses, registered by the strategy itself.

The config package never imports strategies: ``strategies.registry.register_strategy`` hands each strategy's
:class:`StrategyRules` to :func:`register_strategy_rules` when the strategy package is imported, and
:func:`fl_app.config.validate` looks a config's strategy up here by name. Validating a config before any strategy
is registered fails with the names that are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from fl_app.config.readers import _fail
from fl_app.config.strategy_settings import StrategyConfig
from fl_app.core.choices import AMPLIFIED_SAMPLINGS


@dataclass(frozen=True)
class StrategyRules:
    """What validating a config needs of its strategy: the class of its own settings (``strategy.*``), the samplers
    its accounting admits (``privacy.sampling``; ``auto`` = the first) and why it refuses canary clients, adaptive
    clipping, client placement or distributed placement (None = it does not)."""

    settings_class: type[StrategyConfig] = StrategyConfig
    samplings: tuple[str, ...] = AMPLIFIED_SAMPLINGS
    audit_refusal: str | None = None
    adaptive_clipping_refusal: str | None = None
    client_placement_refusal: str | None = None
    distributed_placement_refusal: str | None = None


_RULES: dict[str, StrategyRules] = {}


def register_strategy_rules(name: str, rules: StrategyRules) -> None:
    """Register what the config checks of the strategy called ``name`` (a later registration replaces it)."""
    if not name or not isinstance(name, str):
        raise ValueError(f"a strategy is registered under a non-empty name, not {name!r}")
    _RULES[name] = rules


def registered_strategy_names() -> tuple[str, ...]:
    """The names a config's ``strategy.name`` may take, sorted."""
    return tuple(sorted(_RULES))


def strategy_rules(name: object) -> StrategyRules:
    """The rules of the strategy called ``name``; a :class:`~fl_app.config.ConfigError` naming the registered ones
    otherwise."""
    rules = _RULES.get(name) if isinstance(name, str) else None
    if rules is None:
        known = ", ".join(registered_strategy_names()) or "none is: importing strategies registers the project's"
        raise _fail("strategy.name", name, f"a registered strategy ({known})")
    return rules


#: Keys every strategy's section carried while the settings were one flat class for all strategies: a config stored
#: then (a checkpoint's) holds them all, at values its strategy did not read.
LEGACY_STRATEGY_KEYS = (
    "sparsity", "mask_source", "rescale", "blur_coef", "local_steps", "noisy_lr", "lr_schedule", "grad_clip",
    "noise_std", "prox_coef", "smoothness",
)  # fmt: skip

#: How a stored config named its strategy's class before strategies were registered by name: ``_target_`` (the
#: composed form, a checkpoint's) or ``target`` (``AppConfig.to_dict()``, run.json's). The name says it now.
LEGACY_TARGET_KEYS = ("_target_", "target")


def upgrade_stored_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config (a checkpoint's, run.json's) in today's form: the strategy section without the class path it
    once carried (:data:`LEGACY_TARGET_KEYS`), and with only its strategy's own settings of
    :data:`LEGACY_STRATEGY_KEYS` (the others were never read). Today's configs pass unchanged."""
    upgraded = dict(raw)
    section = {k: v for k, v in (raw.get("strategy") or {}).items() if k not in LEGACY_TARGET_KEYS}
    upgraded["strategy"] = section
    rules = _RULES.get(section.get("name"))  # type: ignore[arg-type]
    if rules is None:  # an unknown name: validate() reports it
        return upgraded
    own = {f.name for f in fields(rules.settings_class)}
    upgraded["strategy"] = {k: v for k, v in section.items() if k in own or k not in LEGACY_STRATEGY_KEYS}
    return upgraded
