"""A clipped update as integers modulo ``2^b``, and the sum of many back (Kairouz, Liu, Steinke, ICML 2021, §4 and
Algorithm 1's conditional randomised rounding; Agarwal, Kairouz, Liu, NeurIPS 2021, §4).

Encoding one client's clipped, rotated update ``y`` (``‖y‖ ≤ C``) at scale ``s``:

1. **Conditional randomised rounding**: each entry of ``s·y`` goes to its floor or ceiling, up with probability its
   fractional part (unbiased), and the whole vector is drawn again until its norm is at most
   :func:`rounded_norm_bound` ``(sC, d', β)``; a draw passes with probability ≥ 1 − β, so the retries are few, and
   the bound, not ``sC``, is the integer vector's ℓ2 sensitivity the accountant uses (the rounding's norm
   inflation). With β = 0 nothing is redrawn: ``‖x̃ − sy‖ < √d'`` always.
2. The noise (``fl_app.privacy.distributed.skellam``) is added to the integers, and the result is taken modulo
   ``2^b`` (:func:`to_modular`): what secure aggregation masks and sums.

Decoding the sum ``z`` of the survivors' vectors modulo ``2^b``: the centred representative in
``[−2^(b−1), 2^(b−1))`` (:func:`centered`), divided by ``s``. The parameters make a wrap (a true coordinate
outside that range) improbable; :func:`wrapped_coordinates` flags every coordinate in the outer quarter band
``|z_j| ≥ 2^(b−2)``, which a true sum reaches with at most the stated overflow probability and which every wrap by
less than ``2^(b−2)`` lands in.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "RoundingFailed",
    "centered",
    "conditional_round",
    "detection_threshold",
    "l1_sensitivity",
    "rounded_norm_bound",
    "to_modular",
    "wrapped_coordinates",
]

#: The most times a vector is redrawn before rounding is declared failed (each draw fails with probability ≤ β).
MAX_ROUNDING_TRIES = 1000


class RoundingFailed(RuntimeError):
    """Conditional rounding found no draw within the bound (probability ≤ β^MAX_ROUNDING_TRIES if β was right)."""


def rounded_norm_bound(norm: float, dimension: int, beta: float) -> float:
    """The ℓ2 norm a vector of norm ≤ ``norm`` in ``dimension`` coordinates keeps after conditional randomised
    rounding with failure probability ``beta``:

        min( norm + √d,  √(norm² + d/4 + √(2 ln(1/β)) · (norm + √d / 2)) )

    The first term holds for every rounding (each entry moves by less than 1); the second holds for an
    unconditioned draw with probability ≥ 1 − β (Kairouz, Liu, Steinke 2021: the concentration of randomised
    rounding behind their Theorem 1's Δ2), and conditional rounding makes it hold always. β = 0 gives the first
    term. The authors' released accounting uses the same two terms (``rounded_l2_norm_bound``).
    """
    if not (norm >= 0 and math.isfinite(norm)):
        raise ValueError(f"norm must be finite and non-negative, got {norm!r}")
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must be in [0, 1), got {beta!r}")
    always = norm + math.sqrt(dimension)
    if beta == 0.0:
        return always
    squared = norm**2 + dimension / 4.0 + math.sqrt(2.0 * math.log(1.0 / beta)) * (norm + math.sqrt(dimension) / 2.0)
    return min(always, math.sqrt(squared))


def l1_sensitivity(l2_bound: float, dimension: int) -> float:
    """The ℓ1 norm of an integer vector of ℓ2 norm ≤ ``l2_bound`` in ``dimension`` coordinates:
    ``min(Δ2², √d·Δ2)`` (an integer entry has ``|x| ≤ x²``; Cauchy–Schwarz)."""
    return min(l2_bound**2, math.sqrt(dimension) * l2_bound)


def conditional_round(x: np.ndarray, bound: float, rng: np.random.Generator) -> np.ndarray:
    """An unbiased integer rounding of ``x`` (int64) with ℓ2 norm ≤ ``bound``, redrawn until it is.

    Raises:
        RoundingFailed: :data:`MAX_ROUNDING_TRIES` draws all exceeded ``bound`` (the bound was not one of
            :func:`rounded_norm_bound`'s for this vector).
    """
    values = np.asarray(x, dtype=np.float64)
    floor = np.floor(values)
    fraction = values - floor
    base = floor.astype(np.int64)
    limit = float(bound) ** 2
    for _ in range(MAX_ROUNDING_TRIES):
        rounded = base + (rng.random(values.shape) < fraction)
        if float(np.dot(rounded.astype(np.float64), rounded.astype(np.float64))) <= limit:
            return rounded
    raise RoundingFailed(f"no rounding of a vector of norm {np.linalg.norm(values):.6g} within {bound:.6g}")


def to_modular(x: np.ndarray, bits: int) -> np.ndarray:
    """``x mod 2^bits`` as uint64 (two's complement, then the low ``bits`` bits; bits ≤ 62, so that a sum of two
    residues and the centred representative fit in 64 bits)."""
    _check_bits(bits)
    return np.asarray(x, dtype=np.int64).astype(np.uint64) & np.uint64((1 << bits) - 1)


def centered(z: np.ndarray, bits: int) -> np.ndarray:
    """The representative of ``z mod 2^bits`` in ``[−2^(bits−1), 2^(bits−1))``, as int64."""
    _check_bits(bits)
    values = to_modular(np.asarray(z).astype(np.uint64).astype(np.int64), bits).astype(np.int64)
    return np.where(values >= (1 << (bits - 1)), values - (1 << bits), values)


def detection_threshold(bits: int) -> int:
    """``2^(bits−2)``: a decoded coordinate at least this large in magnitude is flagged as a possible wrap."""
    _check_bits(bits)
    return 1 << (bits - 2)


def wrapped_coordinates(z_centered: np.ndarray, bits: int) -> np.ndarray:
    """The indices of the centred sum's coordinates in the outer band ``|z_j| ≥ 2^(bits−2)`` (a wrap, or a true
    value within a factor 2 of one)."""
    return np.flatnonzero(np.abs(np.asarray(z_centered, dtype=np.int64)) >= detection_threshold(bits))


def _check_bits(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 8 <= bits <= 62:
        raise ValueError(f"bits must be an int in [8, 62], got {bits!r}")
