"""The GPU's compute limit for a cohort round, and where a worker's round goes (the captured engine).

``python -m bench.captured_step [--clients K] [--samples N] [--epochs E] [--optimizer sgd|sam|asam]
[--data-dir DIR] [--profile] --out result.json`` on a CUDA machine. For K clients of N real Fashion-MNIST images
each (the papers' scale: K = 50, N = 125, E = 30, ASAM ρ = 0.5, B = 32, the paper CNN), it measures in one process:

* **the step limit**: the captured step (:class:`clients.captured.CapturedCohort`, one CUDA graph) replayed on one
  fixed batch, ms a step; × the round's steps = the least a round of these clients can take with this step on this
  GPU (no data movement, no plan, no clipping) — the ratio the app is reported against;
* the same step run eagerly (the vectorized engine's kernels launched one by one from Python), ms a step;
* **the worker's round split**: one round of :func:`clients.captured.train_captured` from the first call (graph
  capture included) and again (graphs cached), split into the plan (shuffles replayed, one host-to-device copy),
  the steps, the clip and the sum on the device (:func:`clients.cohort.clip_and_sum_stacked`'s math,
  :mod:`fl_app.privacy.stacked`) and the sum's copy to the host; and the vectorized engine's round
  (:func:`clients.vectorized.train_stacked`) for comparison;
* with ``--profile``, the eager step's top CUDA kernels (torch.profiler), to say what the step's time is made of.

Every figure is a median over repeats, synchronised with the device; threads pinned (torch, OpenMP, BLAS).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clients.captured import CapturedCohort, StepPlan, captured_cohort, resident_split, step_plan, train_captured
from clients.training import LocalTrainingConfig, local_lr
from clients.vectorized import batch_schedule, train_stacked
from fl_app.data.datasets import load_split
from fl_app.models import build_model_for_dataset
from fl_app.privacy.stacked import clip_stacked, sum_rows
from fl_app.threads import limit_library_threads

OPTIMIZERS = {
    "sgd": {"optimizer": "sgd"},
    "sam": {"optimizer": "sam", "rho": 0.05, "adaptive": False},
    "asam": {"optimizer": "sam", "rho": 0.5, "adaptive": True},
}


def _timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
    return out


def step_limit(workspace: CapturedCohort, plan: StepPlan, lr: float, steps: int) -> dict[str, float]:
    """ms a step, captured (replayed) and eager, on the plan's first batch (every client training)."""
    k = len(plan.order)
    globals_ = {name: p[0].clone() for name, p in workspace.params.items()}
    one = dataclasses.replace(plan, active=[k] * 1, index=plan.index[:1], weight=plan.weight[:1])
    workspace.train(globals_, one, lr)  # captures the graph for k
    graph = workspace.graphs[k]

    def replay() -> None:
        for _ in range(steps):
            graph.replay()

    def eager() -> None:
        with torch.no_grad():
            for _ in range(steps):
                workspace.step(k)

    captured = min(_timed(replay, 5)) / steps
    eager_s = min(_timed(eager, 3)) / steps
    return {"captured_step_ms": captured * 1e3, "eager_step_ms": eager_s * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--samples", type=int, default=125)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="asam")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clip-norm", type=float, default=0.2)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.captured_step needs a CUDA device", file=sys.stderr)
        return 2
    limit_library_threads(4)
    device = torch.device("cuda")
    train = load_split("fashion_mnist", args.data_dir, train=True)
    split = resident_split(train, device)
    rows = np.arange(args.clients * args.samples).reshape(args.clients, args.samples)
    indices = [rows[i] for i in range(args.clients)]
    config = LocalTrainingConfig(
        epochs=args.epochs, batch_size=args.batch_size, lr=0.1, momentum=0.5, weight_decay=5e-4, lr_decay=0.998,
        **OPTIMIZERS[args.optimizer],  # type: ignore[arg-type]
    )  # fmt: skip
    model = build_model_for_dataset("cnn", "fashion_mnist", seed=0).to(device)
    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": vars(args)}
    out["args"]["out"] = str(args.out)

    def gens(round_: int) -> list[torch.Generator]:
        return [torch.Generator().manual_seed(1000 * round_ + i) for i in range(args.clients)]

    # The worker's round, first (captures) and later (graphs cached), split into its parts.
    rounds = []
    for r in range(1, args.rounds + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        schedules = [batch_schedule(len(ix), config, g) for ix, g in zip(indices, gens(r), strict=True)]
        plan = step_plan(indices, schedules, config.batch_size, device)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        outcome = train_captured(model, split.x, split.y, indices, config, r, gens(r))
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        reference = {name: p.detach() for name, p in model.named_parameters()}
        deltas = [outcome.params[n] - reference[n] for n in reference]
        clipped, _norms, finite = clip_stacked(deltas, args.clip_norm)
        total = sum_rows(clipped, list(range(args.clients)))
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        host = [t.cpu().numpy() for t in total]
        t4 = time.perf_counter()
        rounds.append({
            "round": r, "plan_s": t1 - t0, "train_captured_s": t2 - t1, "clip_sum_s": t3 - t2, "to_host_s": t4 - t3,
            "steps": len(plan.active), "all_finite": bool(finite.all()),
            "sum_norm": float(np.sqrt(sum((h**2).sum() for h in host))),
        })  # fmt: skip
    out["captured_rounds"] = rounds
    steps = rounds[-1]["steps"]

    # The vectorized engine's round (same clients, same shuffles; data gathered from the host copy as the app does).
    data = [(train.x[torch.from_numpy(ix)], train.y[torch.from_numpy(ix)]) for ix in indices]
    vec = _timed(lambda: train_stacked(model, data, config, 2, gens(2), device), 2)
    out["vectorized_round_s"] = min(vec)

    # The step limit on a fixed batch.
    schedules = [batch_schedule(len(ix), config, g) for ix, g in zip(indices, gens(1), strict=True)]
    plan = step_plan(indices, schedules, config.batch_size, device)
    workspace = captured_cohort(model, split.x, split.y, config, args.clients, config.batch_size)
    limit = step_limit(workspace, plan, local_lr(config.lr, config.lr_decay, 1), steps=20)
    out.update(limit)
    out["round_limit_s"] = limit["captured_step_ms"] * steps / 1e3
    later = [r["plan_s"] + r["train_captured_s"] + r["clip_sum_s"] + r["to_host_s"] for r in rounds[1:]] or [0.0]
    out["worker_round_s"] = statistics.median(later)
    out["worker_round_over_limit"] = out["worker_round_s"] / out["round_limit_s"]
    out["vectorized_over_worker_round"] = out["vectorized_round_s"] / out["worker_round_s"]
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        k = len(plan.order)
        with profile(activities=[ProfilerActivity.CUDA]) as prof, torch.no_grad():
            for _ in range(3):
                workspace.step(k)
            torch.cuda.synchronize()
        out["profile"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps({k: v for k, v in out.items() if k != "profile"}, indent=2, default=str))
    if "profile" in out:
        print(out["profile"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
