"""Adaptive clipping: C follows a quantile of the clients' update norms, privately.

Andrew, Thakkar, McMahan, Ramaswamy, "Differentially Private Learning with Adaptive Clipping" (NeurIPS 2021),
Algorithm 1 (geometric update, Eq. 3), Theorem 1 (joint accounting). Every round t:

1. each sampled client i reports whether its update is clipped at the round's C_t: c_i = 1[‖Δ_i‖ > C_t]
   (the paper's b_i = 1[‖Δ_i‖ ≤ C_t] is 1 − c_i);
2. the server releases the centred count Σ_i (c_i − ½) + N(0, σ_b²) and estimates the clipped fraction
   f̃_t = (that) / m + ½ over the fixed denominator m = qM. Centring makes one client's contribution lie in
   [−½, ½]: sensitivity ½ under add/remove, so σ_b buys noise multiplier 2σ_b;
3. C_{t+1} = C_t · exp(−η_C · (b̃_t − γ)) with b̃_t = 1 − f̃_t the unclipped fraction: C moves geometrically until
   a fraction γ of the norms lies below it (γ is the target quantile of the norms).

**Accounting (Thm. 1).** The round releases the noised update sum (noise multiplier σ_Δ) and the noised count
(multiplier 2σ_b) of the same sampled clients: one Gaussian mechanism, subsampled once, with
z = (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2). The configured noise multiplier is that z; the update gets
σ_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2), which needs 2σ_b > z. Under replace-one adjacency (fixed-size sampling) both
sensitivities double (2C and 1), so the same z holds relative to the replace-one sensitivity the accountant uses.

Pure functions with explicit random sources; strategies decide when they run (strategies/base.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fl_app.privacy import mechanisms as mech

#: Paper defaults (Andrew et al. 2021, §4): target quantile γ, geometric rate η_C; σ_b = m / 20.
DEFAULT_TARGET_QUANTILE = 0.5
DEFAULT_LEARNING_RATE = 0.2
COUNT_STDDEV_PER_CLIENT = 1.0 / 20.0


def default_clipped_count_stddev(expected_clients: float) -> float:
    """σ_b = m / 20, the paper's default noise std on the count."""
    return expected_clients * COUNT_STDDEV_PER_CLIENT


def count_noise_multiplier(clipped_count_stddev: float) -> float:
    """2σ_b: the noise multiplier of the centred count (one client moves it by at most ½)."""
    return 2.0 * clipped_count_stddev


def update_share_of_joint(noise_multiplier: float, clipped_count_stddev: float) -> float:
    """σ_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2): the update's noise multiplier that leaves the joint release at z.

    z = 0 (no privacy) gives σ_Δ = 0. Raises ``ValueError`` when 2σ_b ≤ z: the count alone would spend more than z
    allows.
    """
    if noise_multiplier == 0:
        return 0.0
    return mech.update_noise_for_joint(noise_multiplier, count_noise_multiplier(clipped_count_stddev))


def joint_noise_multiplier(update_noise_multiplier: float, clipped_count_stddev: float) -> float:
    """z = (σ_Δ⁻² + (2σ_b)⁻²)^(−1/2), the multiplier the accountant composes for one adaptive round."""
    return mech.joint_noise_multiplier(update_noise_multiplier, count_noise_multiplier(clipped_count_stddev))


def clipped_bits(norms: Sequence[float], clip_norm: float) -> np.ndarray:
    """c_i = 1[‖Δ_i‖ > C] as float64 (1 = the update is clipped at C)."""
    return (np.asarray(norms, dtype=np.float64) > clip_norm).astype(np.float64)


def noisy_clipped_fraction(
    bits: Sequence[float], expected_clients: float, clipped_count_stddev: float, rng: mech.NormalSource
) -> float:
    """f̃ = (Σ (c_i − ½) + N(0, σ_b²)) / m + ½: the released clipped fraction (may leave [0, 1]).

    One normal draw from ``rng``; ``clipped_count_stddev = 0`` releases the exact fraction and draws nothing.
    The bits must be 0 or 1 (a client's bit is computed by the server from its reported norm).
    """
    values = np.asarray(bits, dtype=np.float64)
    if values.size and not np.all((values == 0.0) | (values == 1.0)):
        raise ValueError("clipped bits must be 0 or 1")
    if not (expected_clients > 0 and clipped_count_stddev >= 0):
        raise ValueError("need m > 0 and sigma_b >= 0")
    centred = float(np.sum(values - 0.5))
    if clipped_count_stddev > 0:
        centred += float(rng.normal(0.0, clipped_count_stddev, (1,))[0])
    return centred / expected_clients + 0.5


def next_clip_norm(clip_norm: float, clipped_fraction: float, target_quantile: float, learning_rate: float) -> float:
    """C_{t+1} = C_t · exp(−η_C (b̃ − γ)) with b̃ = 1 − f̃ (Andrew et al. Eq. 3)."""
    if not (clip_norm > 0 and math.isfinite(clip_norm)):
        raise ValueError(f"clip_norm must be positive and finite, got {clip_norm}")
    unclipped = 1.0 - clipped_fraction
    return clip_norm * math.exp(-learning_rate * (unclipped - target_quantile))
