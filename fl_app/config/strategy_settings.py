"""The ``strategy`` section: :class:`StrategyConfig`, the settings every strategy has, and the shared settings of the
sparsified methods (docs/algorithms.md) — a strategy's own settings class lives beside the strategy in
strategies/ (its ``settings_class``), checking its own fields; validating the section against the settings class of
the strategy registered under ``strategy.name`` (fl_app/config/strategy_rules.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from fl_app.config.readers import _boolean, _integer, _known_keys, _number, _require, require


@dataclass(frozen=True)
class StrategyConfig:
    """Every strategy's settings: its registered name and the server's step size. A strategy with settings of its
    own names a subclass below as its ``settings_class`` (strategies/); each subclass validates its own fields
    (:meth:`check`), so a strategy is validated for what it reads and nothing else."""

    name: str
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


def _validate_strategy(section: Mapping[str, Any], settings_class: type[StrategyConfig]) -> StrategyConfig:
    """The section read as ``settings_class``, the settings of the strategy its ``name`` is registered under."""
    _known_keys(section, settings_class, "strategy")
    p = "strategy"
    defaults = settings_class(name=str(section.get("name")))
    values: dict[str, Any] = {}
    for f in fields(settings_class):
        if f.name == "name" or f.name not in section:
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
