"""Where every draw comes from (docs/mechanisms.md, 8): the seeded, independent streams :func:`make_rng` of
(seed, *keys) (simulation), the operating system's CSPRNG :class:`SecureRandom` (deployment), and
:func:`random_source`, the one place that chooses between them. Nothing here reads or reseeds global RNG state.
"""

from __future__ import annotations

import os
import secrets
from typing import Protocol

import numpy as np


class NormalSource(Protocol):
    """What :func:`add_gaussian_noise` needs of a random source (``np.random.Generator`` has it)."""

    def normal(self, loc: float, scale: float, size: tuple[int, ...]) -> np.ndarray: ...


class SecureRandom:
    """Draws from the operating system's CSPRNG (``os.urandom``), for deployment (docs/mechanisms.md, 8): the
    noise, and who and what participates (client sampling, Fed-SMP masks), so nothing about them can be re-derived
    from a seed.

    Uniforms are 53-bit fractions of urandom words; normals come from the Box–Muller transform in float64;
    ``choice`` without replacement takes the first ``size`` indices of a permutation sorted by 64-bit urandom keys
    (a uniform random subset up to key ties, probability < n²/2⁶⁵). Not reproducible by design.
    """

    def random(self, size: int) -> np.ndarray:
        """``size`` uniforms in [0, 1) (``np.random.Generator.random``'s range)."""
        words = np.frombuffer(os.urandom(8 * int(size)), dtype=np.uint64)
        return (words >> np.uint64(11)).astype(np.float64) * (1.0 / 2.0**53)

    def integers(self, high: int) -> int:
        """One integer uniform in [0, high)."""
        return secrets.randbelow(int(high))

    def choice(self, a: int, size: int, replace: bool = True) -> np.ndarray:
        """``size`` distinct indices of ``range(a)``, uniformly at random (only ``replace=False`` is offered)."""
        if replace:
            raise ValueError("SecureRandom.choice draws without replacement only (replace=False)")
        if not 0 <= size <= a:
            raise ValueError(f"cannot choose {size} of {a} without replacement")
        keys = np.frombuffer(os.urandom(8 * int(a)), dtype=np.uint64)
        return np.argsort(keys, kind="stable")[: int(size)].astype(np.int64)

    def _uniform(self, count: int) -> np.ndarray:
        words = np.frombuffer(os.urandom(8 * count), dtype=np.uint64)
        return ((words >> np.uint64(11)).astype(np.float64) + 1.0) * (1.0 / 2.0**53)

    def normal(self, loc: float, scale: float, size: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(size, dtype=np.int64))
        half = (count + 1) // 2
        radius = np.sqrt(-2.0 * np.log(self._uniform(half)))
        angle = 2.0 * np.pi * self._uniform(half)
        z = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]
        return loc + scale * z.reshape(size)


def secure_rng() -> SecureRandom:
    """A noise source backed by the OS CSPRNG (``secure_noise: true``)."""
    return SecureRandom()


#: A source of every draw the mechanisms make: a seeded ``np.random.Generator`` or the OS CSPRNG.
RandomSource = np.random.Generator | SecureRandom


def random_source(secure: bool, seed: int | None, *keys: int, noise_key: int | None = None) -> RandomSource:
    """THE place that decides where a draw comes from: the OS CSPRNG when ``secure`` (deployment: noise, client
    sampling, masks, clients' shuffles), else the seeded stream :func:`make_rng` of (seed, *keys) (simulation:
    reproducible, and private only while the seed stays secret).

    ``noise_key`` is passed by noise draws only: the run's key under ``privacy.noise_stream=per_run``
    (:func:`fl_app.config.noise_stream_key`), appended to the keys so that runs with different configs draw
    independent noise; None (``shared``) leaves the stream the one every run of the seed draws.
    """
    if secure:
        return secure_rng()
    if seed is None:
        raise ValueError("a seeded random stream needs a seed (secure randomness sends none)")
    return make_rng(seed, *keys) if noise_key is None else make_rng(seed, *keys, noise_key)


def make_rng(seed: int, *keys: int) -> np.random.Generator:
    """Deterministic, independent stream for (seed, *keys), e.g. (seed, round, client_id, purpose).

    ``SeedSequence`` hashes the whole key tuple, so streams for different keys are statistically independent
    and no global RNG is ever touched (docs/mechanisms.md, 8). Simulation only: deployment noise must come from a
    cryptographically secure source instead.
    """
    entropy = [seed, *keys]
    for value in entropy:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"seed and keys must be non-negative integers, got {entropy}")
    return np.random.default_rng(np.random.SeedSequence([int(value) for value in entropy]))
