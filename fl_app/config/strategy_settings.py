"""The ``strategy`` section: :class:`StrategyConfig`, the settings every strategy has, and the subclasses of the
strategies with settings of their own (sparsified methods, SPEC §5 and SPEC_BASELINES.md; BLUR; Noisy-FedAvg and
Noisy-FedProx, seed 004), each checking its own fields; validating the section against the settings class of
the strategy that ``strategy._target_`` names; and the upgrade of a stored config's strategy section.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from fl_app.choices import NOISY_SCHEDULES
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
    server_lr: float = 1.0

    def check(self) -> None:
        """Raise :class:`ConfigError` for a value out of range (the types were checked when it was read)."""
        require(self.server_lr > 0, "strategy.server_lr", self.server_lr, "> 0")


@dataclass(frozen=True)
class SparseConfig(StrategyConfig):
    """Sparsified methods (SPEC §5, SPEC_BASELINES.md): the fraction p of coordinates kept per layer."""

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


@dataclass(frozen=True)
class TopKConfig(MaskedConfig):
    """DP-FedSAM-topk: the top-k mask of the noisy update (covered) or of the clean one (not covered)."""

    MASK_SOURCES: ClassVar[tuple[str, ...]] = ("noisy", "clean")
    mask_source: str = "noisy"


@dataclass(frozen=True)
class RandKConfig(SparseConfig):
    """Fed-SMP-randk: send (update ⊙ mask) / p (unbiased) instead of update ⊙ mask."""

    rescale: bool = True


@dataclass(frozen=True)
class SMPTopKConfig(MaskedConfig):
    """Fed-SMP-topk: each client's own top-k (as published; not covered) or last round's public global top-k."""

    MASK_SOURCES: ClassVar[tuple[str, ...]] = ("local", "global")
    mask_source: str = "local"


@dataclass(frozen=True)
class BlurConfig(StrategyConfig):
    """DP-FedAvg-blur: the BLUR coefficient λ."""

    blur_coef: float = 1.0

    def check(self) -> None:
        super().check()
        require(self.blur_coef >= 0, "strategy.blur_coef", self.blur_coef, ">= 0")


@dataclass(frozen=True)
class BlurSparseConfig(BlurConfig, SparseConfig):
    """DP-FedAvg-blurs: BLUR plus local update sparsification keeping the fraction p per layer (both checks)."""


@dataclass(frozen=True)
class NoisyConfig(StrategyConfig):
    """Noisy-FedAvg (seed 004): K local steps, the schedule's constant μ and the schedule, per-step gradient clip V,
    absolute noise std σ on the uploaded model, the assumed smoothness L."""

    local_steps: int = 10
    noisy_lr: float = 0.05
    lr_schedule: str = "constant"
    grad_clip: float = 1.0
    noise_std: float = 0.01
    smoothness: float = 1.0

    def check(self) -> None:
        super().check()
        require(self.noisy_lr > 0, "strategy.noisy_lr", self.noisy_lr, "> 0")
        require(self.lr_schedule in NOISY_SCHEDULES, "strategy.lr_schedule", self.lr_schedule,
                " | ".join(NOISY_SCHEDULES))  # fmt: skip
        require(self.grad_clip > 0, "strategy.grad_clip", self.grad_clip, "V > 0")
        require(self.noise_std >= 0, "strategy.noise_std", self.noise_std, "sigma >= 0")
        require(self.smoothness > 0, "strategy.smoothness", self.smoothness, "L > 0")


@dataclass(frozen=True)
class NoisyProxConfig(NoisyConfig):
    """Noisy-FedProx: Noisy-FedAvg plus the proximal coefficient α."""

    prox_coef: float = 0.0

    def check(self) -> None:
        super().check()
        require(self.prox_coef >= 0, "strategy.prox_coef", self.prox_coef, "alpha >= 0")


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
        else:
            value = section.get(f.name)
            _require(isinstance(value, str), f"strategy.{f.name}", value, "a string")
            values[f.name] = value
    cfg = replace(defaults, **values)
    cfg.check()
    return cfg
