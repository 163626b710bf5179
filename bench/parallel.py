"""The CPU physical limit: P one-thread plain-PyTorch loops in parallel processes, training one round's clients.

This is how pfl-research (Apple) runs a simulation on a CPU machine: ``torchrun`` with P worker processes of one
torch thread each, every process training its share of the round's clients and the shares' sums combined with a
collective. Here, for a validated :class:`~fl_app.config.AppConfig`, round t = 1..T:

* every process draws the same sampled partitions as bench/baseline.py (:func:`bench.baseline.sampled_partitions`)
  and the same split of them over the P processes, balanced by local step count K_i = E·⌈n_i/B⌉: longest first,
  each to the least-loaded process (:func:`balance_by_steps`);
* each process trains its share exactly as bench/baseline.py does (:func:`bench.baseline.local_train`, same data,
  same shuffle streams), clips each update to C and adds it to its float64 sum;
* the sums meet in rank 0 (``torch.distributed.reduce`` over gloo on 127.0.0.1), which divides by the fixed
  denominator m, adds the noise from the round's server stream and takes the server step
  (:func:`bench.baseline.server_step`), then broadcasts the new global model to the others.

The result equals bench/baseline.py's to float tolerance: only the float64 summation order differs.

``python -m bench.parallel [hydra overrides] --procs 2 --threads 1 --out result.json`` writes the per-round seconds
(rank 0's interval between consecutive round ends, so everything in a round counts), each process's busy seconds
per round (training + clipping; the rest of the round is waiting for the slowest process and the collectives) and
the final model (``result.npz``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from bench.baseline import (
    BaselineResult,
    check_supported,
    client_data,
    denominator,
    local_steps,
    local_train,
    partition_indices,
    sampled_partitions,
    server_step,
    shuffle_generator,
)
from fl_app.allocator import keep_freed_memory
from fl_app.config import AppConfig, compose_config
from fl_app.data.datasets import load_dataset
from fl_app.models import build_model_for_dataset, get_weights, set_weights, to_compute_layout
from fl_app.privacy import mechanisms as mech
from fl_app.threads import library_thread_counts, limit_library_threads


@dataclass
class ParallelResult(BaselineResult):
    procs: int = 1
    threads: int = 1
    #: per round, each rank's busy seconds (local training and clipping of its share)
    busy_seconds: list[list[float]] = field(default_factory=list)
    #: per round, each rank's total local steps
    rank_steps: list[list[int]] = field(default_factory=list)


def balance_by_steps(steps: Mapping[int, int], procs: int) -> list[list[int]]:
    """Split the partitions ``steps`` (partition → local steps) over ``procs`` processes: longest first, each to
    the least-loaded process (ties: the lower partition id first, the lower rank first). Deterministic, so every
    process computes the same split. Returns each process's partitions in ascending order."""
    if procs < 1:
        raise ValueError(f"procs must be >= 1, got {procs}")
    loads = [0] * procs
    shares: list[list[int]] = [[] for _ in range(procs)]
    for pid, k in sorted(steps.items(), key=lambda item: (-item[1], item[0])):
        rank = min(range(procs), key=lambda r: (loads[r], r))
        shares[rank].append(pid)
        loads[rank] += k
    return [sorted(share) for share in shares]


