"""What a run's releases spend: the ledger, the privacy events of one release, the budget guard (docs/mechanisms.md,
6-8).

A release of client-level DP is one noisy model leaving the server. Each one makes the privacy events of the
round's mechanisms (:meth:`fl_app.privacy.pipeline.Mechanism.privacy_event`: the sampled Gaussian mechanism's
(σ, q), DP-FTRL's row of the factorization, Noisy-FedAvg's GDP step) at the multiplier the accountant composes: the
update's σ, or the joint one when a noisy count is released beside it (Andrew et al. 2021, Thm. 1). The ledger
(:mod:`fl_app.privacy.ledger`) composes them; the budget guard asks it for ε after one more release before a round
starts. Both our strategies and :class:`strategies.flower_dp.ClientLevelDP` hold one :class:`PrivacyBudget`, so
that a release is accounted, and refused over budget, one way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from flwr.serverapp import PrivacyAccountant

from fl_app.privacy.ledger import PrivacyLedger
from fl_app.privacy.pipeline import Mechanism, PrivacyEvent, ReleaseParameters
from fl_app.releases import Release, model_digest, randomness_name


class PrivacyBudget:
    """The releases of one run and what they spend: every release makes the privacy events of ``mechanisms`` at
    ``noise_multiplier`` (the σ the accountant composes) and ``sample_rate``, and ``ledger`` composes them; no round
    starts whose release would take ε above ``max_epsilon`` (None: no limit)."""

    def __init__(
        self,
        ledger: PrivacyLedger,
        mechanisms: Sequence[Mechanism],
        *,
        noise_multiplier: float,
        sample_rate: float,
        max_epsilon: float | None = None,
    ) -> None:
        self.ledger = ledger
        self.mechanisms = tuple(mechanisms)
        self.noise_multiplier = float(noise_multiplier)
        self.sample_rate = float(sample_rate)
        self.max_epsilon = max_epsilon
        #: Distinct releases made (and accounted) so far, those of the run a resume continues included: run.json's
        #: ``rounds_released``. A seeded re-run that repeats a logged release is not a new one.
        self.released = 0

    @property
    def accountant(self) -> PrivacyAccountant:
        """What composes the releases, with Flower's ``PrivacyAccountant`` interface."""
        return self.ledger.accountant  # type: ignore[attr-defined,no-any-return]

    def events(self, noise_multiplier: float | None = None, sample_rate: float | None = None) -> list[PrivacyEvent]:
        """The privacy events of one release (at this budget's σ and q unless given: a logged release keeps the
        parameters it was made with). A pipeline that makes none is refused: its releases would go unaccounted."""
        release = ReleaseParameters(
            self.noise_multiplier if noise_multiplier is None else noise_multiplier,
            self.sample_rate if sample_rate is None else sample_rate,
        )
        events = [event for m in self.mechanisms if (event := m.privacy_event(release)) is not None]
        if not events:
            names = ", ".join(type(m).__name__ for m in self.mechanisms) or "none"
            raise RuntimeError(f"no mechanism of the release's pipeline ({names}) makes a privacy event")
        return events

    def epsilon(self) -> float:
        """ε spent so far at the ledger's δ (∞ once a release without noise is accounted)."""
        return self.ledger.epsilon()

    def projected_epsilon(self) -> float:
        """ε after one more release (the budget guard's question); the ledger is not changed."""
        return self.ledger.projected_epsilon(self.noise_multiplier, self.sample_rate)

    def over_budget(self, server_round: int) -> str | None:
        """Why round ``server_round`` must not start (its release would take ε above ``max_epsilon``), or None."""
        if self.max_epsilon is None:
            return None
        projected = self.projected_epsilon()
        if projected <= self.max_epsilon:
            return None
        return (
            f"budget guard: round {server_round} would take epsilon to {projected:.4f} > max_epsilon={self.max_epsilon}"
        )

    def claim(self, not_covered: str | None = None, warning: str | None = None) -> dict[str, Any]:
        """The core of ``run.json``'s claim, the same on every path: ``dp_guarantee`` (the ledger's sentence, with
        ``warning`` after it, e.g. a canary audit's contradiction; ``not covered: <reason>`` instead when the
        caller knows the ledger's ε does not cover its mechanism), the ledger's fields (ε, δ, the accountant, the
        sampling event and neighbouring relation, ...), and ``rounds_released``."""
        fields = self.ledger.claim()
        statement = fields.pop("statement")
        if warning is not None:
            statement = f"{statement} -- {warning}"
        return {
            "dp_guarantee": self.ledger.uncovered(not_covered) if not_covered else statement,
            **fields,
            "rounds_released": self.released,
        }

    def release(self, server_round: int, weights: Iterable[np.ndarray], secure: bool) -> Release:
        """Round ``server_round``'s released model ``weights`` as the write-ahead log's record, with the parameters
        :meth:`account` composes for it."""
        return Release(
            round=server_round,
            noise_multiplier=self.noise_multiplier,
            sample_rate=self.sample_rate,
            randomness=randomness_name(secure),
            digest=model_digest(weights),
        )

    def resume(self, released: int, owed: Iterable[Release]) -> None:
        """Continue a run that had made ``released`` releases at its checkpoint (the ledger restored from it) and then
        the ``owed`` ones, logged after it: each left the server, and the restored ledger has not counted it."""
        self.released = int(released)
        for release in owed:
            self.account(release)

    def account(self, release: Release | None = None) -> None:
        """Compose one release: the coming round's (None), or a logged ``release`` with its own parameters (one
        that left the server after the checkpoint a run resumes from)."""
        sigma, rate = (None, None) if release is None else (release.noise_multiplier, release.sample_rate)
        for event in self.events(sigma, rate):
            self.ledger.compose(event)
        self.released += 1
