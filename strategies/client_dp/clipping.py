"""The clip norm of the coming round, as an object the strategy holds: fixed C, or adaptive clipping's C_t
(Andrew et al., NeurIPS 2021, Alg. 1 and Thm. 1), which owns its share of the joint release.

Both answer the same questions for the round (``strategies/base.py``):

- ``clip_norm``: C_t, what clients clip to, what the server re-clips to and scales the noise by;
- ``update_share_of_joint(z)``: the update's σ when ``z`` is the configured (or calibrated) multiplier of
  everything the round releases — z itself for fixed C, σ_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) for adaptive C;
- ``joint_noise_multiplier(σ)``: what the ledger composes for an update released with σ;
- ``after_round(norms, m, rng)``: adaptive clipping releases the noisy clipped fraction and moves C (fixed: nothing);
- ``claim()`` for ``run.json`` and ``state_dict()`` / ``load_state_dict()`` for checkpoints (JSON).

The math is :mod:`fl_app.privacy.adaptive_clipping`'s pure functions; this module only keeps C_t between rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fl_app.config import DPConfig
from fl_app.privacy import adaptive_clipping as adaptive
from fl_app.privacy import mechanisms as mech


class FixedClipNorm:
    """C = ``privacy.clip_norm`` every round; nothing is released about it."""

    adaptive = False

    def __init__(self, clip_norm: float) -> None:
        self.clip_norm = float(clip_norm)

    def update_share_of_joint(self, joint: float) -> float:
        return joint

    def joint_noise_multiplier(self, update: float) -> float:
        return update

    def after_round(self, norms: Sequence[float], expected_clients: float, rng: mech.RandomSource) -> dict[str, float]:
        return {}

    def claim(self) -> dict[str, Any]:
        return {"mode": "fixed", "clip_norm": self.clip_norm}

    def state_dict(self) -> dict[str, Any]:
        return {"clip_norm": self.clip_norm}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.clip_norm = float(state.get("clip_norm", self.clip_norm))


class AdaptiveClipNorm:
    """C_t that follows the ``target_quantile`` of the clients' update norms from C_0 = ``initial``; every round
    releases the centred clipped count with noise ``count_stddev`` (σ_b), accounted jointly with the update."""

    adaptive = True

    def __init__(self, initial: float, target_quantile: float, learning_rate: float, count_stddev: float) -> None:
        self.initial = float(initial)
        self.clip_norm = float(initial)
        self.target_quantile = target_quantile
        self.learning_rate = learning_rate
        self.count_stddev = count_stddev

    def update_share_of_joint(self, joint: float) -> float:
        """σ_Δ for a joint multiplier z (Thm. 1); ValueError unless 2σ_b > z."""
        return adaptive.update_share_of_joint(joint, self.count_stddev)

    def joint_noise_multiplier(self, update: float) -> float:
        return adaptive.joint_noise_multiplier(update, self.count_stddev)

    def after_round(self, norms: Sequence[float], expected_clients: float, rng: mech.RandomSource) -> dict[str, float]:
        """Release the noisy clipped fraction of the aggregated clients (bits from their reported norms, so a client
        can only flip its own bit) over the fixed m, and move C geometrically."""
        fraction = adaptive.noisy_clipped_fraction(
            adaptive.clipped_bits(norms, self.clip_norm), expected_clients, self.count_stddev, rng
        )
        self.clip_norm = adaptive.next_clip_norm(self.clip_norm, fraction, self.target_quantile, self.learning_rate)
        return {"fraction_clipped_noisy": fraction, "clip_norm_next": self.clip_norm}

    def claim(self) -> dict[str, Any]:
        return {
            "mode": "adaptive (Andrew et al. 2021): the clipped fraction is released with noise clipped_count_stddev "
            "on the centred count and accounted jointly with the update",
            "initial_clip_norm": self.initial,
            "target_quantile": self.target_quantile,
            "clip_learning_rate": self.learning_rate,
            "clipped_count_stddev": self.count_stddev,
            "next_clip_norm": self.clip_norm,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"clip_norm": self.clip_norm}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.clip_norm = float(state.get("clip_norm", self.initial))


ClipNorm = FixedClipNorm | AdaptiveClipNorm


def clip_norm_for(privacy: DPConfig, expected_clients: float, may_adapt: bool) -> ClipNorm:
    """The run's clip norm object: adaptive clipping's where it may be (``may_adapt``: a private run) and
    ``privacy.clipping`` asks for it, with the count's noise σ_b = ``privacy.clipped_count_stddev`` or m/20; else the
    fixed ``privacy.clip_norm``."""
    if not (may_adapt and privacy.clipping == "adaptive"):
        return FixedClipNorm(privacy.clip_norm)
    count_stddev = privacy.clipped_count_stddev or adaptive.default_clipped_count_stddev(expected_clients)
    return AdaptiveClipNorm(privacy.clip_norm, privacy.target_quantile, privacy.clip_learning_rate, count_stddev)
