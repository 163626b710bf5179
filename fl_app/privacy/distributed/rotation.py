"""The randomised Hadamard rotation of distributed DP (Kairouz, Liu, Steinke, ICML 2021, §4; Agarwal, Kairouz, Liu,
NeurIPS 2021, Algorithm 1): ``y = H D x / √d'``, with ``x`` zero-padded to ``d'``, the next power of two, ``D`` a
diagonal of random signs and ``H`` the ``d'×d'`` Walsh–Hadamard matrix.

Why rotate: a clipped update may put all its norm into a few coordinates, and the integer sum of the clients is
taken modulo ``2^b``. After the rotation every coordinate is a Rademacher sum of the update's entries, so it is
sub-Gaussian with variance proxy ``‖x‖² / d'``: no coordinate is much larger than the norm spread evenly, and a
modular wrap becomes rare (``fl_app.privacy.distributed.skellam.overflow_probability``). The rotation is
orthonormal, so it keeps the ℓ2 norm (the sensitivity) and is undone exactly by its transpose.

The signs are public (drawn from a seed the server sends with the round): the privacy of the mechanism does not rest
on them, only the overflow bound does, and that bound holds for signs drawn independently of the updates.
"""

from __future__ import annotations

import numpy as np

__all__ = ["RandomizedHadamard", "padded_dimension", "walsh_hadamard"]


def padded_dimension(dimension: int) -> int:
    """The smallest power of two ≥ ``dimension`` (≥ 1): the length the rotation works in."""
    if isinstance(dimension, bool) or not isinstance(dimension, (int, np.integer)) or dimension < 1:
        raise ValueError(f"dimension must be a positive int, got {dimension!r}")
    return 1 << (int(dimension) - 1).bit_length()


def walsh_hadamard(x: np.ndarray) -> np.ndarray:
    """``H x`` for the unnormalised Walsh–Hadamard matrix ``H`` (entries ±1, ``H² = d·I``), in O(d log d).

    ``x`` is one-dimensional and its length a power of two; a new float64 array is returned.
    """
    y = np.array(x, dtype=np.float64, copy=True)
    size = y.shape[0]
    if y.ndim != 1 or size & (size - 1):
        raise ValueError(f"walsh_hadamard takes a 1-D array whose length is a power of two, got shape {y.shape}")
    half = 1
    while half < size:
        pairs = y.reshape(-1, 2, half)
        top = pairs[:, 0, :].copy()
        pairs[:, 0, :] += pairs[:, 1, :]
        pairs[:, 1, :] = top - pairs[:, 1, :]
        half *= 2
    return y


class RandomizedHadamard:
    """``x ↦ H D x / √d'`` on vectors of length ``dimension`` (padded to ``d'``), and its inverse.

    Args:
        dimension: the length of the flattened update.
        seed: the round's public seed; the signs ``D`` are a function of it alone, so every client and the server
            build the same rotation.
    """

    def __init__(self, dimension: int, seed: int) -> None:
        self.dimension = int(dimension)
        self.padded = padded_dimension(dimension)
        signs = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5A7E])).integers(0, 2, self.padded)
        self.signs = (2.0 * signs - 1.0).astype(np.float64)

    def rotate(self, x: np.ndarray) -> np.ndarray:
        """The rotated, padded vector (length ``d'``, float64); ``‖rotate(x)‖ = ‖x‖``."""
        flat = np.asarray(x, dtype=np.float64).reshape(-1)
        if flat.shape[0] != self.dimension:
            raise ValueError(f"expected a vector of length {self.dimension}, got {flat.shape[0]}")
        padded = np.zeros(self.padded, dtype=np.float64)
        padded[: self.dimension] = flat
        return walsh_hadamard(self.signs * padded) / np.sqrt(self.padded)

    def unrotate(self, y: np.ndarray) -> np.ndarray:
        """The inverse: ``D H y / √d'``, truncated back to ``dimension`` entries (float64)."""
        rotated = np.asarray(y, dtype=np.float64).reshape(-1)
        if rotated.shape[0] != self.padded:
            raise ValueError(f"expected a rotated vector of length {self.padded}, got {rotated.shape[0]}")
        return (self.signs * walsh_hadamard(rotated) / np.sqrt(self.padded))[: self.dimension]
