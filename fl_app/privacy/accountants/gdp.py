"""Noisy-FedAvg / Noisy-FedProx behind Flower's ``PrivacyAccountant`` interface: a μ-GDP bound of the number of
releases (seed 004, Sun et al.: Thms 3 and 4 give μ after T rounds; Lemma 3 / Dong, Roth, Su 2022 convert μ-GDP to
(ε, δ)-DP: δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)).

The bound is stated in the mechanism's own parameters (V, K, m, σ, L, the schedule), not in a per-release (σ, q), so
a release is a :class:`~fl_app.privacy.accountants.events.GDPEvent` with no fields and the accountant's whole state
is the number of releases T: ``{"gdp_rounds": T}``, the state ``GDPLedger`` has always written.

The ``PrivacyConfig`` is descriptive here: the bound already accounts whatever the mechanism's participation gives
(Remark 3.2's m), so :func:`gdp_privacy_config` states NO_AMPLIFICATION (add/remove one), and only ``target_delta``
and ``max_epsilon`` enter the numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flwr.supercore.privacy_accounting import (
    NeighboringRelation,
    PrivacyAccountant,
    PrivacyConfig,
    PrivacySpent,
    SamplingMethod,
)

from fl_app.privacy.accountants.events import GDPEvent
from fl_app.privacy.accountants.interface import epsilon_limit
from fl_app.privacy.fdp import GDPBound, gdp_to_delta, gdp_to_epsilon

__all__ = ["GDPAccountant", "gdp_privacy_config"]


def gdp_privacy_config(delta: float, population: int, max_epsilon: float | None = None) -> PrivacyConfig:
    """The config of a GDP-bound accountant: δ, the run's M (metadata), no amplification by the accountant."""
    return PrivacyConfig(
        target_delta=float(delta),
        population_size=population,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION,
        max_epsilon=max_epsilon,
    )


class GDPAccountant(PrivacyAccountant):
    """T releases of one mechanism whose privacy after T releases is the μ-GDP bound ``bound(T)``.

    ``bound`` is called with the number of releases (≥ 1); ``description`` (a string, or a function giving one, so
    that it can name settings resolved later) says where the bound comes from, for the run's claim.
    """

    def __init__(
        self,
        config: PrivacyConfig,
        bound: Callable[[int], GDPBound],
        description: str | Callable[[], str] = "",
    ) -> None:
        if not isinstance(config, PrivacyConfig):
            raise TypeError(f"config must be Flower's PrivacyConfig, got {type(config).__name__}")
        self._config = config
        self.bound = bound
        self._description = description
        self._releases = 0
        self.bound(1)  # parameters the theorem does not admit (e.g. alpha <= L) fail here, before any release

    @property
    def config(self) -> PrivacyConfig:
        return self._config

    @property
    def num_releases(self) -> int:
        return self._releases

    @property
    def mu(self) -> float:
        """μ of the bound after the releases so far (0 before the first)."""
        return self.bound(self._releases).mu if self._releases else 0.0

    def describe(self) -> str:
        """Where the bound comes from (the ``description`` given)."""
        return self._description() if callable(self._description) else self._description

    def compose(self, event: GDPEvent, count: int = 1) -> None:  # type: ignore[override]
        self._releases += self._count(event, count)

    def get_epsilon(self, delta: float) -> float:
        return self._epsilon(self._releases, delta)

    def get_delta(self, epsilon: float) -> float:
        """δ(ε) of μ-GDP (Lemma 3) after the releases so far (0 before the first)."""
        return gdp_to_delta(self.mu, epsilon) if self._releases else 0.0

    def get_privacy_spent(self, delta: float | None = None) -> PrivacySpent:
        target = self._config.target_delta if delta is None else delta
        return PrivacySpent(
            epsilon=self.get_epsilon(target), delta=target, num_releases=self._releases, accounting_method="gdp"
        )

    def epsilon_after(self, event: GDPEvent, count: int = 1, delta: float | None = None) -> float:
        """ε(δ) of ``bound(T + count)`` (δ: the config's ``target_delta`` if None); nothing is composed."""
        releases = self._releases + self._count(event, count)
        return self._epsilon(releases, self._config.target_delta if delta is None else delta)

    def would_exceed(  # type: ignore[override]
        self, event: GDPEvent, max_epsilon: float | None = None, count: int = 1
    ) -> bool:
        return self.epsilon_after(event, count) > epsilon_limit(self._config, max_epsilon)

    def state_dict(self) -> dict[str, object]:
        return {"gdp_rounds": self._releases}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # type: ignore[override]
        if "gdp_rounds" not in state:
            raise ValueError("GDP accountant state has no 'gdp_rounds' entry")
        releases = state["gdp_rounds"]
        if isinstance(releases, bool) or int(releases) != releases or releases < 0:
            raise ValueError(f"gdp_rounds must be a non-negative integer, got {releases!r}")
        self._releases = int(releases)

    def _epsilon(self, releases: int, delta: float) -> float:
        if not releases:
            return 0.0
        bound = self.bound(releases)
        # The bound states ε at its own δ; any other δ is Lemma 3 again on its μ.
        return bound.epsilon if delta == bound.delta else gdp_to_epsilon(bound.mu, delta)

    @staticmethod
    def _count(event: GDPEvent, count: int) -> int:
        if not isinstance(event, GDPEvent):
            raise TypeError(
                f"a GDP-bound accountant composes GDPEvent (one release of the bound's own mechanism), not "
                f"{type(event).__name__}: the bound is stated in the mechanism's parameters, not a per-release (σ, q)"
            )
        if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
            raise ValueError(f"count must be a positive integer, got {count!r}")
        return count

    def __repr__(self) -> str:
        return f"GDPAccountant(releases={self._releases}, mu={self.mu:.6g})"
