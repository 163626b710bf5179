"""A private run's account: what its releases spent and what ``run.json`` states of it, the same for both of
ClientLevelDP's layers (our rounds, strategies/base.py; Flower's strategies, strategies/dp_over_flower.py).

:class:`PrivacyAccount` holds, as explicit inputs, what the claim is made of: the budget (the ledger that composes
one privacy event per release, and the guard; budget.py), the update's noise multiplier σ (and the σ the ledger
composes, budget.noise_multiplier: the joint one where a noisy count is released too), the clip norm policy
(clipping.py), q, m = qM and the placement. Its claim is the budget's (the ledger's ε at δ, the accountant, the
sampling event, the releases), the mechanism's parameters and where the run's randomness comes from
(randomness.py); a strategy with a mechanism of its own states its own parameters in their place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flwr.serverapp import PrivacyAccountant

from fl_app.config import DPConfig
from fl_app.privacy.ledger import PrivacyLedger
from fl_app.privacy.pipeline import Mechanism
from strategies.client_dp.budget import PrivacyBudget
from strategies.client_dp.clipping import ClipNorm
from strategies.client_dp.randomness import RunRandomness


@dataclass(frozen=True)
class PrivacyAccount:
    """What a private run's releases spend (:attr:`budget`) and the parameters its claim states."""

    budget: PrivacyBudget
    #: σ of the update (the ledger composes ``budget.noise_multiplier``).
    noise_multiplier: float
    #: C_t: fixed, or adaptive clipping's (its claim states the latest C and its parameters).
    clipping: ClipNorm
    #: C as configured (adaptive clipping's initial C).
    clip_norm: float
    sample_rate: float
    #: m = qM, the fixed denominator.
    expected_clients: float
    placement: str

    @classmethod
    def for_rounds(
        cls,
        ledger: PrivacyLedger,
        mechanisms: Sequence[Mechanism],
        privacy: DPConfig,
        noise_multiplier: float,
        accounted_noise_multiplier: float,
        clipping: ClipNorm,
        expected_clients: float,
    ) -> PrivacyAccount:
        """The account of rounds released by ``mechanisms`` under ``privacy`` (q, the budget, C, the placement):
        ``ledger`` composes each release's events at ``accounted_noise_multiplier``."""
        budget = PrivacyBudget(ledger, mechanisms, noise_multiplier=accounted_noise_multiplier,
                               sample_rate=privacy.sample_rate, max_epsilon=privacy.max_epsilon)  # fmt: skip
        return cls(budget, noise_multiplier, clipping, privacy.clip_norm, privacy.sample_rate, expected_clients,
                   privacy.placement)  # fmt: skip

    @property
    def ledger(self) -> PrivacyLedger:
        return self.budget.ledger

    @property
    def accountant(self) -> PrivacyAccountant:
        """What composes the releases, with Flower's ``PrivacyAccountant`` interface."""
        return self.budget.accountant

    @property
    def accounted_noise_multiplier(self) -> float:
        """The σ the ledger composes: the update's, or the joint one where a noisy count is released with it."""
        return self.budget.noise_multiplier

    @property
    def rounds_released(self) -> int:
        """Distinct noisy models released and accounted (those of the run a resume continues included)."""
        return self.budget.released

    def epsilon(self) -> float:
        """ε spent so far at δ."""
        return self.budget.epsilon()

    def mechanism(self) -> dict[str, Any]:
        """The parameters of the subsampled Gaussian mechanism the ledger accounts (``run.json``)."""
        clipping = self.clipping.claim()
        if self.clipping.adaptive:  # the update's share of the joint σ
            clipping["update_noise_multiplier"] = self.noise_multiplier
        return {
            "noise_multiplier": self.noise_multiplier,
            "accounted_noise_multiplier": self.accounted_noise_multiplier,
            "clip_norm": self.clip_norm,
            "clipping": clipping,
            "sample_rate": self.sample_rate,
            "expected_clients": self.expected_clients,
            "placement": self.placement,
        }

    def claim(
        self,
        randomness: RunRandomness,
        mechanism: dict[str, Any] | None = None,
        not_covered: str | None = None,
        warning: str | None = None,
    ) -> dict[str, Any]:
        """``run.json``'s claim: the budget's (``not_covered``: why the ledger's ε does not cover the mechanism;
        ``warning``: stated after the guarantee, e.g. a canary audit's contradiction), the mechanism's parameters
        (``mechanism``, or :meth:`mechanism`'s) and the sources of the sampling and the noise."""
        return {
            **self.budget.claim(not_covered, warning),
            **(self.mechanism() if mechanism is None else mechanism),
            "noise_source": randomness.source(),
            "sampling_source": randomness.source(),
            "noise_stream": randomness.noise_stream_claim(),
        }
