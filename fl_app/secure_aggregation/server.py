"""The server's side of SecAgg+ (Bell et al., CCS 2020, Fig. 2; Bonawitz et al., CCS 2017, Fig. 4) as a state
machine over one round: it says what to send each node at each stage and takes what came back, and never sees a
node's vector unmasked. Talking to the nodes is the caller's (strategies/secure_sum.py, on a Flower grid).

The nodes that answered each stage shrink: U1 (public keys) ⊇ U2 (shares sent) ⊇ U3 (masked vectors) ⊇ U4 (unmask
shares). A node that answered U2 but not U3 dropped after its neighbours masked with it: its pairwise masks are
removed with its mask key, rebuilt from its neighbours' shares; every node of U3 has its self mask removed with its
seed, rebuilt the same way. The round is aborted (:class:`~fl_app.secure_aggregation.client.ProtocolError`) when
fewer than ``threshold`` nodes are left at any stage, or a secret cannot be rebuilt: then nothing is unmasked and
nothing is released.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from flwr.common.secure_aggregation.crypto.shamir import combine_shares

from fl_app.secure_aggregation.client import ProtocolError, pairwise_seed
from fl_app.secure_aggregation.masks import harary_neighbours, mask_vector

__all__ = ["SecureSumRound"]


@dataclass
class SecureSumRound:
    """One round of SecAgg+ over ``nodes``: ``threshold`` (t) survivors at least, vectors of ``length`` residues
    modulo ``2^bits``, each node masking with ``degree`` neighbours (``len(nodes) − 1``: all)."""

    nodes: list[int]
    threshold: int
    bits: int
    length: int
    degree: int | None = None
    neighbours: dict[int, set[int]] = field(init=False)
    keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # U1: node → (mask key, share key)
    routed: dict[int, dict[int, bytes]] = field(default_factory=dict)  # U2: recipient → {sender: ciphertext}
    masked_with: dict[int, list[int]] = field(default_factory=dict)  # U3 node → the neighbours it masked with
    total: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.nodes = list(dict.fromkeys(int(node) for node in self.nodes))
        degree = len(self.nodes) - 1 if self.degree is None else int(self.degree)
        if not 2 <= self.threshold <= len(self.nodes):
            raise ValueError(f"threshold must be in [2, {len(self.nodes)}] for {len(self.nodes)} nodes")
        self.neighbours = harary_neighbours(self.nodes, degree)
        smallest = min(len(nbrs) + 1 for nbrs in self.neighbours.values())
        if self.threshold > smallest:
            raise ValueError(
                f"threshold {self.threshold} exceeds a neighbourhood of {smallest} nodes (itself included)"
            )

    @property
    def survivors(self) -> list[int]:
        """U3: the nodes whose masked vectors are in the sum."""
        return sorted(self.masked_with)

    def settings(self) -> dict[str, int]:
        """What every node is told at setup."""
        return {"threshold": self.threshold, "bits": self.bits, "length": self.length}

    def take_keys(self, replies: dict[int, tuple[bytes, bytes]]) -> None:
        """Stage 1's replies: node → (mask public key, share public key)."""
        self.keys = {node: keys for node, keys in replies.items() if node in self.neighbours}
        self._enough(self.keys, "sent public keys")

    def key_requests(self) -> dict[int, dict[int, tuple[bytes, bytes]]]:
        """Stage 2's requests: each node of U1 gets the keys of its closed neighbourhood within U1."""
        return {
            node: {other: self.keys[other] for other in sorted(self.neighbours[node] | {node}) if other in self.keys}
            for node in self.keys
        }

    def take_shares(self, replies: dict[int, tuple[list[int], list[bytes]]]) -> None:
        """Stage 2's replies: node → (destinations, ciphertexts), routed to their destinations."""
        senders = [node for node in replies if node in self.keys]
        self._enough(senders, "sent shares")
        self.routed = {node: {} for node in senders}
        for sender in senders:
            destinations, ciphertexts = replies[sender]
            for destination, ciphertext in zip(destinations, ciphertexts, strict=True):
                if destination in self.routed and destination in self.neighbours[sender]:
                    self.routed[destination][sender] = ciphertext

    def collect_requests(self) -> dict[int, tuple[list[int], list[bytes]]]:
        """Stage 3's requests: each node of U2 gets the ciphertexts addressed to it, by sender; a node with fewer
        than t − 1 senders is not asked (it would refuse: too few of its neighbours could rebuild its secrets)."""
        return {
            node: (list(inbox), list(inbox.values()))
            for node, inbox in self.routed.items()
            if len(inbox) + 1 >= self.threshold
        }

    def take_masked(self, replies: dict[int, np.ndarray]) -> None:
        """Stage 3's replies: node → its masked vector, added to the sum modulo 2^b."""
        arrived = {node: vector for node, vector in replies.items() if node in self.routed}
        self._enough(arrived, "sent masked vectors")
        total = np.zeros(self.length, dtype=np.uint64)
        for node in sorted(arrived):
            vector = np.asarray(arrived[node], dtype=np.uint64)
            if vector.shape != (self.length,):
                raise ProtocolError(f"node {node} sent a masked vector of shape {vector.shape}, not ({self.length},)")
            total = (total + vector) & self._modulus_mask
            self.masked_with[node] = sorted(self.routed[node])
        self.total = total

    def unmask_requests(self) -> dict[int, tuple[list[int], list[int]]]:
        """Stage 4's requests: each node of U3 is told which of its neighbours survived and which dropped."""
        dropped = set(self.routed) - set(self.masked_with)
        return {
            node: (
                sorted((self.neighbours[node] | {node}) & set(self.masked_with)),
                sorted(self.neighbours[node] & dropped),
            )
            for node in self.masked_with
        }

    def unmask(self, replies: dict[int, tuple[list[int], list[bytes]]]) -> np.ndarray:
        """Stage 4's replies: node → (owners, shares). The survivors' sum modulo 2^b, its masks removed."""
        if self.total is None:
            raise ProtocolError("unmask before the masked vectors were collected")
        responders = {node: reply for node, reply in replies.items() if node in self.masked_with}
        self._enough(responders, "sent unmask shares")
        shares: dict[int, list[bytes]] = {}
        for node, (owners, node_shares) in responders.items():
            for owner, share in zip(owners, node_shares, strict=True):
                if node == owner or node in self.neighbours[owner]:
                    shares.setdefault(owner, []).append(share)
        total = self.total.copy()
        for owner in self.masked_with:
            total = total - mask_vector(self._rebuild(owner, shares), self.length, self.bits)
        for owner in set(self.routed) - set(self.masked_with):
            total = self._remove_pairwise(total, owner, self._rebuild(owner, shares))
        return total & self._modulus_mask

    @property
    def _modulus_mask(self) -> np.uint64:
        return np.uint64((1 << self.bits) - 1)

    def _rebuild(self, owner: int, shares: dict[int, list[bytes]]) -> bytes:
        held = shares.get(owner, [])
        if len(held) < self.threshold:
            raise ProtocolError(f"{len(held)} shares of node {owner}'s secret arrived, fewer than {self.threshold}")
        try:
            return combine_shares(held[: self.threshold])
        except ValueError as error:
            raise ProtocolError(f"node {owner}'s secret could not be rebuilt from its shares: {error}") from error

    def _remove_pairwise(self, total: np.ndarray, dropped: int, mask_key: bytes) -> np.ndarray:
        """Undo the pairwise masks each survivor added for ``dropped`` (its mask key rebuilt)."""
        for survivor, partners in self.masked_with.items():
            if dropped not in partners:
                continue
            pairwise = mask_vector(pairwise_seed(mask_key, self.keys[survivor][0]), self.length, self.bits)
            # The survivor added the mask if its id was the larger, else subtracted it.
            total = total - pairwise if survivor > dropped else total + pairwise
        return total

    def _enough(self, answered: object, what: str) -> None:
        count = len(answered)  # type: ignore[arg-type]
        if count < self.threshold:
            raise ProtocolError(f"only {count} nodes {what}; the round needs {self.threshold}")
