"""What a strategy class declares: class attributes for the config's checks (strategies/registry.py hands them to
:class:`fl_app.config.StrategyRules`) and for keyword construction, and the hooks a subclass overrides to say what
its algorithm and its mechanism are (the recipe, the server's steps, the round's mask; a mechanism with its own
ledger, calibration and claim). No state: every default here returns a constant, and what a hook's default would
derive from the run (the subsampled Gaussian mechanism's ledger, σ, claim) is the strategy's, where None is
returned."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from fl_app.config import StrategyConfig
from fl_app.core.choices import AMPLIFIED_SAMPLINGS, LocalOptimizer
from fl_app.instructions import RecipeSpec
from fl_app.privacy.ledger import PrivacyLedger
from fl_app.privacy.pipeline import Mechanism


class StrategyDeclarations:
    """The class attributes and hooks a strategy (:class:`strategies.base.FederatedStrategy`) may override."""

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
    #: Why the strategy cannot run under distributed DP (``privacy.placement=distributed``: the clients' Skellam
    #: shares summed by secure aggregation), or None if it can.
    distributed_placement_refusal: ClassVar[str | None] = None
    #: Whether its clients clip their update to C_t (False: Noisy-FedAvg's clip each local gradient instead).
    clips_updates: ClassVar[bool] = True
    #: The samplers its accounting admits (``privacy.sampling``; ``auto`` = the first): fl_app/config checks it.
    samplings: ClassVar[tuple[str, ...]] = AMPLIFIED_SAMPLINGS

    #: The strategy's config in conf/strategy/ (what keyword construction composes).
    config_name: ClassVar[str] = ""

    # ----- the algorithm: the client recipe, the server's steps and the round's shared mask -------------------------

    def client_recipe(self) -> RecipeSpec:
        """The recipe every client runs (sent as ``recipe.*``; :mod:`fl_app.privacy.pipeline` names its steps)."""
        return RecipeSpec()

    def server_mechanisms(self) -> tuple[Mechanism, ...]:
        """Server-only steps after the recipe's (e.g. DP-FedSAM-topk's top-k of the noised average)."""
        return ()

    def round_mask(
        self, server_round: int, global_weights: list[np.ndarray], previous_global: list[np.ndarray]
    ) -> list[np.ndarray] | None:
        """A public, data-independent mask shared by every client this round (None = dense), from the round's global
        model and the one the previous round started from ([] before the first)."""
        return None

    @property
    def uses_previous_global(self) -> bool:
        """Whether :meth:`round_mask` reads ``previous_global`` (then a checkpoint stores it, for the resumed run's
        first mask)."""
        return False

    # ----- a mechanism of its own: its ledger, σ and claim (None: the subsampled Gaussian mechanism's) ------------

    def make_ledger(self) -> PrivacyLedger | None:
        """The ledger of a mechanism with a bound of its own (Noisy-FedAvg's f-DP bound, DP-FTRL's factorization);
        None: the subsampled Gaussian mechanism's, which the strategy's ``PrivateRounds`` makes."""
        return None

    def calibrated_noise_multiplier(self) -> float | None:
        """σ of the update as a mechanism of its own calibrates it to ``privacy.target_epsilon``; None: the sampled
        Gaussian accountant's calibration (strategies/noise.py)."""
        return None

    def mechanism_claim(self) -> dict[str, Any] | None:
        """The parameters of the mechanism the ledger accounts, as ``run.json`` states them; None: the subsampled
        Gaussian mechanism's (the account's)."""
        return None

    def not_covered_reason(self) -> str | None:
        """Why the accountant's ε does not cover this configuration (None = it does)."""
        return None

    def round_extras(self) -> dict[str, Any]:
        """Strategy-specific fields of the round record."""
        return {"gdp_mu": None}
