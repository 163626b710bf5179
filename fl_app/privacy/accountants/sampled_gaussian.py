"""The sampled Gaussian mechanism of DP-FedAvg / DP-FedSAM behind Flower's ``PrivacyAccountant`` interface.

:class:`SampledGaussianAccountant` composes the rounds' (σ, q) segments with the code of
:mod:`fl_app.privacy.accountants` (docs/mechanisms.md, 6), which it holds and does not repeat:

- Poisson sampling, add/remove-one adjacency: RDP of the Poisson-subsampled Gaussian (Mironov, Talwar, Zhang 2019,
  through Opacus' ``RDPAccountant`` orders and series; DP-FedSAM journal Thm 2), the PRV accountant of Gopi, Lee,
  Wutschitz 2021 (Opacus ``PRVAccountant``) or the PLD accountant (dp_accounting, Doroshenko et al. 2022).
- Fixed-size sampling of m = qM without replacement, replace-one adjacency: RDP of Wang, Balle, Kasiviswanathan 2019
  (dp_accounting ``SampledWithoutReplacementDpEvent``), with the replace-one sensitivity 2C (multiplier σ/2).

It composes Flower's ``GaussianPrivacyEvent`` (q = m/M; the multiplier in dp_accounting's sense, see
:mod:`~fl_app.privacy.accountants.events`) and our :class:`~fl_app.privacy.accountants.events.SampledGaussianEvent`
(a run's σ and any q). On the same events its RDP equals Flower's ``RdpAccountant`` wherever the two libraries'
RDP curves agree: at every integer order, and for fixed-size sampling everywhere (both are dp_accounting's). At a
fractional order Opacus sums the binomial series of Mironov et al. with its signs, dp_accounting 0.6 sums the terms'
absolute values (``_log_comb`` is log|binom(α, i)|), a larger, still valid bound; so where the optimal order is
fractional Flower's ε is larger than ours by up to ~1% (tests/privacy/test_accountants.py pins both).

``state_dict()`` is today's ``fl_app.privacy.accountants.CompositionHistory.state_dict()`` plus a ``config`` entry,
so checkpoints written before this class load, and today's code loads this class's.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, ClassVar

from flwr.supercore.privacy_accounting import (
    GaussianPrivacyEvent,
    PrivacyAccountant,
    PrivacyConfig,
    PrivacySpent,
)

from fl_app.core.choices import AccountantName, Sampling
from fl_app.privacy.accountants.checks import Segment, fixed_sample_size
from fl_app.privacy.accountants.composition import delta_from_history, epsilon_and_order_from_history
from fl_app.privacy.accountants.events import SampledGaussianEvent, as_sampled_gaussian
from fl_app.privacy.accountants.history import CompositionHistory
from fl_app.privacy.accountants.interface import epsilon_limit, run_sampling

__all__ = ["SampledGaussianAccountant"]

#: The config fields a state must agree on to be loaded (``max_epsilon`` is a budget, not part of what was spent).
_ACCOUNTING_FIELDS = ("target_delta", "population_size", "neighboring_relation", "sampling_method")


class SampledGaussianAccountant(PrivacyAccountant):
    """ε of the sampled Gaussian rounds of one run, by ``method`` (``rdp``, ``prv`` or ``pld``; fixed-size sampling
    only ``rdp``), for the sampling of ``config`` (POISSON or WITHOUT_REPLACEMENT; NO_AMPLIFICATION is refused: this
    accountant accounts the sampling the run does)."""

    #: The method when the constructor is given none; the registry's classes fix it (:meth:`with_method`).
    default_method: ClassVar[AccountantName] = "rdp"
    _fixed_method: ClassVar[bool] = False

    def __init__(self, config: PrivacyConfig, method: AccountantName | None = None) -> None:
        if not isinstance(config, PrivacyConfig):
            raise TypeError(f"config must be Flower's PrivacyConfig, got {type(config).__name__}")
        if method is None:
            method = type(self).default_method
        elif type(self)._fixed_method and method != type(self).default_method:
            raise ValueError(f"{type(self).__name__} accounts by {type(self).default_method!r}, not {method!r}")
        sampling = run_sampling(config)
        if sampling is None:
            raise ValueError(
                f"sampling_method={config.sampling_method.value!r}: the sampled Gaussian accountant accounts the "
                "sampling a run does (poisson or without-replacement); no-amplification accounting is Flower's "
                "RdpAccountant ('flower-rdp')"
            )
        self._config = config
        # The (σ, q, rounds) history and its ε: fl_app/privacy/accountants/history.py (validates method and sampling).
        self._composition = CompositionHistory(method, sampling, config.population_size)

    @classmethod
    @functools.cache
    def with_method(cls, method: AccountantName) -> type[SampledGaussianAccountant]:
        """The subclass whose accountants account by ``method`` (a registry entry: a name maps to a class)."""
        CompositionHistory(method)  # an unknown method fails here, not at the first release
        name = f"{method.upper()}SampledGaussianAccountant"
        return type(
            name,
            (cls,),
            {
                "default_method": method,
                "_fixed_method": True,
                "__module__": cls.__module__,
                "__qualname__": name,
                "__doc__": f"{cls.__name__} with method={method!r}.",
            },
        )

    # --- Flower's interface ---------------------------------------------------------------------------------------

    @property
    def config(self) -> PrivacyConfig:
        return self._config

    @property
    def num_releases(self) -> int:
        return self._composition.steps

    def compose(self, event: GaussianPrivacyEvent | SampledGaussianEvent, count: int = 1) -> None:  # type: ignore[override]
        sigma, rate = self._segment(event, count)
        self._composition.step(sigma, rate, count)

    def get_epsilon(self, delta: float) -> float:
        return self._composition.get_epsilon(delta)

    def get_delta(self, epsilon: float) -> float:
        """δ(ε) of the releases so far (:func:`fl_app.privacy.accountants.delta_from_history`: direct for RDP and PLD,
        a search over ε(δ) for PRV, ~2 s)."""
        return delta_from_history(self.history, epsilon, self.method, self.sampling, self.population)

    def get_privacy_spent(self, delta: float | None = None) -> PrivacySpent:
        target = self._config.target_delta if delta is None else delta
        epsilon, order = epsilon_and_order_from_history(
            self.history, target, self.method, self.sampling, self.population
        )
        return PrivacySpent(
            epsilon=epsilon,
            delta=target,
            num_releases=self.num_releases,
            accounting_method=self.method,
            optimal_order=order,
        )

    def would_exceed(  # type: ignore[override]
        self, event: GaussianPrivacyEvent | SampledGaussianEvent, max_epsilon: float | None = None, count: int = 1
    ) -> bool:
        """Whether ε(target δ) after ``count`` more ``event`` would exceed ``max_epsilon`` (else the config's); the
        accountant is not changed."""
        return self.epsilon_after(event, count) > epsilon_limit(self._config, max_epsilon)

    def state_dict(self) -> dict[str, object]:
        """JSON-serialisable: ``fl_app.privacy.accountants.CompositionHistory.state_dict()`` and ``config``."""
        config = self._config
        return {
            **self._composition.state_dict(),
            "config": {
                "target_delta": config.target_delta,
                "population_size": config.population_size,
                "neighboring_relation": config.neighboring_relation.value,
                "sampling_method": config.sampling_method.value,
                "max_epsilon": config.max_epsilon,
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # type: ignore[override]
        """Restore :meth:`state_dict`'s state, or the state of today's ``CompositionHistory`` (no
        ``config``; for Poisson sampling a saved population of None, which ε does not depend on, is accepted).

        Raises:
            ValueError: the state was saved for another method, sampling, population or δ.
        """
        if "compositions" in state and "history" not in state:
            raise ValueError("accountant state is a Flower RdpAccountant's (compositions), not a sampled Gaussian one")
        saved_config = state.get("config")
        if saved_config is not None:
            if not isinstance(saved_config, Mapping):
                raise ValueError(f"accountant state's config must be a dictionary, got {saved_config!r}")
            ours = self.state_dict()["config"]
            assert isinstance(ours, dict)
            differ = {k: saved_config.get(k) for k in _ACCOUNTING_FIELDS if saved_config.get(k) != ours[k]}
            if differ:
                raise ValueError(f"accountant state was saved for config {differ}, not {ours}")
        legacy = dict(state)
        legacy.pop("config", None)
        if legacy.get("population", self.population) is None and legacy.get("sampling") == "poisson":
            legacy["population"] = self.population
        self._composition.load_state_dict(legacy)

    # --- beyond Flower's interface --------------------------------------------------------------------------------

    @property
    def method(self) -> AccountantName:
        """``rdp``, ``prv`` or ``pld``: Flower's ``PrivacySpent.accounting_method`` and ``run.json``'s accountant."""
        return self._composition.accountant

    @property
    def sampling(self) -> Sampling:
        """The run's ``privacy.sampling`` this accountant accounts (``poisson`` or ``fixed``)."""
        return self._composition.sampling

    @property
    def population(self) -> int:
        return self._config.population_size

    @property
    def history(self) -> list[Segment]:
        """The (σ, q, rounds) segments composed so far, σ in the run's terms (noise std over C)."""
        return self._composition.history

    def epsilon_after(
        self, event: GaussianPrivacyEvent | SampledGaussianEvent, count: int = 1, delta: float | None = None
    ) -> float:
        """ε(δ) after ``count`` more ``event`` (δ: the config's ``target_delta`` if None); nothing is composed."""
        sigma, rate = self._segment(event, count)
        target = self._config.target_delta if delta is None else delta
        return self._composition.epsilon_after(count, sigma, rate, target)

    def _segment(self, event: GaussianPrivacyEvent | SampledGaussianEvent, count: int) -> tuple[float, float]:
        if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
            raise ValueError(f"count must be a positive integer, got {count!r}")
        if isinstance(event, GaussianPrivacyEvent) and event.population_size != self._config.population_size:
            raise ValueError(
                "Privacy event population_size does not match PrivacyConfig: "
                f"{event.population_size} != {self._config.population_size}"
            )
        sampled = as_sampled_gaussian(event, self._config.neighboring_relation)
        if self.sampling == "fixed":
            fixed_sample_size(sampled.sample_rate, self.population)  # fail on the event, not on ε
        return sampled.noise_multiplier, sampled.sample_rate

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(method={self.method!r}, sampling={self.sampling!r}, "
            f"population={self.population}, releases={self.num_releases})"
        )
