"""The GPU's compute limit for a cohort round, and where a worker's round goes (the captured engine).

``python -m bench.captured_step [--clients K] [--samples N] [--epochs E] [--optimizer sgd|sam|asam]
[--data-dir DIR] [--profile] --out result.json`` on a CUDA machine (``--device cpu``: the same figures with every
step eager, the smoke run CI makes at a tiny size). For K clients of N real Fashion-MNIST images
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
from fl_app.data.datasets import TensorData, load_split
from fl_app.models import build_model_for_dataset
from fl_app.privacy.stacked import clip_stacked, sum_rows
from fl_app.threads import limit_library_threads

OPTIMIZERS = {
    "sgd": {"optimizer": "sgd"},
    "sam": {"optimizer": "sam", "rho": 0.05, "adaptive": False},
    "asam": {"optimizer": "sam", "rho": 0.5, "adaptive": True},
}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], repeats: int, device: torch.device) -> list[float]:
    out = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        fn()
        _synchronize(device)
        out.append(time.perf_counter() - start)
    return out


def step_limit(workspace: CapturedCohort, plan: StepPlan, lr: float, steps: int) -> dict[str, Any]:
    """ms a step on the plan's first batch (every client training): replayed from its graph where the workspace
    captures (a GPU) and eager; the limit is the faster of the two (on a CPU, the eager step: no graphs there)."""
    k = len(plan.order)
    device = workspace.x.device
    globals_ = {name: p[0].clone() for name, p in workspace.params.items()}
    one = dataclasses.replace(plan, active=[k] * 1, index=plan.index[:1], weight=plan.weight[:1])
    workspace.train(globals_, one, lr)  # captures the graph for k (on a GPU)

    def eager() -> None:
        with torch.no_grad():
            for _ in range(steps):
                workspace.step(k)

    out: dict[str, Any] = {"eager_step_ms": min(_timed(eager, 3, device)) / steps * 1e3, "captured_step_ms": None}
    graph = workspace.graphs.get(k)
    if graph is not None:

        def replay() -> None:
            for _ in range(steps):
                graph.replay()

        out["captured_step_ms"] = min(_timed(replay, 5, device)) / steps * 1e3
    out["step_limit_ms"] = out["captured_step_ms"] if graph is not None else out["eager_step_ms"]
    out["step_limit_of"] = "graph replay" if graph is not None else "eager step (no CUDA graphs on this device)"
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--samples", type=int, default=125)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="asam")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clip-norm", type=float, default=0.2)
    parser.add_argument("--steps", type=int, default=20, help="steps a timing of the step limit repeats")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the same measurements with every step eager (a smoke run; no graphs)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=4, help="torch's and OpenMP's threads (BLAS: 1)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    return parser


@dataclasses.dataclass
class _Setup:
    """What every measurement shares: the device, the resident split, the clients' rows, the config and model."""

    device: torch.device
    train: TensorData
    split: TensorData
    indices: list[np.ndarray]
    config: LocalTrainingConfig
    model: torch.nn.Module

    def generators(self, round_: int) -> list[torch.Generator]:
        return [torch.Generator().manual_seed(1000 * round_ + i) for i in range(len(self.indices))]

    def plan(self, round_: int) -> StepPlan:
        gens = self.generators(round_)
        schedules = [batch_schedule(len(ix), self.config, g) for ix, g in zip(self.indices, gens, strict=True)]
        return step_plan(self.indices, schedules, self.config.batch_size, self.device)


def _setup(args: argparse.Namespace) -> _Setup:
    device = torch.device(args.device)
    train = load_split("fashion_mnist", args.data_dir, train=True)
    rows = np.arange(args.clients * args.samples).reshape(args.clients, args.samples)
    config = LocalTrainingConfig(
        epochs=args.epochs, batch_size=args.batch_size, lr=0.1, momentum=0.5, weight_decay=5e-4, lr_decay=0.998,
        **OPTIMIZERS[args.optimizer],  # type: ignore[arg-type]
    )  # fmt: skip
    model = build_model_for_dataset("cnn", "fashion_mnist", seed=0).to(device)
    return _Setup(device, train, resident_split(train, device), list(rows), config, model)


