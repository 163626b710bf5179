"""The Gaussian mechanism (DP-FedSAM journal Eq. 11; docs/mechanisms.md, 4): the per-coordinate noise std of each
placement (N(0, σ²C²/m) per client or N(0, σ²C²/m²) on the average), adding it to an update, the server's top-up when a
client of a client-placed round is missing, a noisy count, and the noise multiplier of a joint release of the
update and a noisy count (Andrew et al., NeurIPS 2021, Thm. 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fl_app.core.choices import Placement
from fl_app.privacy.mechanisms.norms import NDArrays
from fl_app.privacy.mechanisms.randomness import NormalSource


def gaussian_noise_std(
    noise_multiplier: float,
    clip_norm: float,
    expected_clients: float,
    placement: Placement,
) -> float:
    """Per-coordinate noise std for the given placement (journal Eq. 11; docs/mechanisms.md, 4).

    - ``client``: each client adds N(0, σ²C²/m), std σC/√m. The sum of m independent draws has std σC·√m, so
      the average over the fixed denominator m has std σC/m.
    - ``server``: one draw of std σC/m added to the average.

    Both placements give the aggregate the same law N(0, σ²C²/m²), i.e. noise multiplier σ relative to the
    average's sensitivity C/m, which is what the accountant assumes.
    """
    if noise_multiplier < 0 or not math.isfinite(noise_multiplier):
        raise ValueError(f"noise_multiplier must be a non-negative finite number, got {noise_multiplier}")
    if clip_norm <= 0 or not math.isfinite(clip_norm):
        raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm}")
    if expected_clients <= 0 or not math.isfinite(expected_clients):
        raise ValueError(f"expected_clients must be a positive finite number, got {expected_clients}")
    if placement == "client":
        return noise_multiplier * clip_norm / math.sqrt(expected_clients)
    if placement == "server":
        return noise_multiplier * clip_norm / expected_clients
    raise ValueError(f"placement must be 'client' or 'server', got {placement!r}")


def add_gaussian_noise(update: Sequence[np.ndarray], std: float, rng: NormalSource) -> NDArrays:
    """Return a new update ``update + N(0, std² · I)``, each tensor keeping its dtype.

    Draws are taken tensor by tensor in list order from ``rng`` (so a fixed rng state gives fixed noise), in
    float64 and added before casting back, so float32 rounding does not bias the noise law. With ``std == 0``
    the result is a copy and ``rng`` is not advanced.
    """
    if std < 0 or not math.isfinite(std):
        raise ValueError(f"std must be a non-negative finite number, got {std}")
    arrays = [np.asarray(tensor) for tensor in update]
    if std == 0:
        return [tensor.copy() for tensor in arrays]
    return [add_in_float64(tensor, rng.normal(0.0, std, size=tensor.shape)) for tensor in arrays]


def add_in_float64(tensor: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """``tensor + noise`` as a new array of the tensor's dtype, added in float64 (the ufunc widens the tensor exactly)
    and rounded as each value is written: the values of (tensor.astype(float64) + noise).astype(dtype), with no
    float64 copy of the tensor, so float32 rounding does not bias the noise law."""
    return np.add(tensor, noise, out=np.empty(tensor.shape, tensor.dtype), dtype=np.float64, casting="unsafe")


def joint_noise_multiplier(noise_multiplier: float, statistics_noise_multiplier: float) -> float:
    """σ_joint = (σ⁻² + σ_s⁻²)^(−1/2): the noise multiplier of a round that releases the noised update sum
    (sensitivity C, noise σC) *and* a noised count (sensitivity 1, noise σ_s) of the same sampled clients.

    Scaling each part by its noise std, one client moves the pair by at most √(σ⁻² + σ_s⁻²) against unit noise:
    one Gaussian mechanism, subsampled once, with this multiplier (Andrew et al., NeurIPS 2021, Thm. 1).
    """
    if not (noise_multiplier > 0 and statistics_noise_multiplier > 0):
        raise ValueError("both noise multipliers must be > 0 for a joint release")
    return (noise_multiplier**-2 + statistics_noise_multiplier**-2) ** -0.5


def update_noise_for_joint(joint_noise_multiplier: float, statistics_noise_multiplier: float) -> float:
    """The update's σ such that :func:`joint_noise_multiplier` (σ, σ_s) equals ``joint_noise_multiplier``."""
    remainder = joint_noise_multiplier**-2 - statistics_noise_multiplier**-2
    if remainder <= 0:
        raise ValueError(
            f"sigma_s={statistics_noise_multiplier:.4g} is too small: the noisy statistics alone would spend more "
            f"than a joint noise multiplier of {joint_noise_multiplier:.4g} allows"
        )
    return remainder**-0.5


def noisy_count(count: float, std: float, rng: NormalSource) -> float:
    """count + N(0, std²): a count of clients (sensitivity 1) released through the Gaussian mechanism."""
    return float(count) + float(rng.normal(0.0, std, (1,))[0])


def client_noise_topup_std(
    noise_multiplier: float, clip_norm: float, expected_clients: float, contributing: int
) -> float:
    """The server's top-up std, so client-placed noise is never below the accounted level (docs/mechanisms.md, 4).

    In client placement each of the n contributing clients adds N(0, σ²C²/m); over the fixed denominator m the
    average carries variance n σ²C²/m³. When n < m (a client failed or was rejected) the server adds the missing
    (m − n) σ²C²/m³, so the aggregate is N(0, σ²C²/m²) whoever dropped out — the law the accountant assumes.
    Client placement is only used with fixed-size sampling, where n <= m.
    """
    per_average = gaussian_noise_std(noise_multiplier, clip_norm, expected_clients, "server")
    missing = max(0.0, expected_clients - contributing)
    return per_average * math.sqrt(missing / expected_clients)
