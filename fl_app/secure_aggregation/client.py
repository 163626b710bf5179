"""A client's side of SecAgg+ (Bell et al., CCS 2020, Fig. 2; Bonawitz et al., CCS 2017, Fig. 4), one stage per
function, each a pure function of the client's state and the server's request: the ClientApp keeps the state in
the node's ``Context`` between the stages (clients/secure_aggregation.py).

Flower's primitives: ECDH key pairs (``flwr.supercore.primitives.asymmetric``, P-384), the shared keys and
authenticated encryption of shares (``flwr.common.secure_aggregation.crypto.symmetric_encryption``: HKDF-SHA256,
Fernet), Shamir's secret sharing (``...crypto.shamir``) and the share plaintext layout (``secaggplus_utils``). The
masks are ours (fl_app/secure_aggregation/masks.py).

What a client refuses: a neighbourhood that does not hold its own keys or repeats a key, fewer neighbours than the
threshold, a share not addressed to it, and an unmask request that asks for both secrets of one node (which would
let the server remove that node's masks and read its vector) or names fewer survivors than the threshold.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.fernet import InvalidToken
from flwr.common.secure_aggregation.crypto.shamir import create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)

from fl_app.secure_aggregation.masks import mask_vector, new_seed

__all__ = ["ClientSecAgg", "ProtocolError", "pairwise_seed"]


class ProtocolError(ValueError):
    """A request a client of secure aggregation refuses, or a round the server cannot complete."""


def pairwise_seed(own_private_key: bytes, other_public_key: bytes) -> bytes:
    """The 32-byte seed two nodes share: HKDF-SHA256 of their ECDH agreement (Flower's ``generate_shared_key``)."""
    key = generate_shared_key(bytes_to_private_key(own_private_key), bytes_to_public_key(other_public_key))
    return base64.urlsafe_b64decode(key)


@dataclass
class ClientSecAgg:
    """One client's state in one round of secure aggregation, and its four stages."""

    node_id: int
    threshold: int
    bits: int
    length: int
    mask_private: bytes = b""  # sk1 (PEM): its ECDH agreements seed the pairwise masks
    mask_public: bytes = b""
    share_private: bytes = b""  # sk2 (PEM): its ECDH agreements encrypt the shares
    share_public: bytes = b""
    self_seed: bytes = b""  # b_u, the self mask's seed
    neighbour_keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    seed_shares: dict[int, bytes] = field(default_factory=dict)  # owner → its share of b_owner held here
    key_shares: dict[int, bytes] = field(default_factory=dict)  # owner → its share of sk1_owner held here
    masked_with: list[int] = field(default_factory=list)

    # Stage 1 ---------------------------------------------------------------------------------------------------
    def setup(self) -> tuple[bytes, bytes]:
        """New key pairs for the round; (mask public key, share public key) for the server to forward."""
        mask_private, mask_public = generate_key_pairs()
        share_private, share_public = generate_key_pairs()
        self.mask_private, self.mask_public = private_key_to_bytes(mask_private), public_key_to_bytes(mask_public)
        self.share_private, self.share_public = private_key_to_bytes(share_private), public_key_to_bytes(share_public)
        return self.mask_public, self.share_public

    # Stage 2 ---------------------------------------------------------------------------------------------------
    def share_keys(self, keys: dict[int, tuple[bytes, bytes]]) -> tuple[list[int], list[bytes]]:
        """Shares of b_u and sk1_u for the closed neighbourhood ``keys`` (node → its two public keys, this node
        included), each encrypted for its holder: (destinations, ciphertexts)."""
        if keys.get(self.node_id) != (self.mask_public, self.share_public):
            raise ProtocolError("the neighbourhood does not hold this node's own public keys")
        flat = [key for pair in keys.values() for key in pair]
        if len(set(flat)) != len(flat):
            raise ProtocolError("two neighbours sent the same public key")
        if len(keys) < self.threshold:
            raise ProtocolError(f"{len(keys)} nodes in the neighbourhood, fewer than the threshold {self.threshold}")
        self.neighbour_keys = dict(keys)
        self.self_seed = new_seed()
        holders = sorted(keys)
        seed_shares = create_shares(self.self_seed, self.threshold, len(holders))
        key_shares = create_shares(self.mask_private, self.threshold, len(holders))
        destinations, ciphertexts = [], []
        for holder, seed_share, key_share in zip(holders, seed_shares, key_shares, strict=True):
            if holder == self.node_id:
                self.seed_shares[holder], self.key_shares[holder] = seed_share, key_share
                continue
            plaintext = share_keys_plaintext_concat(self.node_id, holder, seed_share, key_share)
            destinations.append(holder)
            ciphertexts.append(encrypt(self._channel(holder), plaintext))
        return destinations, ciphertexts

    # Stage 3 ---------------------------------------------------------------------------------------------------
    def masked(self, sources: list[int], ciphertexts: list[bytes], vector: np.ndarray) -> np.ndarray:
        """Store the shares the neighbours ``sources`` sent, and return ``vector`` (residues modulo 2^b, length
        ``length``) masked with b_u and one pairwise mask per source."""
        if len(sources) + 1 < self.threshold:
            raise ProtocolError(f"{len(sources)} neighbours sent shares; the threshold is {self.threshold}")
        for source, ciphertext in zip(sources, ciphertexts, strict=True):
            if source not in self.neighbour_keys or source == self.node_id:
                raise ProtocolError(f"shares from node {source}, which is not a neighbour")
            try:
                plaintext = decrypt(self._channel(source), ciphertext)
            except InvalidToken:
                raise ProtocolError(f"the shares said to come from node {source} were not encrypted by it") from None
            owner, holder, seed_share, key_share = share_keys_plaintext_separate(plaintext)
            if (owner, holder) != (source, self.node_id):
                raise ProtocolError(f"a share from node {owner} for node {holder} came as {source} → {self.node_id}")
            self.seed_shares[owner], self.key_shares[owner] = seed_share, key_share
        values = np.asarray(vector, dtype=np.uint64)
        if values.shape != (self.length,) or (self.length and int(values.max()) >= 1 << self.bits):
            raise ProtocolError(f"the vector to mask must be {self.length} residues modulo 2^{self.bits}")
        total = values + mask_vector(self.self_seed, self.length, self.bits)
        for source in sources:
            pairwise = mask_vector(
                pairwise_seed(self.mask_private, self.neighbour_keys[source][0]), self.length, self.bits
            )
            total = total + pairwise if self.node_id > source else total - pairwise
        self.masked_with = list(sources)
        return total & np.uint64((1 << self.bits) - 1)

    # Stage 4 ---------------------------------------------------------------------------------------------------
    def unmask(self, survivors: list[int], dropped: list[int]) -> tuple[list[int], list[bytes]]:
        """Shares of b for the ``survivors`` and of sk1 for the ``dropped``: (owners, shares)."""
        if set(survivors) & set(dropped):
            raise ProtocolError("an unmask request names a node both as a survivor and as dropped")
        if self.node_id in dropped:
            raise ProtocolError("an unmask request names this node as dropped")
        if len(survivors) < self.threshold:
            raise ProtocolError(f"{len(survivors)} survivors named, fewer than the threshold {self.threshold}")
        owners: list[int] = []
        shares: list[bytes] = []
        for owner in survivors:
            if owner in self.seed_shares:
                owners.append(owner)
                shares.append(self.seed_shares[owner])
        for owner in dropped:
            if owner in self.key_shares:
                owners.append(owner)
                shares.append(self.key_shares[owner])
        return owners, shares

    # State between stages ------------------------------------------------------------------------------------
    def to_record(self) -> dict[str, int | bytes | list[int] | list[bytes]]:
        """The state as ``ConfigRecord`` values (ints, bytes, lists of one of them), kept in the node's Context."""
        neighbours = sorted(self.neighbour_keys)
        return {
            "node_id": self.node_id, "threshold": self.threshold, "bits": self.bits, "length": self.length,
            "mask_private": self.mask_private, "mask_public": self.mask_public,
            "share_private": self.share_private, "share_public": self.share_public, "self_seed": self.self_seed,
            "neighbours": neighbours,
            "neighbour_mask_keys": [self.neighbour_keys[n][0] for n in neighbours],
            "neighbour_share_keys": [self.neighbour_keys[n][1] for n in neighbours],
            "seed_share_owners": list(self.seed_shares), "seed_shares": list(self.seed_shares.values()),
            "key_share_owners": list(self.key_shares), "key_shares": list(self.key_shares.values()),
            "masked_with": list(self.masked_with),
        }  # fmt: skip

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ClientSecAgg:
        """The state :meth:`to_record` wrote."""
        state = cls(int(record["node_id"]), int(record["threshold"]), int(record["bits"]), int(record["length"]))
        for key in ("mask_private", "mask_public", "share_private", "share_public", "self_seed"):
            setattr(state, key, bytes(record[key]))
        state.neighbour_keys = {
            int(n): (bytes(m), bytes(k))
            for n, m, k in zip(record["neighbours"], record["neighbour_mask_keys"], record["neighbour_share_keys"],
                               strict=True)
        }  # fmt: skip
        state.seed_shares = dict(zip(map(int, record["seed_share_owners"]), record["seed_shares"], strict=True))
        state.key_shares = dict(zip(map(int, record["key_share_owners"]), record["key_shares"], strict=True))
        state.masked_with = [int(n) for n in record["masked_with"]]
        return state

    def _channel(self, other: int) -> bytes:
        """The Fernet key this node shares with ``other`` (ECDH of the share keys)."""
        other_share_public = self.neighbour_keys[other][1]
        return generate_shared_key(bytes_to_private_key(self.share_private), bytes_to_public_key(other_share_public))
