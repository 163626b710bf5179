"""What distributed DP costs per round against central DP (docs/performance.md "Distributed DP"), in one process
on this machine's cores, each library pinned to one thread.

``python -m bench.secure_sum [--clients 10 50 100] [--neighbours 16] [--out FILE]`` runs, for m clients and the
CNN's d = 1,663,370 weights, one round of each placement's server and client work on updates of norm C (no local
training, no transport: the same in both):

* **central** (server placement): each client clips its float32 update (its critical path); the server sums the m
  updates over the fixed m and draws N(0, σ²C²/m²) on the average;
* **distributed**: SecAgg+'s four stages between the server's state machine and m real clients
  (``fl_app/secure_aggregation``), with the collect stage's encoding (rotation, conditional rounding, Skellam share,
  ``fl_app/privacy/distributed``) and masks; each client's time is its own four stages (clients run in parallel in a
  deployment, so the round's client-side cost is one client's), the server's is its four ``take``s, the unmask and
  the decoding. Each client masks with every other client (SecAgg) up to ``--neighbours`` + 1 clients and with
  ``--neighbours`` in a random Harary graph (SecAgg+) above that.

It also states the bytes a client sends (float32 update vs the masked vector of b = 32 bits over d' = 2^21). The
result is one JSON document (``--out``, and printed) with the medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402 - after the thread pins

from fl_app.privacy import mechanisms as mech  # noqa: E402
from fl_app.privacy.distributed import SkellamCodec, SkellamParameters  # noqa: E402
from fl_app.secure_aggregation import ClientSecAgg, SecureSumRound  # noqa: E402

DIMENSION = 1_663_370  # the CNN's weights (fl_app/models.py, Fashion-MNIST)
CLIP, SIGMA = 0.2, 0.95


def _updates(m: int, dimension: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(dimension).astype(np.float32) for _ in range(m)]


def central_round(updates: list[np.ndarray], rng: np.random.Generator) -> dict[str, float]:
    """One client's clip (the slowest of them) and the server's sum over m and noise."""
    client = []
    clipped = []
    for update in updates:
        start = time.perf_counter()
        clipped.append(mech.clip_update([update], CLIP)[0][0])
        client.append(time.perf_counter() - start)
    start = time.perf_counter()
    average = mech.uniform_average([[c] for c in clipped], len(updates), [updates[0].shape])
    mech.add_gaussian_noise(average, SIGMA * CLIP / len(updates), rng)
    return {"client_s": max(client), "server_s": time.perf_counter() - start}


def distributed_round(updates: list[np.ndarray], neighbours: int | None, rng: np.random.Generator) -> dict[str, float]:
    """The four stages for m clients: the slowest client's own time and the server's."""
    m = len(updates)
    threshold = m // 2 + 1 if neighbours is None else min(m // 2 + 1, neighbours + 1)  # within a neighbourhood
    parameters = SkellamParameters(CLIP, updates[0].size, threshold, m, SIGMA)
    clipped = [mech.clip_update([u], CLIP)[0][0].astype(np.float64) for u in updates]
    nodes = list(range(1, m + 1))
    server_s = 0.0
    client_s = dict.fromkeys(nodes, 0.0)

    def timed_server(call, *args):
        nonlocal server_s
        start = time.perf_counter()
        out = call(*args)
        server_s += time.perf_counter() - start
        return out

    def timed_client(node, call, *args):
        start = time.perf_counter()
        out = call(*args)
        client_s[node] += time.perf_counter() - start
        return out

    server = timed_server(SecureSumRound, nodes, parameters.min_clients, parameters.bits, parameters.padded, neighbours)
    clients = {n: ClientSecAgg(n, **server.settings()) for n in nodes}
    timed_server(server.take_keys, {n: timed_client(n, c.setup) for n, c in clients.items()})
    requests = timed_server(server.key_requests)
    timed_server(server.take_shares, {n: timed_client(n, clients[n].share_keys, r) for n, r in requests.items()})
    collect = timed_server(server.collect_requests)
    codec = SkellamCodec(parameters, rotation_seed=1)
    masked = {}
    for (n, request), update in zip(collect.items(), clipped, strict=True):
        encoded = timed_client(n, codec.encode, update, rng)
        masked[n] = timed_client(n, clients[n].masked, *request, encoded)
    timed_server(server.take_masked, masked)
    unmask = timed_server(server.unmask_requests)
    total = timed_server(server.unmask, {n: timed_client(n, clients[n].unmask, *u) for n, u in unmask.items()})
    timed_server(codec.decode, total)
    return {"client_s": max(client_s.values()), "server_s": server_s}


def _median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def measure(clients: list[int], neighbours: int, repeats: int, dimension: int = DIMENSION) -> dict[str, Any]:
    """The table's rows: for each m, the medians over ``repeats`` rounds of each placement."""
    rng = np.random.default_rng(0)
    rows = []
    for m in clients:
        updates = _updates(m, dimension, rng)
        degree = None if m - 1 <= neighbours else neighbours
        central = [central_round(updates, rng) for _ in range(repeats)]
        distributed = [distributed_round(updates, degree, rng) for _ in range(repeats)]
        rows.append({
            "clients": m,
            "neighbours": m - 1 if degree is None else degree,
            "central_client_s": _median(central, "client_s"),
            "central_server_s": _median(central, "server_s"),
            "distributed_client_s": _median(distributed, "client_s"),
            "distributed_server_s": _median(distributed, "server_s"),
            "central_upload_bytes": 4 * dimension,
            "distributed_upload_bytes": 4 * 2 ** math.ceil(math.log2(dimension)),
        })  # fmt: skip
    return {"dimension": dimension, "bits": 32, "repeats": repeats, "cores": os.cpu_count(), "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--neighbours", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    result = measure(args.clients, args.neighbours, args.repeats)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
