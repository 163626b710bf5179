"""The privacy events a release makes, in the terms each accountant composes.

- Flower's ``GaussianPrivacyEvent(noise_multiplier, sample_size, population_size)`` is accepted by every accountant
  of the sampled Gaussian mechanism. Its multiplier is dp_accounting's: the noise std over the L2 sensitivity
  *under the accountant's neighbouring relation* (Flower's ``RdpAccountant`` hands it to dp_accounting unchanged).
- :class:`SampledGaussianEvent` ``(σ, q)`` is a round of DP-FedAvg / DP-FedSAM as the strategy states it: σ is the
  noise std over the clip norm C (docs/mechanisms.md, 4), and q need not make q·M a whole number (Poisson sampling). A
  round that releases a noisy count too (adaptive clipping, noisy client statistics) is one event at the joint
  multiplier (σ⁻² + σ_s⁻²)^(-1/2) (Andrew et al. 2021, Thm 1), which the strategy computes; the event carries
  only that σ.
- :class:`GDPEvent` is one release of Noisy-FedAvg / Noisy-FedProx, whose T-fold composition the μ-GDP bound of
  seed 004 (Thms 3 and 4) states directly: the release has no parameter of its own in the bound.

The two multipliers differ where the relation is replace-one (fixed-size sampling): replacing one client's clipped
update moves the sum by up to 2C, so a run's σ is a dp_accounting multiplier of σ/2
(:data:`~fl_app.privacy.accountants.REPLACE_ONE_SENSITIVITY_FACTOR`, docs/mechanisms.md "Fixed-size sampling").
:func:`as_sampled_gaussian` and :func:`as_gaussian_privacy_event` convert between them; nothing else does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flwr.supercore.privacy_accounting import GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig

from fl_app.privacy.accountants.checks import fixed_sample_size
from fl_app.privacy.accountants.composition import REPLACE_ONE_SENSITIVITY_FACTOR

__all__ = [
    "GDPEvent",
    "GaussianPrivacyEvent",
    "SampledGaussianEvent",
    "as_gaussian_privacy_event",
    "as_sampled_gaussian",
]


@dataclass(frozen=True)
class SampledGaussianEvent:
    """One release of the sampled Gaussian mechanism: noise std σC on the sum of C-clipped updates of a sample drawn
    at rate q (Poisson) or of exactly qM clients (fixed-size).

    σ = 0 is accepted and costs ε = ∞ (no noise, no privacy); q = 0 costs nothing.
    """

    noise_multiplier: float
    sample_rate: float

    def __post_init__(self) -> None:
        sigma, rate = _real("noise_multiplier", self.noise_multiplier), _real("sample_rate", self.sample_rate)
        if not (sigma >= 0 and math.isfinite(sigma)):
            raise ValueError(f"noise_multiplier must be a non-negative finite number, got {self.noise_multiplier!r}")
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"sample_rate must be in [0, 1], got {self.sample_rate!r}")
        object.__setattr__(self, "noise_multiplier", sigma)
        object.__setattr__(self, "sample_rate", rate)


@dataclass(frozen=True)
class GDPEvent:
    """One release of a mechanism whose privacy after T releases is a μ-GDP bound of T (Noisy-FedAvg/FedProx)."""


def _real(name: str, value: object) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a number, got {value!r}") from exc


def _sensitivity_factor(relation: NeighboringRelation) -> float:
    """The L2 sensitivity of the sum of C-clipped updates under ``relation``, in units of C."""
    return REPLACE_ONE_SENSITIVITY_FACTOR if relation is NeighboringRelation.REPLACE_ONE else 1.0


def as_sampled_gaussian(
    event: GaussianPrivacyEvent | SampledGaussianEvent, relation: NeighboringRelation
) -> SampledGaussianEvent:
    """``event`` as a run's (σ, q): Flower's multiplier times the sensitivity factor of ``relation``, q = m/M."""
    if isinstance(event, SampledGaussianEvent):
        return event
    if isinstance(event, GaussianPrivacyEvent):
        return SampledGaussianEvent(
            event.noise_multiplier * _sensitivity_factor(relation), event.sample_size / event.population_size
        )
    raise TypeError(
        "a sampled Gaussian accountant composes GaussianPrivacyEvent or SampledGaussianEvent, not "
        f"{type(event).__name__}"
    )


def as_gaussian_privacy_event(event: SampledGaussianEvent, config: PrivacyConfig) -> GaussianPrivacyEvent:
    """``event`` as Flower's event for an accountant configured by ``config``: m = qM clients (which must be a whole
    number) of ``config.population_size``, multiplier σ over the sensitivity factor of its neighbouring relation.

    Raises:
        ValueError: q·M is not an integer, or σ = 0 or q = 0 (Flower's event needs a positive multiplier and sample).
    """
    try:
        size = fixed_sample_size(event.sample_rate, config.population_size)
    except ValueError as exc:
        raise ValueError(f"Flower's GaussianPrivacyEvent states the sample size m = q*M: {exc}") from exc
    if event.noise_multiplier == 0.0 or size == 0:
        raise ValueError(
            f"Flower's GaussianPrivacyEvent needs σ > 0 and m ≥ 1 (σ = 0 is not private: ε = ∞), got "
            f"σ = {event.noise_multiplier}, m = {size}"
        )
    return GaussianPrivacyEvent(
        noise_multiplier=event.noise_multiplier / _sensitivity_factor(config.neighboring_relation),
        sample_size=size,
        population_size=config.population_size,
    )