def worker_rounds(s: _Setup, rounds: int, clip_norm: float) -> list[dict[str, Any]]:
    """The worker's round, first (captures, on a GPU) and later (graphs cached), split into its parts."""
    out = []
    for r in range(1, rounds + 1):
        _synchronize(s.device)
        t0 = time.perf_counter()
        plan = s.plan(r)
        _synchronize(s.device)
        t1 = time.perf_counter()
        outcome = train_captured(s.model, s.split.x, s.split.y, s.indices, s.config, r, s.generators(r))
        _synchronize(s.device)
        t2 = time.perf_counter()
        reference = {name: p.detach() for name, p in s.model.named_parameters()}
        deltas = [outcome.params[n] - reference[n] for n in reference]
        clipped, _norms, finite = clip_stacked(deltas, clip_norm)
        total = sum_rows(clipped, list(range(len(s.indices))))
        _synchronize(s.device)
        t3 = time.perf_counter()
        host = [t.cpu().numpy() for t in total]
        t4 = time.perf_counter()
        out.append({
            "round": r, "plan_s": t1 - t0, "train_captured_s": t2 - t1, "clip_sum_s": t3 - t2, "to_host_s": t4 - t3,
            "steps": len(plan.active), "all_finite": bool(finite.all()),
            "sum_norm": float(np.sqrt(sum((h**2).sum() for h in host))),
        })  # fmt: skip
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of the module's docstring, for ``args`` (a parsed command line; not modified)."""
    s = _setup(args)
    gpu = torch.cuda.get_device_name(s.device) if s.device.type == "cuda" else None
    out: dict[str, Any] = {"device": args.device, "gpu": gpu, "torch": torch.__version__}
    out["args"] = {**vars(args), "out": str(args.out)}  # a copy: the namespace keeps its Path
    out["captured_rounds"] = rounds = worker_rounds(s, args.rounds, args.clip_norm)
    steps = rounds[-1]["steps"]
    # The vectorized engine's round (same clients, same shuffles; data gathered from the host copy as the app does).
    data = [(s.train.x[torch.from_numpy(ix)], s.train.y[torch.from_numpy(ix)]) for ix in s.indices]
    vec = _timed(lambda: train_stacked(s.model, data, s.config, 2, s.generators(2), s.device), 2, s.device)
    out["vectorized_round_s"] = min(vec)
    # The step limit on a fixed batch.
    plan = s.plan(1)
    workspace = captured_cohort(s.model, s.split.x, s.split.y, s.config, len(s.indices), s.config.batch_size,
                                graphs=s.device.type == "cuda")  # fmt: skip
    limit = step_limit(workspace, plan, local_lr(s.config.lr, s.config.lr_decay, 1), steps=args.steps)
    out.update(limit)
    out["round_limit_s"] = limit["step_limit_ms"] * steps / 1e3
    later = [r["plan_s"] + r["train_captured_s"] + r["clip_sum_s"] + r["to_host_s"] for r in rounds[1:]] or [0.0]
    out["worker_round_s"] = statistics.median(later)
    out["worker_round_over_limit"] = out["worker_round_s"] / out["round_limit_s"]
    out["vectorized_over_worker_round"] = out["vectorized_round_s"] / out["worker_round_s"]
    if args.profile:
        out["profile"] = _profile(workspace, len(plan.order))
    return out


def _profile(workspace: CapturedCohort, k: int) -> str:
    """The eager step's top kernels (CUDA) or operators (CPU)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = workspace.x.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof, torch.no_grad():
        for _ in range(3):
            workspace.step(k)
        _synchronize(workspace.x.device)
    return prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=25)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench.captured_step --device cuda needs a CUDA device (--device cpu runs it eagerly)", file=sys.stderr)
        return 2
    limit_library_threads(args.threads)
    out = measure(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps({k: v for k, v in out.items() if k != "profile"}, indent=2, default=str))
    if "profile" in out:
        print(out["profile"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
