"""One round's encoding of the distributed Skellam mechanism, client side and server side (Agarwal, Kairouz, Liu,
NeurIPS 2021, Algorithm 1): a clipped update → rotated, scaled, conditionally rounded integers + the client's share
of Skellam noise, modulo 2^b; and the modular sum of the survivors → the sum of their clipped updates plus noise.

Every client of a round and the server build the same :class:`SkellamCodec` from the round's
:class:`~fl_app.privacy.distributed.skellam.SkellamParameters` and public rotation seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fl_app.privacy.distributed.encoding import centered, conditional_round, to_modular, wrapped_coordinates
from fl_app.privacy.distributed.rotation import RandomizedHadamard
from fl_app.privacy.distributed.skellam import SkellamParameters, skellam_noise

__all__ = ["DecodedSum", "SkellamCodec"]


@dataclass(frozen=True)
class DecodedSum:
    """The decoded round: the sum of the clipped updates plus the noise over the scale (float64, length d), and the
    coordinates of the integer sum found in the wrap band (empty when none)."""

    total: np.ndarray
    flagged: np.ndarray

    @property
    def wrapped(self) -> bool:
        return bool(self.flagged.size)


class SkellamCodec:
    """Encode a client's clipped update, decode the sum (module docstring)."""

    def __init__(self, parameters: SkellamParameters, rotation_seed: int) -> None:
        self.parameters = parameters
        self.rotation = RandomizedHadamard(parameters.dimension, rotation_seed)

    @property
    def bits(self) -> int:
        return self.parameters.bits

    def integers(self, clipped: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The client's integer vector before noise: ``round(s · HD·x / √d')`` with ℓ2 norm ≤ Δ2 (int64, length d').

        ``clipped`` must already have ℓ2 norm ≤ C (the layer clips it); a larger one is refused, since the
        sensitivity the accountant uses would not hold.
        """
        flat = np.asarray(clipped, dtype=np.float64).reshape(-1)
        norm = float(np.linalg.norm(flat))
        if norm > self.parameters.clip_norm * (1.0 + 1e-9):
            raise ValueError(f"the update's norm {norm:.6g} is past the clip norm {self.parameters.clip_norm:.6g}")
        scaled = self.parameters.scale * self.rotation.rotate(flat)
        return conditional_round(scaled, self.parameters.l2_sensitivity, rng)

    def noise(self, rng: np.random.Generator) -> np.ndarray:
        """The client's share of the sum's noise: ``Sk(v / n_min)`` per coordinate (int64, length d')."""
        return skellam_noise(self.rotation.padded, self.parameters.client_variance, rng)

    def encode(self, clipped: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """What the client masks and sends: ``integers + noise mod 2^b`` (uint64, length d')."""
        return to_modular(self.integers(clipped, rng) + self.noise(rng), self.bits)

    def decode(self, modular_sum: np.ndarray) -> DecodedSum:
        """The survivors' modular sum → the sum of their clipped updates plus noise (float64, length d)."""
        values = centered(np.asarray(modular_sum, dtype=np.uint64), self.bits)
        flagged = wrapped_coordinates(values, self.bits)
        total = self.rotation.unrotate(values.astype(np.float64) / self.parameters.scale)
        return DecodedSum(total=total, flagged=flagged)
