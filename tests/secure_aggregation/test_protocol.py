"""SecAgg+ between real clients and the server's state machine, in one process: the unmasked sum is exactly the
survivors' sum modulo 2^b whoever drops out at whichever stage (above the threshold), a masked vector is uniform
whatever it hides, and what a client or the server refuses."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fl_app.secure_aggregation import ClientSecAgg, ProtocolError, SecureSumRound

BITS, LENGTH = 20, 512
NODES = [3, 9, 14, 27, 31, 40, 41, 50]


def _vectors(nodes: list[int], seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {node: rng.integers(0, 2**BITS, LENGTH).astype(np.uint64) for node in nodes}


def _round(
    threshold: int,
    degree: int | None = None,
    drop: dict[int, set[int]] | None = None,
    nodes: list[int] = NODES,
) -> tuple[SecureSumRound, np.ndarray, dict[int, np.ndarray]]:
    """One round; ``drop[stage]`` = the nodes that do not answer stage 1, 2, 3 or 4."""
    drop = drop or {}
    vectors = _vectors(nodes)
    server = SecureSumRound(nodes, threshold, BITS, LENGTH, degree=degree)
    clients = {node: ClientSecAgg(node, **server.settings()) for node in nodes}
    server.take_keys({n: clients[n].setup() for n in nodes if n not in drop.get(1, set())})
    requests = server.key_requests()
    server.take_shares({n: clients[n].share_keys(r) for n, r in requests.items() if n not in drop.get(2, set())})
    collect = server.collect_requests()
    server.take_masked(
        {n: clients[n].masked(*c, vectors[n]) for n, c in collect.items() if n not in drop.get(3, set())}
    )
    unmask = server.unmask_requests()
    total = server.unmask({n: clients[n].unmask(*u) for n, u in unmask.items() if n not in drop.get(4, set())})
    return server, total, vectors


def _expected(vectors: dict[int, np.ndarray], survivors: list[int]) -> np.ndarray:
    return sum(vectors[n] for n in survivors) & np.uint64(2**BITS - 1)  # type: ignore[return-value]


@pytest.mark.parametrize(
    "drop",
    [{}, {1: {40}}, {2: {40}}, {3: {31}}, {4: {27}}, {1: {3}, 2: {9}, 3: {14}, 4: {27}}],
    ids=["none", "setup", "share_keys", "after_sharing", "unmask", "one_at_each_stage"],
)
def test_the_unmasked_sum_is_the_survivors_sum(drop: dict[int, set[int]]) -> None:
    server, total, vectors = _round(threshold=4, drop=drop)
    gone = set().union(*drop.values()) - drop.get(4, set())
    assert server.survivors == sorted(set(NODES) - gone)
    np.testing.assert_array_equal(total, _expected(vectors, server.survivors))


def test_a_sparse_graph_survives_a_dropout_after_sharing() -> None:
    nodes = list(range(1, 21))
    server, total, vectors = _round(threshold=3, degree=6, drop={3: {5, 11}}, nodes=nodes)
    assert all(len(neighbours) == 6 for neighbours in server.neighbours.values())
    assert server.survivors == sorted(set(nodes) - {5, 11})
    np.testing.assert_array_equal(total, _expected(vectors, server.survivors))


@pytest.mark.parametrize("stage", [1, 2, 3, 4])
def test_fewer_than_the_threshold_aborts_the_round(stage: int) -> None:
    with pytest.raises(ProtocolError, match=r"the round needs 5|fewer than 5"):
        _round(threshold=5, drop={stage: {3, 9, 14, 27}})


def test_a_masked_vector_is_uniform_whatever_it_hides() -> None:
    """The server's view of one client: its masked vector. Zeros and a spike at the range's edge are both hidden
    by masks uniform modulo 2^b."""
    nodes = [1, 2, 3]
    server = SecureSumRound(nodes, 2, BITS, 50_000)
    clients = {node: ClientSecAgg(node, **server.settings()) for node in nodes}
    server.take_keys({n: c.setup() for n, c in clients.items()})
    server.take_shares({n: clients[n].share_keys(r) for n, r in server.key_requests().items()})
    collect = server.collect_requests()
    hidden = {
        1: np.zeros(50_000, np.uint64),
        2: np.full(50_000, 2**BITS - 1, np.uint64),
        3: np.zeros(50_000, np.uint64),
    }
    for node in (1, 2):
        masked = clients[node].masked(*collect[node], hidden[node])
        assert stats.kstest(masked / 2.0**BITS, "uniform").pvalue > 1e-4
        assert np.mean(masked == hidden[node]) < 1e-3


def _ready_client() -> tuple[ClientSecAgg, dict[int, tuple[bytes, bytes]]]:
    server = SecureSumRound([1, 2, 3], 2, BITS, LENGTH)
    clients = {node: ClientSecAgg(node, **server.settings()) for node in (1, 2, 3)}
    server.take_keys({n: c.setup() for n, c in clients.items()})
    return clients[1], server.key_requests()[1]


def test_a_client_refuses_a_neighbourhood_without_its_keys_or_with_a_repeated_key() -> None:
    client, keys = _ready_client()
    with pytest.raises(ProtocolError, match="own public keys"):
        client.share_keys({node: pair for node, pair in keys.items() if node != 1})
    with pytest.raises(ProtocolError, match="same public key"):
        client.share_keys({**keys, 2: keys[3]})


def test_a_client_never_gives_both_secrets_of_one_node() -> None:
    client, keys = _ready_client()
    client.share_keys(keys)
    with pytest.raises(ProtocolError, match="both as a survivor and as dropped"):
        client.unmask([1, 2], [2])
    with pytest.raises(ProtocolError, match="this node as dropped"):
        client.unmask([2, 3], [1])
    with pytest.raises(ProtocolError, match="fewer than the threshold"):
        client.unmask([1], [])


def test_a_share_routed_to_the_wrong_node_is_refused() -> None:
    nodes = [1, 2, 3]
    server = SecureSumRound(nodes, 2, BITS, LENGTH)
    clients = {node: ClientSecAgg(node, **server.settings()) for node in nodes}
    server.take_keys({n: c.setup() for n, c in clients.items()})
    server.take_shares({n: clients[n].share_keys(r) for n, r in server.key_requests().items()})
    sources, ciphertexts = server.collect_requests()[1]
    with pytest.raises(ProtocolError, match="not encrypted by it"):
        clients[1].masked(sources, ciphertexts[::-1], np.zeros(LENGTH, np.uint64))


def test_the_server_refuses_a_threshold_its_graph_cannot_meet() -> None:
    with pytest.raises(ValueError, match="exceeds a neighbourhood"):
        SecureSumRound(list(range(10)), 5, BITS, LENGTH, degree=2)
    with pytest.raises(ValueError, match="threshold must be"):
        SecureSumRound([1, 2, 3], 1, BITS, LENGTH)
