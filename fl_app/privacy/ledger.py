"""Privacy ledgers: what a run has released and the (ε, δ) it has spent, behind one interface.

The interface follows Opacus' accountant shape (``IAccountant``: step, get_epsilon, state_dict) with the two things
a federated run adds: the budget guard's question (ε after one more release, :meth:`PrivacyLedger.projected_epsilon`)
and the claim ``run.json`` states (:meth:`PrivacyLedger.claim`). The strategy's budget guard, its release log,
resume and ``run.json`` talk only to a ledger; which ledger a strategy keeps is its one choice.

Implementations, each holding an accountant with Flower 1.42's ``PrivacyAccountant`` interface (``.accountant``;
:mod:`fl_app.privacy.accountants`):

- :class:`SampledGaussianLedger` — the subsampled Gaussian mechanism of DP-FedAvg / DP-FedSAM and the baselines
  (docs/mechanisms.md, 6): RDP, PRV or PLD composition (:class:`~fl_app.privacy.accountants.SampledGaussianAccountant`),
  Poisson or fixed-size sampling, each release with its own (σ, q) — the joint multiplier when a release carries a noisy
  count too (adaptive clipping, noisy statistics; Andrew et al. 2021, Thm. 1). Any other accountant with Flower's
  interface can take its place (Flower's own ``RdpAccountant``): it composes Flower's ``GaussianPrivacyEvent``
  with m = qM.
- :class:`GDPLedger` — the μ-GDP bound of Noisy-FedAvg / Noisy-FedProx (seed 004, Thms 3 and 4, Lemma 3), T
  releases of the same mechanism: the bound is a function of T only
  (:class:`~fl_app.privacy.accountants.GDPAccountant`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from flwr.supercore.privacy_accounting import PrivacyAccountant, SamplingMethod
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

from fl_app.core.choices import AccountantName, AmplifiedSampling
from fl_app.privacy.accountants import (
    FlowerAccountant,
    GDPAccountant,
    GDPEvent,
    SampledGaussianAccountant,
    SampledGaussianEvent,
    epsilon_after,
    gdp_privacy_config,
    privacy_config,
    run_sampling,
)
from fl_app.privacy.accountants.events import as_gaussian_privacy_event
from fl_app.privacy.fdp import GDPBound


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
    def compose(self, event: Any, count: int = 1) -> None:
        """Account ``count`` releases that each make ``event`` (a mechanism's
        :meth:`~fl_app.privacy.pipeline.Mechanism.privacy_event`); an event this ledger cannot account is refused."""

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
    """The subsampled Gaussian mechanism of a run that samples ``population`` clients by ``sampling``.

    ``accountant`` is a method name (``rdp``, ``prv``, ``pld``: a
    :class:`~fl_app.privacy.accountants.SampledGaussianAccountant` is built) or an accountant with Flower's
    ``PrivacyAccountant`` interface, which must be configured for this run: its population M, and its sampling
    method the run's (Poisson: POISSON, or NO_AMPLIFICATION, a valid but looser bound that ignores the sampling;
    fixed-size: WITHOUT_REPLACEMENT). Ours compose :class:`~fl_app.privacy.accountants.SampledGaussianEvent` (σ, q);
    any other composes Flower's ``GaussianPrivacyEvent`` with m = qM, which must be a whole number, and the
    multiplier in its relation's terms (σ/2 under replace-one: the sum moves by 2C).
    """

    def __init__(
        self,
        delta: float,
        accountant: AccountantName | PrivacyAccountant,
        sampling: AmplifiedSampling,
        population: int | None,
    ) -> None:
        super().__init__(delta)
        self.sampling: AmplifiedSampling = sampling
        if isinstance(accountant, str):
            self.accountant: PrivacyAccountant = SampledGaussianAccountant(
                privacy_config(delta, sampling, population), accountant
            )
            return
        if not isinstance(accountant, FlowerAccountant):
            raise TypeError(
                f"accountant must be a method name or have Flower's PrivacyAccountant interface: {accountant!r}"
            )
        config = accountant.config
        if config.population_size != population:
            raise ValueError(
                f"the accountant's population_size {config.population_size} is not the run's population "
                f"M = {population}"
            )
        accounted = run_sampling(config)
        if accounted != sampling and not (sampling == "poisson" and accounted is None):
            raise ValueError(
                f"the accountant's sampling_method {config.sampling_method.value!r} does not account the run's "
                f"sampling={sampling!r} (poisson: 'poisson' or 'no-amplification'; fixed: 'without-replacement')"
            )
        self.accountant = accountant

    @property
    def rounds(self) -> int:
        return self.accountant.num_releases

    def step(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> None:
        event = self._event(noise_multiplier, sample_rate, rounds)
        if rounds:
            self.accountant.compose(event, rounds)

    def compose(self, event: Any, count: int = 1) -> None:
        if not isinstance(event, SampledGaussianEvent):
            raise TypeError(f"a sampled-Gaussian ledger accounts SampledGaussianEvent releases, not {event!r}")
        self.step(event.noise_multiplier, event.sample_rate, count)

    def epsilon_at(self, delta: float) -> float:
        return self.accountant.get_epsilon(delta)

    def projected_epsilon(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> float:
        event = self._event(noise_multiplier, sample_rate, rounds)
        if not rounds:
            return self.epsilon()
        return epsilon_after(self.accountant, event, rounds, self.delta)

    def _event(self, noise_multiplier: float, sample_rate: float, rounds: int) -> Any:
        if isinstance(rounds, bool) or int(rounds) != rounds or rounds < 0:
            raise ValueError(f"rounds must be a non-negative int, got {rounds!r}")
        event = SampledGaussianEvent(noise_multiplier, sample_rate)
        if isinstance(self.accountant, SampledGaussianAccountant):
            return event
        return as_gaussian_privacy_event(event, self.accountant.config)

    def state_dict(self) -> dict[str, Any]:
        return {"accountant": self.accountant.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.accountant.load_state_dict(state["accountant"])

    def claim(self) -> dict[str, Any]:
        epsilon, poisson = self.epsilon(), self.sampling == "poisson"
        sampling_event = "poisson" if poisson else "fixed-size without replacement"
        if self.accountant.config.sampling_method is SamplingMethod.NO_AMPLIFICATION:
            sampling_event += " (accounted without amplification)"
        return {
            "statement": f"client-level ({epsilon:.4g}, {self.delta:.3g})-DP",
            "accountant": accountant_name(self.accountant),
            "sampling_event": sampling_event,
            "neighbouring": "add/remove one client" if poisson else "replace one client",
            "epsilon": epsilon,
            "delta": self.delta,
            "rounds_accounted": self.rounds,
        }


def accountant_name(accountant: PrivacyAccountant) -> str:
    """``run.json``'s name of an accountant: our method (``rdp``, ``prv``, ``pld``), ``flwr-rdp`` for Flower's
    ``RdpAccountant``, else the class's qualified name."""
    if isinstance(accountant, SampledGaussianAccountant):
        return accountant.method
    if isinstance(accountant, RdpAccountant):
        return "flwr-rdp"
    return f"{type(accountant).__module__}.{type(accountant).__qualname__}"