def _flatten64(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def _unflatten(flat: np.ndarray, shapes: list[tuple[int, ...]], dtype: np.dtype) -> list[np.ndarray]:
    out, offset = [], 0
    for shape in shapes:
        size = int(np.prod(shape, dtype=np.int64))
        out.append(flat[offset : offset + size].reshape(shape).astype(dtype, copy=True))
        offset += size
    return out


def _worker(
    rank: int, procs: int, threads: int, config: AppConfig, num_rounds: int, init_method: str, out: str
) -> None:
    torch.set_num_threads(threads)
    limit_library_threads(threads)
    keep_freed_memory()  # as the app's workers run (fl_app/allocator.py)
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # everything is on 127.0.0.1
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=procs)
    try:
        use_sam, private = check_supported(config)
        d, p = config.dataset, config.privacy
        train, _ = load_dataset(d.name, d.data_dir, download=d.download)
        model = build_model_for_dataset(config.model.name, d.name, seed=config.seed)
        model = to_compute_layout(model, torch.device("cpu"))  # the app's layout (bit-for-bit agreement)
        weights = get_weights(model)
        shapes = [tuple(w.shape) for w in weights]
        dtype = weights[0].dtype
        m = denominator(config)
        result = ParallelResult(weights=weights, procs=procs, threads=threads)
        dist.barrier()
        last = time.perf_counter()
        for t in range(1, num_rounds + 1):
            t0 = time.perf_counter()
            sampled = sampled_partitions(config, t)
            steps = {pid: local_steps(len(partition_indices(config, pid)), config) for pid in sampled}
            shares = balance_by_steps(steps, procs)
            total = np.zeros(sum(int(np.prod(s, dtype=np.int64)) for s in shapes), dtype=np.float64)
            for pid in shares[rank]:
                x, y = client_data(train, config, pid, "cpu")
                if len(y) == 0:
                    continue  # a zero update: adds nothing to the sum
                set_weights(model, weights)
                local_train(model, x, y, config, t, use_sam, shuffle_generator(config, t, pid))
                update = [new - old for new, old in zip(get_weights(model), weights, strict=True)]
                if private:
                    update = mech.clip_update(update, p.clip_norm)[0]
                total += _flatten64(update)
            busy = time.perf_counter() - t0
            summed = torch.from_numpy(total)
            dist.reduce(summed, dst=0)
            flat_weights = torch.empty(summed.numel(), dtype=torch.float32)
            if rank == 0:
                # The app's own averaging: Σ in float64 over the fixed denominator m (or the count), to float32.
                count = m if private else max(len(sampled), 1)
                average = mech.uniform_average([_unflatten(summed.numpy(), shapes, np.float64)], count, shapes)
                weights = server_step(config, weights, average, t, private)
                flat_weights.copy_(torch.from_numpy(np.concatenate([w.ravel() for w in weights])))
            dist.broadcast(flat_weights, src=0)
            weights = _unflatten(flat_weights.numpy(), shapes, dtype)
            now = time.perf_counter()
            result.round_seconds.append(now - last)
            last = now
            result.clients_per_round.append(len(sampled))
            stats = torch.tensor([busy, float(sum(steps[pid] for pid in shares[rank]))], dtype=torch.float64)
            gathered = [torch.empty_like(stats) for _ in range(procs)]
            dist.all_gather(gathered, stats)
            result.busy_seconds.append([float(g[0]) for g in gathered])
            result.rank_steps.append([int(g[1]) for g in gathered])
            last += time.perf_counter() - now  # the statistics exchange is not part of the round
        if rank == 0:
            result.weights = weights
            _save(result, Path(out))
        dist.barrier()  # nobody leaves (and closes its gloo sockets) while a peer still talks to it
    finally:
        dist.destroy_process_group()


def _save(result: ParallelResult, out: Path) -> None:
    weights_file = out.with_suffix(".npz")
    np.savez(weights_file, *result.weights)
    summary = {
        "round_seconds": result.round_seconds,
        "clients_per_round": result.clients_per_round,
        "procs": result.procs,
        "threads": result.threads,
        "library_threads": library_thread_counts(),
        "busy_seconds": result.busy_seconds,
        "rank_steps": result.rank_steps,
        "device": "cpu",
        "weights_file": str(weights_file),
    }
    out.write_text(json.dumps(summary, indent=2) + "\n")


def _load(out: Path) -> ParallelResult:
    summary = json.loads(out.read_text())
    with np.load(summary["weights_file"]) as saved:
        weights = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    return ParallelResult(
        weights=weights,
        round_seconds=summary["round_seconds"],
        clients_per_round=summary["clients_per_round"],
        procs=summary["procs"],
        threads=summary["threads"],
        busy_seconds=summary["busy_seconds"],
        rank_steps=summary["rank_steps"],
    )


def run_parallel(
    config: AppConfig,
    procs: int = 2,
    threads: int = 1,
    num_rounds: int | None = None,
    out: Path | None = None,
) -> ParallelResult:
    """Train ``config`` for ``num_rounds`` (default ``config.num_rounds``) rounds in ``procs`` processes of
    ``threads`` torch threads; returns rank 0's result (the global model, per-round seconds). With ``out`` the
    JSON summary and the model (``.npz`` next to it) stay there."""
    check_supported(config)
    rounds = config.num_rounds if num_rounds is None else num_rounds
    with tempfile.TemporaryDirectory(prefix="bench_parallel") as tmp:
        # A file store for the rendezvous, not a TCP port picked free and bound later: under a busy suite another
        # process took that port in between and a rank died in the handshake (gloo's own sockets bind port 0).
        init_method = f"file://{tmp}/rendezvous"
        target = out if out is not None else Path(tmp) / "result.json"
        torch_mp.spawn(
            _worker, args=(procs, threads, config, rounds, init_method, str(target)), nprocs=procs, join=True
        )
        return _load(target)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.parallel [hydra overrides] --procs P --threads 1 --out result.json``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of conf/config.yaml, as for apps.main")
    parser.add_argument("--procs", type=int, default=2, help="worker processes (P)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--out", type=Path, required=True, help="JSON result; the model goes next to it (.npz)")
    args = parser.parse_args(argv)
    run_parallel(compose_config(args.overrides), procs=args.procs, threads=args.threads, out=args.out.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
