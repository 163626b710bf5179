"""The masks of secure aggregation (Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine
Learning", CCS 2017, §4; Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020,
§3): vectors uniform modulo 2^b, expanded from a 32-byte seed, and who masks with whom.

A client u sends ``y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u)} ±PRG(s_uv) mod 2^b``: its self mask ``b_u`` (a fresh seed)
and one pairwise mask per neighbour, added by the larger node id and subtracted by the smaller, so the pairwise
masks of two survivors cancel in the sum. ``s_uv`` comes from an ECDH agreement between u's and v's mask keys.

The PRG is ChaCha20's keystream (the ``cryptography`` package), read as little-endian 64-bit words and reduced
modulo 2^b (b ≤ 62 divides 64, so the words stay uniform). Flower's own ``pseudo_rand_gen`` folds its seed to 32
bits for numpy's Mersenne twister; a mask whose seed can be searched in 2^32 steps would hide nothing, so it is not
used.

The neighbourhood graph is Bell et al.'s random Harary graph: the nodes in a secret random order, each joined to
the ``degree / 2`` nodes on either side; ``degree = n − 1`` is the complete graph of Bonawitz et al.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

__all__ = ["SEED_BYTES", "harary_neighbours", "mask_vector", "new_seed"]

#: The length of every mask seed (a ChaCha20 key).
SEED_BYTES = 32


def new_seed() -> bytes:
    """A fresh self-mask seed from the OS CSPRNG."""
    return secrets.token_bytes(SEED_BYTES)


def mask_vector(seed: bytes, length: int, bits: int, stream: int = 0) -> np.ndarray:
    """``length`` values uniform modulo ``2^bits`` (uint64), the keystream of ChaCha20 keyed by ``seed``.

    ``stream`` selects an independent keystream of the same key (the nonce): a round uses the seed once per stream.
    """
    if len(seed) != SEED_BYTES:
        raise ValueError(f"a mask seed is {SEED_BYTES} bytes, got {len(seed)}")
    if not 8 <= bits <= 62:
        raise ValueError(f"bits must be in [8, 62], got {bits}")
    nonce = (0).to_bytes(8, "little") + int(stream).to_bytes(8, "little")  # block counter 0, then the stream id
    encryptor = Cipher(algorithms.ChaCha20(seed, nonce), mode=None).encryptor()
    words = np.frombuffer(encryptor.update(bytes(8 * int(length))), dtype="<u8")
    return words & np.uint64((1 << bits) - 1)


def harary_neighbours(
    nodes: Sequence[int], degree: int, rng: secrets.SystemRandom | None = None
) -> dict[int, set[int]]:
    """Each node's neighbours (itself excluded) in a random Harary graph of ``degree`` over ``nodes``.

    ``degree`` is raised to the next even number below ``n`` (a circulant graph joins both sides); ``n − 1`` or more
    is the complete graph. The order is shuffled with the OS CSPRNG, so which nodes mask together is not
    predictable before the round.
    """
    order = list(dict.fromkeys(int(node) for node in nodes))
    n = len(order)
    if n < 2:
        raise ValueError(f"secure aggregation needs at least 2 nodes, got {n}")
    if degree < 1:
        raise ValueError(f"degree must be at least 1, got {degree}")
    if degree >= n - 1:
        return {node: set(order) - {node} for node in order}
    (rng or secrets.SystemRandom()).shuffle(order)
    half = (degree + 1) // 2
    neighbours: dict[int, set[int]] = {node: set() for node in order}
    for index, node in enumerate(order):
        for offset in range(1, half + 1):
            neighbours[node].add(order[(index + offset) % n])
            neighbours[node].add(order[(index - offset) % n])
    return neighbours