class GDPLedger(PrivacyLedger):
    """T releases of one mechanism whose privacy after T releases is the μ-GDP bound ``bound(T)``, accounted by a
    :class:`~fl_app.privacy.accountants.GDPAccountant` (``.accountant``).

    ``bound`` is called with the number of releases (≥ 1); the (σ, q) of :meth:`step` are the strategy's and do
    not enter the bound, which is stated in the mechanism's own parameters (seed 004: V, K, m, σ, L). ``population``
    (the run's M) is metadata of the accountant's config; without it the bound's m stands in.
    """

    def __init__(
        self,
        delta: float,
        bound: Callable[[int], GDPBound],
        describe_source: Callable[[], str],
        population: int | None = None,
        label: str = "gdp (seed 004)",
    ) -> None:
        super().__init__(delta)
        self.bound = bound
        self.describe_source = describe_source
        #: run.json's ``accountant``: where the bound comes from.
        self.label = label
        first = bound(1)  # parameters the theorem does not admit (e.g. alpha <= L) fail here, before any round
        if population is None:
            population = max(1, round(first.parameters.get("m", 1)))
        self.accountant = GDPAccountant(gdp_privacy_config(delta, population), bound, describe_source)

    @property
    def rounds(self) -> int:
        return self.accountant.num_releases

    @property
    def mu(self) -> float:
        """μ of the bound after the releases so far (0 before the first)."""
        return self.accountant.mu

    def step(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> None:
        if rounds:
            self.accountant.compose(GDPEvent(), int(rounds))

    def compose(self, event: Any, count: int = 1) -> None:
        if not isinstance(event, GDPEvent):
            raise TypeError(f"the GDP ledger accounts GDPEvent releases (seed 004's bound), not {event!r}")
        self.accountant.compose(event, count)

    def epsilon_at(self, delta: float) -> float:
        return self.accountant.get_epsilon(delta)

    def projected_epsilon(self, noise_multiplier: float, sample_rate: float, rounds: int = 1) -> float:
        if not rounds:
            return self.epsilon()
        return self.accountant.epsilon_after(GDPEvent(), int(rounds), self.delta)

    def uncovered(self, reason: str) -> str:
        # The paper's value is still stated: it is what the paper claims, reported but not vouched for.
        return f"not covered: {reason}; paper bound {self.claim()['statement']}"

    def state_dict(self) -> dict[str, Any]:
        return self.accountant.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.accountant.load_state_dict(state)

    def claim(self) -> dict[str, Any]:
        bound, epsilon = self.bound(self.rounds), self.epsilon()
        return {
            "statement": f"({epsilon:.4g}, {self.delta:.3g})-DP from {self.mu:.4g}-GDP ({self.describe_source()})",
            "accountant": self.label,
            "gdp_mu": self.mu,
            "epsilon": epsilon,
            "delta": self.delta,
            "bound": bound.describe(),
            "rounds_accounted": self.rounds,
        }
