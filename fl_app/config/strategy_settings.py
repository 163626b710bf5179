"""The ``strategy`` section: :class:`StrategyConfig`, the settings every strategy has, and the shared settings of the
sparsified methods (docs/algorithms.md) — a strategy's own settings class lives beside the strategy in
strategies/ (its ``settings_class``), checking its own fields; validating the section against the settings class of
the strategy that ``strategy._target_`` names; and the upgrade of a stored config's strategy section.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from fl_app.config.readers import _boolean, _fail, _integer, _known_keys, _number, _require, require

#: Every strategy class named by ``strategy._target_`` derives from this one.
STRATEGY_BASE = "strategies.base.FederatedStrategy"


@dataclass(frozen=True)
class StrategyConfig:
    """Every strategy's settings: its name, its class and the server's step size. A strategy with settings of its
    own names a subclass below as its ``settings_class`` (strategies/); each subclass validates its own fields
    (:meth:`check`), so a strategy is validated for what it reads and nothing else."""

    name: str
    target: str
    #: η of the server step; null = the server optimizer's default (fl_app/config/server_optimizer.py), resolved by
    #: :func:`fl_app.config.validate`.
    server_lr: float | None = None

    def check(self) -> None:
        """Raise :class:`ConfigError` for a value out of range (the types were checked when it was read)."""
        lr = self.server_lr
        ok = lr is None or (isinstance(lr, int | float) and not isinstance(lr, bool) and lr > 0)
        require(ok, "strategy.server_lr", lr, "> 0, or null for the server optimizer's default")


@dataclass(frozen=True)
class SparseConfig(StrategyConfig):
    """Sparsified methods (docs/algorithms.md): the fraction p of coordinates kept per layer."""

    sparsity: float = 0.4

    def check(self) -> None:
        super().check()
        require(0 < self.sparsity <= 1, "strategy.sparsity", self.sparsity, "p in (0, 1]")


@dataclass(frozen=True)
class MaskedConfig(SparseConfig):
    """A sparsified method whose mask has a source: one of the class's ``MASK_SOURCES``."""

    MASK_SOURCES: ClassVar[tuple[str, ...]] = ()
    mask_source: str = ""

    def check(self) -> None:
        super().check()
        require(self.mask_source in self.MASK_SOURCES, "strategy.mask_source", self.mask_source,
                " | ".join(self.MASK_SOURCES))  # fmt: skip


def _strategy_class(section: Mapping[str, Any]) -> type:
    """The class ``strategy._target_`` names (checked by :func:`_validate_strategy`)."""
    module_name, _, class_name = str(section.get("_target_")).rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)


#: Keys every strategy's section carried while the settings were one flat class for all strategies: a config stored
#: then (a checkpoint's) holds them all, at values its strategy did not read.
LEGACY_STRATEGY_KEYS = (
    "sparsity", "mask_source", "rescale", "blur_coef", "local_steps", "noisy_lr", "lr_schedule", "grad_clip",
    "noise_std", "prox_coef", "smoothness",
)  # fmt: skip


def upgrade_stored_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config (a checkpoint's) in today's form: the strategy section keeps only its strategy's own
    settings of :data:`LEGACY_STRATEGY_KEYS` (the others were never read). Today's configs pass unchanged."""
    upgraded = dict(raw)
    section = dict(raw.get("strategy") or {})
    try:
        settings_class = getattr(_strategy_class(section), "settings_class", StrategyConfig)
    except Exception:  # an unimportable target: validate() reports it
        return upgraded
    own = {f.name for f in fields(settings_class)}
    upgraded["strategy"] = {k: v for k, v in section.items() if k in own or k not in LEGACY_STRATEGY_KEYS}
    return upgraded


def _validate_strategy(section: Mapping[str, Any]) -> StrategyConfig:
    target = section.get("_target_")
    _require(isinstance(target, str) and "." in target, "strategy._target_", target, "a dotted class path")
    module_name, _, class_name = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise _fail("strategy._target_", target, "an importable strategy class") from exc
    # Checked by name along the MRO: importing strategies.base here would make this module and the strategy
    # package import each other (they depend on this module, not the other way round).
    _require(
        isinstance(cls, type) and any(f"{c.__module__}.{c.__qualname__}" == STRATEGY_BASE for c in cls.__mro__),
        "strategy._target_",
        target,
        "a subclass of strategies.base.FederatedStrategy",
    )
    settings_class = getattr(cls, "settings_class", StrategyConfig)
    _known_keys(section, settings_class, "strategy", extra=("_target_",))
    p = "strategy"
    name = section.get("name")
    _require(isinstance(name, str) and bool(name), "strategy.name", name, "a non-empty string")
    defaults = settings_class(name=str(name), target=str(target))
    values: dict[str, Any] = {}
    for f in fields(settings_class):
        if f.name in ("name", "target") or f.name not in section:
            continue
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            values[f.name] = _boolean(section, f.name, p)
        elif isinstance(default, int):
            values[f.name] = _integer(section, f.name, p, 1)
        elif isinstance(default, float):
            values[f.name] = _number(section, f.name, p)
        elif default is None:  # an optional setting (null = derived); the settings class's check() validates it
            values[f.name] = section.get(f.name)
        else:
            value = section.get(f.name)
            _require(isinstance(value, str), f"strategy.{f.name}", value, "a string")
            values[f.name] = value
    cfg = replace(defaults, **values)
    cfg.check()
    return cfg
