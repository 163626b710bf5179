"""The distributed Skellam mechanism behind Flower's ``PrivacyAccountant`` interface, for either adversary.

RDP of one release (Agarwal, Kairouz, Liu, NeurIPS 2021, the multi-dimensional Skellam bound): for the sum's noise
``Sk(v)`` of variance v per coordinate and integer ℓ2 / ℓ1 sensitivities Δ2, Δ1, at every integer order α > 1,

    ε(α) ≤ α·Δ2² / (2v) + min( ((2α − 1)·Δ2² + 6·Δ1) / (4v²),  3·Δ1 / (2v) ),

the Gaussian mechanism's α·Δ2²/(2v) plus a discreteness term that vanishes as v grows (:func:`skellam_rdp`).

Who is the adversary is the accountant's ``PrivacyConfig``:

- **the server** (honest-but-curious; it picks the sample, so sampling does not amplify against it):
  ``SamplingMethod.NO_AMPLIFICATION``: each release in which the client takes part costs ε(α) in full;
- **whoever sees only the released models** (the sample is secret from them): ``SamplingMethod.POISSON``, each
  release amplified at its sampling rate q by the Poisson-subsampled RDP bound for any mechanism (Zhu, Wang,
  "Poisson Subsampled Rényi Differential Privacy", ICML 2019, Thm 6; :func:`poisson_subsampled_rdp`).

Composition adds RDP; (ε, δ) is dp_accounting's conversion (``compute_epsilon`` / ``compute_delta``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp
from flwr.supercore.privacy_accounting import PrivacyAccountant, PrivacyConfig, PrivacySpent, SamplingMethod
from scipy.special import gammaln, logsumexp

from fl_app.privacy.accountants.interface import epsilon_limit

__all__ = ["SKELLAM_ORDERS", "SkellamAccountant", "SkellamEvent", "poisson_subsampled_rdp", "skellam_rdp"]

#: The integer RDP orders every Skellam account is evaluated at.
SKELLAM_ORDERS: tuple[int, ...] = (*range(2, 129), 160, 192, 256, 384, 512)


def skellam_rdp(order: int, variance: float, l2_sensitivity: float, l1_sensitivity: float) -> float:
    """ε(α) of one release of the Skellam mechanism at integer order α > 1 (module docstring)."""
    if isinstance(order, bool) or int(order) != order or order < 2:
        raise ValueError(f"the Skellam bound holds at integer orders > 1, got {order!r}")
    if variance <= 0:
        return math.inf
    a, v, l2sq = int(order), float(variance), float(l2_sensitivity) ** 2
    discrete = min(((2 * a - 1) * l2sq + 6.0 * l1_sensitivity) / (4.0 * v * v), 3.0 * l1_sensitivity / (2.0 * v))
    return a * l2sq / (2.0 * v) + discrete


def poisson_subsampled_rdp(order: int, rdp: Callable[[int], float], sample_rate: float) -> float:
    """ε'(α) of a mechanism with RDP ``rdp`` run on a Poisson sample at rate q (add/remove one), at integer α ≥ 2
    (Zhu & Wang 2019, Thm 6, the bound for any mechanism):

        (α−1)·ε'(α) ≤ log[ (1−q)^(α−1)(αq − q + 1) + C(α,2) q²(1−q)^(α−2) e^(ε(2))
                           + 3 Σ_{l=3..α} C(α,l) q^l (1−q)^(α−l) e^((l−1)ε(l)) ],

    never more than ``rdp(α)`` itself (sampling at q = 1 is the mechanism).
    """
    a, q = int(order), float(sample_rate)
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"sample_rate must be in [0, 1], got {sample_rate!r}")
    full = rdp(a)
    if q == 0.0:
        return 0.0
    if q == 1.0 or not math.isfinite(full):
        return full
    log_q, log_rest = math.log(q), math.log1p(-q)
    terms = [(a - 1) * log_rest + math.log(a * q - q + 1.0)]
    terms.append(_log_binom(a, 2) + 2 * log_q + (a - 2) * log_rest + rdp(2))
    for l in range(3, a + 1):  # noqa: E741 - the theorem's index
        terms.append(math.log(3.0) + _log_binom(a, l) + l * log_q + (a - l) * log_rest + (l - 1) * rdp(l))
    return min(full, float(logsumexp(terms)) / (a - 1))


def _log_binom(n: int, k: int) -> float:
    return float(gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1))


@dataclass(frozen=True)
class SkellamEvent:
    """One release of the distributed Skellam mechanism: the sum's noise variance v per coordinate (on the integer
    scale), the integer ℓ2 and ℓ1 sensitivities of one client, and the rate the round's sample was drawn at (used
    only by an accountant whose adversary does not see the sample)."""

    variance: float
    l2_sensitivity: float
    l1_sensitivity: float
    sample_rate: float = 1.0

    def __post_init__(self) -> None:
        for name in ("variance", "l2_sensitivity", "l1_sensitivity"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (float(value) >= 0 and math.isfinite(float(value))):
                raise ValueError(f"{name} must be finite and non-negative, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not 0.0 <= float(self.sample_rate) <= 1.0:
            raise ValueError(f"sample_rate must be in [0, 1], got {self.sample_rate!r}")
        object.__setattr__(self, "sample_rate", float(self.sample_rate))


@lru_cache(maxsize=256)
def _event_rdp(event: SkellamEvent, amplified: bool) -> np.ndarray:
    def rdp(order: int) -> float:
        return skellam_rdp(order, event.variance, event.l2_sensitivity, event.l1_sensitivity)

    if not amplified:
        return np.array([rdp(order) for order in SKELLAM_ORDERS])
    return np.array([poisson_subsampled_rdp(order, rdp, event.sample_rate) for order in SKELLAM_ORDERS])


class SkellamAccountant(PrivacyAccountant):
    """RDP composition of :class:`SkellamEvent` releases against the adversary ``config`` names (module docstring):
    ``NO_AMPLIFICATION`` (the server) or ``POISSON`` (whoever sees only the models)."""

    def __init__(self, config: PrivacyConfig) -> None:
        if not isinstance(config, PrivacyConfig):
            raise TypeError(f"config must be Flower's PrivacyConfig, got {type(config).__name__}")
        if config.sampling_method not in (SamplingMethod.NO_AMPLIFICATION, SamplingMethod.POISSON):
            raise ValueError(
                f"the Skellam accountant composes unamplified (the server) or Poisson-amplified releases, not "
                f"{config.sampling_method}"
            )
        self._config = config
        self._compositions: list[tuple[SkellamEvent, int]] = []

    @property
    def config(self) -> PrivacyConfig:
        return self._config

    @property
    def amplified(self) -> bool:
        """Whether sampling amplifies against this accountant's adversary."""
        return self._config.sampling_method is SamplingMethod.POISSON

    @property
    def num_releases(self) -> int:
        return sum(count for _, count in self._compositions)

    @property
    def compositions(self) -> tuple[tuple[SkellamEvent, int], ...]:
        """The releases composed so far, as (event, count) runs."""
        return tuple(self._compositions)

    def compose(self, event: SkellamEvent, count: int = 1) -> None:  # type: ignore[override]
        count = _checked(event, count)
        if self._compositions and self._compositions[-1][0] == event:
            self._compositions[-1] = (event, self._compositions[-1][1] + count)
        else:
            self._compositions.append((event, count))

    def rdp(self, extra: Sequence[tuple[SkellamEvent, int]] = ()) -> np.ndarray:
        """The composed RDP at :data:`SKELLAM_ORDERS`, with ``extra`` releases added (nothing is composed)."""
        total = np.zeros(len(SKELLAM_ORDERS))
        for event, count in (*self._compositions, *extra):
            total = total + count * _event_rdp(event, self.amplified)
        return total

    def get_epsilon(self, delta: float) -> float:
        return self._epsilon(self.rdp(), delta)

    def get_delta(self, epsilon: float) -> float:
        if not self._compositions:
            return 0.0
        return float(dp_rdp.compute_delta(SKELLAM_ORDERS, self.rdp(), epsilon)[0])

    def get_privacy_spent(self, delta: float | None = None) -> PrivacySpent:
        target = self._config.target_delta if delta is None else delta
        return PrivacySpent(
            epsilon=self.get_epsilon(target), delta=target, num_releases=self.num_releases, accounting_method="rdp"
        )

    def epsilon_after(self, event: SkellamEvent, count: int = 1, delta: float | None = None) -> float:
        """ε(δ) after ``count`` more ``event``; nothing is composed."""
        rdp = self.rdp([(event, _checked(event, count))])
        return self._epsilon(rdp, self._config.target_delta if delta is None else delta)

    def would_exceed(  # type: ignore[override]
        self, event: SkellamEvent, max_epsilon: float | None = None, count: int = 1
    ) -> bool:
        return self.epsilon_after(event, count) > epsilon_limit(self._config, max_epsilon)

    def state_dict(self) -> dict[str, object]:
        return {"skellam": [{**asdict(event), "count": count} for event, count in self._compositions]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # type: ignore[override]
        entries = state.get("skellam")
        if not isinstance(entries, list):
            raise ValueError("Skellam accountant state has no 'skellam' list")
        compositions = []
        for entry in entries:
            fields = dict(entry)
            count = fields.pop("count")
            event = SkellamEvent(**fields)
            compositions.append((event, _checked(event, count)))
        self._compositions = compositions

    @staticmethod
    def _epsilon(rdp: np.ndarray, delta: float) -> float:
        if not np.any(rdp):
            return 0.0
        return float(dp_rdp.compute_epsilon(SKELLAM_ORDERS, rdp, delta)[0])

    def __repr__(self) -> str:
        return f"SkellamAccountant(releases={self.num_releases}, amplified={self.amplified})"


def _checked(event: SkellamEvent, count: int) -> int:
    if not isinstance(event, SkellamEvent):
        raise TypeError(f"the Skellam accountant composes SkellamEvent, not {type(event).__name__}")
    if isinstance(count, bool) or not isinstance(count, int) or count <= 0:
        raise ValueError(f"count must be a positive integer, got {count!r}")
    return count
