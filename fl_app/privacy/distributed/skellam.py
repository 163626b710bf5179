"""The distributed Skellam mechanism (Agarwal, Kairouz, Liu, "The Skellam Mechanism for Differentially Private
Federated Learning", NeurIPS 2021, §4 and Algorithm 1): its noise and its parameters.

Noise: ``Sk(v) = Poisson(v/2) − Poisson(v/2)``, integer, symmetric, variance ``v``. A sum of independent Skellam
variables is Skellam with the summed variance, so when each of ``n`` clients adds ``Sk(v / n_min)`` to its integer
vector, the sum of any ``n ≥ n_min`` of them carries exactly ``Sk(n·v / n_min)``, at least ``Sk(v)``: the noise
the accountant is owed (``fl_app.privacy.accountants.skellam``) is there even when clients drop out, as long as
``n_min`` survive (the secure aggregation threshold). This closure is why Skellam is chosen over the distributed
discrete Gaussian, whose sum is not a discrete Gaussian and whose bound pays a term for the difference.

Parameters (:class:`SkellamParameters`), from the clip norm C, the dimension d, the clients n, the noise multiplier σ
and the bit width b:

- the integer sensitivity ``Δ2 = rounded_norm_bound(s·C, d', β)`` (``fl_app.privacy.distributed.encoding``) and the
  sum's variance ``v = (σ·Δ2)²``: σ is the noise std over the ℓ2 sensitivity of the integers actually summed;
- the scale ``s``: the largest for which :func:`overflow_probability` — the probability that some coordinate of the
  round's sum reaches the detection band ``2^(b−2)`` — is at most the target. A larger s loses less to rounding;
  a smaller one wraps less.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fl_app.privacy.distributed.encoding import detection_threshold, l1_sensitivity, rounded_norm_bound
from fl_app.privacy.distributed.rotation import padded_dimension

__all__ = ["SkellamParameters", "overflow_probability", "skellam_noise", "skellam_tail"]

#: numpy's Poisson sampler takes a mean up to about 9.2e18; the sum's noise std must stay below 2^31.
MAX_POISSON_MEAN = 9.0e18
#: The bit widths offered: 8 for tests of the wrap, 36 at most so that the sum's variance fits the sampler.
MIN_BITS, MAX_BITS = 8, 36


def skellam_noise(size: int, variance: float, rng: np.random.Generator) -> np.ndarray:
    """``size`` independent draws of ``Sk(variance)`` (int64): Poisson(v/2) − Poisson(v/2)."""
    if not (variance >= 0 and math.isfinite(variance)):
        raise ValueError(f"variance must be finite and non-negative, got {variance!r}")
    if variance / 2.0 > MAX_POISSON_MEAN:
        raise ValueError(f"a Skellam variance of {variance:.3g} is past numpy's Poisson sampler")
    if variance == 0.0:
        return np.zeros(size, dtype=np.int64)
    mean = variance / 2.0
    return rng.poisson(mean, size).astype(np.int64) - rng.poisson(mean, size).astype(np.int64)


def skellam_tail(t: float, variance: float) -> float:
    """A Chernoff bound on ``P(Sk(v) ≥ t)`` (and, by symmetry, on ``P(Sk(v) ≤ −t)``), t ≥ 0:

        exp( v·(√(1 + u²) − 1) − t·asinh(u) ),  u = t / v,

    the moment generating function ``E e^(λX) = exp(v(cosh λ − 1))`` at its best λ = asinh(u).
    """
    if t <= 0:
        return 1.0
    if variance <= 0:
        return 0.0
    u = t / variance
    exponent = variance * (u * u / (math.sqrt(1.0 + u * u) + 1.0)) - t * math.asinh(u)
    return math.exp(min(exponent, 0.0))


def overflow_probability(
    scale: float, clip_norm: float, padded: int, clients: int, noise_std: float, band: float
) -> float:
    """A bound on P(some coordinate of the round's integer sum has ``|Z_j| ≥ band``), union over the ``padded``
    coordinates.

    ``Z_j = S_j + E_j + N_j``: ``S_j = s·(HD·Σx)_j`` is a Rademacher sum in the random signs with
    ``‖Σx‖ ≤ clients·C`` (the worst case: every update aligned), so ``P(|S_j| ≥ t1) ≤ 2 exp(−t1² d' / (2(s·n·C)²))``;
    the rounding errors give ``|E_j| < n``; the noise ``N_j ~ Sk(noise_std²)`` has :func:`skellam_tail`.
    The band less ``n`` is split between ``t1`` and ``t2`` in proportion to the two standard deviations.
    """
    signal_std = scale * clients * clip_norm / math.sqrt(padded)
    room = band - clients
    if room <= 0:
        return 1.0
    total = signal_std + noise_std
    t1 = room * signal_std / total if total > 0 else room
    t2 = room - t1
    signal = 2.0 * math.exp(-(t1**2) / (2.0 * signal_std**2)) if signal_std > 0 else 0.0
    noise = 2.0 * skellam_tail(t2, noise_std**2)
    return min(1.0, padded * (signal + noise))


@dataclass(frozen=True)
class SkellamParameters:
    """The distributed Skellam mechanism of one round, chosen from its inputs (module docstring).

    Args:
        clip_norm: C, the ℓ2 bound of each client's update.
        dimension: d, the number of parameters.
        min_clients: n_min, the fewest clients whose noise the sum must carry (the secure aggregation threshold):
            each client adds ``Sk(v / n_min)``.
        max_clients: the most clients summed in a round (the round's sample), for the overflow bound.
        noise_multiplier: σ, the sum's noise std over its integer ℓ2 sensitivity Δ2.
        bits: b, the modulus 2^b of the sum.
        beta: the conditional rounding's failure probability β (0: no conditioning).
        overflow_target: the overflow probability the scale is chosen for.
    """

    clip_norm: float
    dimension: int
    min_clients: int
    max_clients: int
    noise_multiplier: float
    bits: int = 32
    beta: float = math.exp(-0.5)
    overflow_target: float = 1e-9
    scale: float = field(init=False)

    def __post_init__(self) -> None:
        self._check()
        object.__setattr__(self, "scale", self._largest_scale())

    @property
    def padded(self) -> int:
        return padded_dimension(self.dimension)

    @property
    def l2_sensitivity(self) -> float:
        """Δ2: the norm bound of one client's integer vector after conditional rounding."""
        return rounded_norm_bound(self.scale * self.clip_norm, self.padded, self.beta)

    @property
    def l1_sensitivity(self) -> float:
        return l1_sensitivity(self.l2_sensitivity, self.padded)

    @property
    def variance(self) -> float:
        """v, the variance of the noise the sum of ``min_clients`` clients carries: ``(σ·Δ2)²``."""
        return (self.noise_multiplier * self.l2_sensitivity) ** 2

    @property
    def effective_noise_multiplier(self) -> float:
        """The decoded sum's noise std in units of C, σ·Δ2/(s·C): the number to set beside central DP's σ (the
        rounding's norm inflation makes it exceed σ, the more so the fewer the bits)."""
        return self.noise_multiplier * self.l2_sensitivity / (self.scale * self.clip_norm)

    @property
    def client_variance(self) -> float:
        """Each client's share, ``v / n_min``."""
        return self.variance / self.min_clients

    @property
    def overflow(self) -> float:
        """The bound on this round's overflow probability (:func:`overflow_probability` at the chosen scale)."""
        return self.overflow_at(self.scale)

    def overflow_at(self, scale: float) -> float:
        """The overflow bound (:func:`overflow_probability`) this round would have at ``scale``."""
        l2 = rounded_norm_bound(scale * self.clip_norm, self.padded, self.beta)
        noise_std = self.noise_multiplier * l2 * math.sqrt(self.max_clients / self.min_clients)
        band = float(detection_threshold(self.bits))
        return overflow_probability(scale, self.clip_norm, self.padded, self.max_clients, noise_std, band)

    def _largest_scale(self) -> float:
        high = float(detection_threshold(self.bits)) / self.clip_norm
        low = high
        for _ in range(200):  # halve until the bound holds, then bisect between low and 2·low
            if self.overflow_at(low) <= self.overflow_target:
                break
            low /= 2.0
        else:
            raise ValueError(
                f"no scale keeps the overflow probability at {self.overflow_target:g} with {self.bits} bits, "
                f"{self.max_clients} clients and d = {self.dimension}: raise bits or lower max_clients"
            )
        high = min(high, 2.0 * low)
        while high / low - 1.0 > 1e-9:
            middle = 0.5 * (low + high)
            low, high = (middle, high) if self.overflow_at(middle) <= self.overflow_target else (low, middle)
        client_mean = (self.noise_multiplier * rounded_norm_bound(low * self.clip_norm, self.padded, self.beta)) ** 2
        if client_mean / 2.0 / self.min_clients > MAX_POISSON_MEAN:
            raise ValueError(f"the noise of {self.bits} bits is past numpy's Poisson sampler: lower bits")
        return low

    def _check(self) -> None:
        if not (self.clip_norm > 0 and math.isfinite(self.clip_norm)):
            raise ValueError(f"clip_norm must be positive and finite, got {self.clip_norm!r}")
        for name in ("dimension", "min_clients", "max_clients"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.max_clients < self.min_clients:
            raise ValueError(f"max_clients ({self.max_clients}) is below min_clients ({self.min_clients})")
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise ValueError(f"noise_multiplier must be positive and finite, got {self.noise_multiplier!r}")
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not MIN_BITS <= self.bits <= MAX_BITS:
            raise ValueError(f"bits must be an int in [{MIN_BITS}, {MAX_BITS}], got {self.bits!r}")
        if not 0.0 <= self.beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {self.beta!r}")
        if not 0.0 < self.overflow_target < 1.0:
            raise ValueError(f"overflow_target must be in (0, 1), got {self.overflow_target!r}")
