"""Privacy ledgers: what a run has released and the (ε, δ) it has spent, behind one interface.

The interface follows Opacus' accountant shape (``IAccountant``: step, get_epsilon, state_dict) with the two things
a federated run adds: the budget guard's question (ε after one more release, :meth:`PrivacyLedger.projected_epsilon`)
and the claim ``run.json`` states (:meth:`PrivacyLedger.claim`). The strategy's budget guard, its release log,
resume and ``run.json`` talk only to a ledger; which ledger a strategy keeps is its one choice.

Implementations:

- :class:`SampledGaussianLedger` — the subsampled Gaussian mechanism of DP-FedAvg / DP-FedSAM and the baselines
  (SPEC §7): RDP, PRV or PLD composition (:mod:`fl_app.privacy.accounting`), Poisson or fixed-size sampling, each
  release with its own (σ, q) — the joint multiplier when a release carries a noisy count too (adaptive clipping,
  noisy statistics; Andrew et al. 2021, Thm. 1).
- :class:`GDPLedger` — the μ-GDP bound of Noisy-FedAvg / Noisy-FedProx (seed 004, Thms 3 and 4, Lemma 3), T
  releases of the same mechanism: the bound is a function of T only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from fl_app.choices import AccountantName, Sampling
from fl_app.privacy.accounting import PrivacyAccountant
from fl_app.privacy.fdp import GDPBound, gdp_to_epsilon


class PrivacyLedger(ABC):
    """The releases of one run and the (ε, δ) they cost, at the run's δ."""

    def __init__(self, delta: float) -> None:
        self.delta = float(delta)

    @property
    @abstractmethod
    def rounds(self) -> int:
        """Releases accounted so far."""

    @abstractmethod
    def step(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> None:
        """Account ``rounds`` releases of a mechanism with multiplier σ and sampling rate q."""

    @abstractmethod
    def epsilon_at(self, delta: float) -> float:
        """ε(δ) spent so far (0 before the first release)."""

    @abstractmethod
    def projected_epsilon(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> float:
        """ε(δ) after ``rounds`` more releases of (σ, q); the ledger itself is not changed (the budget guard)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint stores (JSON-serialisable)."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    @abstractmethod
    def claim(self) -> dict[str, Any]:
        """``run.json``'s account of the guarantee: ``statement`` (the sentence) and the ledger's fields."""

    def epsilon(self) -> float:
        """ε spent so far at the run's δ."""
        return self.epsilon_at(self.delta)

    def uncovered(self, reason: str) -> str:
        """The run's claim when the strategy knows this ledger's ε does not cover its mechanism."""
        return f"not covered: {reason}"


class SampledGaussianLedger(PrivacyLedger):
    """The subsampled Gaussian mechanism, composed by :class:`~fl_app.privacy.accounting.PrivacyAccountant`."""

    def __init__(self, delta: float, accountant: AccountantName, sampling: Sampling, population: int | None) -> None:
        super().__init__(delta)
        self.accountant = PrivacyAccountant(accountant, sampling, population)

    @property
    def rounds(self) -> int:
        return self.accountant.steps

    def step(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> None:
        self.accountant.step(noise_multiplier, sample_rate, rounds)

    def epsilon_at(self, delta: float) -> float:
        return self.accountant.get_epsilon(delta)

    def projected_epsilon(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> float:
        return self.accountant.epsilon_after(rounds, noise_multiplier, sample_rate, self.delta)

    def state_dict(self) -> dict[str, Any]:
        return {"accountant": self.accountant.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.accountant.load_state_dict(state["accountant"])

    def claim(self) -> dict[str, Any]:
        epsilon, poisson = self.epsilon(), self.accountant.sampling == "poisson"
        return {
            "statement": f"client-level ({epsilon:.4g}, {self.delta:.3g})-DP",
            "accountant": self.accountant.accountant,
            "sampling_event": "poisson" if poisson else "fixed-size without replacement",
            "neighbouring": "add/remove one client" if poisson else "replace one client",
            "epsilon": epsilon,
            "delta": self.delta,
            "rounds_accounted": self.rounds,
        }


class GDPLedger(PrivacyLedger):
    """T releases of one mechanism whose privacy after T releases is the μ-GDP bound ``bound(T)``.

    ``bound`` is called with the number of releases (≥ 1); the (σ, q) of :meth:`step` are the strategy's and do
    not enter the bound, which is stated in the mechanism's own parameters (seed 004: V, K, m, σ, L).
    """

    def __init__(self, delta: float, bound: Callable[[int], GDPBound], describe_source: Callable[[], str]) -> None:
        super().__init__(delta)
        self.bound = bound
        self.describe_source = describe_source
        self._rounds = 0
        self.bound(1)  # parameters the theorem does not admit (e.g. alpha <= L) fail here, before any round

    @property
    def rounds(self) -> int:
        return self._rounds

    @property
    def mu(self) -> float:
        """μ of the bound after the releases so far (0 before the first)."""
        return self.bound(self._rounds).mu if self._rounds else 0.0

    def step(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> None:
        self._rounds += int(rounds)

    def epsilon_at(self, delta: float) -> float:
        if not self._rounds:
            return 0.0
        if delta == self.delta:
            return self.bound(self._rounds).epsilon
        return gdp_to_epsilon(self.mu, delta)

    def projected_epsilon(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> float:
        return self.bound(self._rounds + rounds).epsilon

    def uncovered(self, reason: str) -> str:
        # The paper's value is still stated: it is what the paper claims, reported but not vouched for.
        return f"not covered: {reason}; paper bound {self.claim()['statement']}"

    def state_dict(self) -> dict[str, Any]:
        return {"gdp_rounds": self._rounds}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._rounds = int(state["gdp_rounds"])

    def claim(self) -> dict[str, Any]:
        bound, epsilon = self.bound(self._rounds), self.epsilon()
        return {
            "statement": f"({epsilon:.4g}, {self.delta:.3g})-DP from {self.mu:.4g}-GDP ({self.describe_source()})",
            "accountant": "gdp (seed 004)",
            "gdp_mu": self.mu,
            "epsilon": epsilon,
            "delta": self.delta,
            "bound": bound.describe(),
            "rounds_accounted": self._rounds,
        }
