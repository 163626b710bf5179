"""What a strategy class declares, for the config's checks (strategies/registry.py hands them to
:class:`fl_app.config.StrategyRules`) and for keyword construction: class attributes only, no state."""

from __future__ import annotations

from typing import ClassVar

from fl_app.config import StrategyConfig
from fl_app.core.choices import AMPLIFIED_SAMPLINGS, LocalOptimizer


class StrategyDeclarations:
    """The class attributes a strategy (:class:`strategies.base.FederatedStrategy`) may override."""

    #: The local optimizer of the client recipe.
    local_optimizer: ClassVar[LocalOptimizer] = "sgd"
    #: The strategy's settings (``strategy.*``): a :class:`fl_app.config.StrategyConfig` subclass that validates
    #: its own fields; only these keys are accepted for the strategy.
    settings_class: ClassVar[type[StrategyConfig]] = StrategyConfig
    #: Whether ``privacy.client_statistics=noisy`` can be accounted (needs the sampled-Gaussian accountant).
    supports_noisy_statistics: ClassVar[bool] = True
    #: Why the strategy cannot run canary clients (``audit``), or None if it can (fl_app/config.py checks it).
    audit_refusal: ClassVar[str | None] = None
    #: Why the strategy cannot clip adaptively (``privacy.clipping=adaptive``), or None if it can.
    adaptive_clipping_refusal: ClassVar[str | None] = None
    #: Why the strategy's noise cannot be added by the clients (``privacy.placement=client``), or None if it can.
    client_placement_refusal: ClassVar[str | None] = None
    #: The samplers its accounting admits (``privacy.sampling``; ``auto`` = the first): fl_app/config checks it.
    samplings: ClassVar[tuple[str, ...]] = AMPLIFIED_SAMPLINGS

    #: The strategy's config in conf/strategy/ (what keyword construction composes).
    config_name: ClassVar[str] = ""
