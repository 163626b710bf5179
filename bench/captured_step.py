"""The GPU's compute limit for a cohort round, and where a worker's round goes (the captured engine).

``python -m bench.captured_step [--cohorts equal|app] [--clients K] [--samples N] [--epochs E]
[--optimizer sgd|sam|asam] [--override HYDRA ...] [--data-dir DIR] [--profile] [--plan-only] --out result.json`` on a
CUDA machine (``--device cpu``: the same figures with every step eager, the smoke runs CI makes at a tiny size).
The clients: ``equal`` (default), K clients of N consecutive real Fashion-MNIST images each, the same every round
(K = 50, N = 125, E = 30, ASAM ρ = 0.5, B = 32: the papers' scale with equal clients); ``app``, the app's own at
bench.run's GPU overrides — its Dirichlet partition, a Poisson(q) cohort each round and DP-FedSAM's local training —
so that the worker's round is the one the app's rounds run (unequal clients: more steps, most of them narrower, in
several step shapes). It measures in one process:

* **the round's limit**: for each step shape of the last round (:func:`clients.captured.step_shape`), the step on a
  fixed batch as the round runs it (its CUDA graph replayed where there is one, else eager), ms a step; summed
  over the round's steps = the least that round can take with this step on this device (no data movement, no
  plan, no clipping) — the figure the worker's and the app's rounds are reported against; ``captured_step_ms`` is
  the full-width step replayed;
* the full-width step run eagerly (the vectorized engine's kernels launched one by one from Python), ms a step;
* **the worker's round split**: each round of :func:`clients.captured.train_captured` (the first captures; its
  plan included, whose cost — shuffles replayed, one host-to-device copy — is also timed apart), the clip and the
  sum on the device (:func:`clients.cohort.clip_and_sum_stacked`'s math, :mod:`fl_app.privacy.stacked`) and the
  sum's copy to the host, with the graphs it captured and the steps it replayed or ran eagerly; and the vectorized
  engine's round (:func:`clients.vectorized.train_stacked`) on the last round's clients for comparison;
* with ``--variants``, the full-width step's other formulations (bench/step_variants.py: convolutions as batched
  GEMMs, bf16 autocast, both) timed as the engine would run them, against its own, with TFLOP/s;
* with ``--profile``, the eager step's top CUDA kernels (CPU operators on a CPU), to say what the step is made of;
* with ``--plan-only`` (any machine, seconds, nothing trained): per round its steps, the distinct numbers k of
  training clients and the step shapes, and over the run the graphs keyed by k against keyed by shape.

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

from clients.captured import (
    CapturedCohort,
    StepPlan,
    captured_cohort,
    resident_split,
    step_plan,
    step_shape,
    train_captured,
)
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


def timed(fn: Callable[[], Any], repeats: int, device: torch.device) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn``, synchronised with ``device``."""
    out = []
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        fn()
        _synchronize(device)
        out.append(time.perf_counter() - start)
    return out


def step_limit(workspace: CapturedCohort, plan: StepPlan, lr: float, steps: int) -> dict[str, Any]:
    """ms a step on the plan's first batch, per step shape the plan's round runs (:func:`step_shape`), each the way
    the round runs it: replayed from its graph where the workspace has one (a GPU), else eager; and the full
    shape eager. The round's limit is the sum over its steps (equal clients: one shape, steps × its time)."""
    k_all = len(plan.order)
    device = workspace.x.device
    globals_ = {name: p[0].clone() for name, p in workspace.params.items()}
    one = dataclasses.replace(plan, active=[k_all], index=plan.index[:1], weight=plan.weight[:1])
    workspace.train(globals_, one, lr)  # the first batch into the static inputs (graphs: those of the rounds run)

    def eager(shape: int) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                for _ in range(steps):
                    workspace.step(shape)

        return run

    def replay(graph: torch.cuda.CUDAGraph) -> Callable[[], None]:
        def run() -> None:
            for _ in range(steps):
                graph.replay()

        return run

    shapes = [step_shape(k, workspace.capacity) for k in plan.active]
    per_shape: dict[int, float] = {}
    for shape in sorted(set(shapes)):
        graph = workspace.graphs.get(shape)
        fn = replay(graph) if graph is not None else eager(shape)
        per_shape[shape] = min(timed(fn, 5 if graph is not None else 3, device)) / steps * 1e3
    full = step_shape(k_all, workspace.capacity)
    return {
        "eager_step_ms": min(timed(eager(full), 3, device)) / steps * 1e3,
        "captured_step_ms": per_shape[full] if full in workspace.graphs else None,
        "step_ms_by_shape": {str(shape): ms for shape, ms in per_shape.items()},
        "steps_by_shape": {str(shape): shapes.count(shape) for shape in sorted(set(shapes))},
        "step_limit_of": "graph replay" if workspace.graphs else "eager step (no CUDA graphs on this device)",
        "round_limit_s": sum(per_shape[shape] for shape in shapes) / 1e3,
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cohorts", choices=("equal", "app"), default="equal",
                        help="equal: --clients × --samples; app: the app's partition and Poisson cohorts at "
                        "bench.run's GPU overrides (unequal clients, as the app's rounds train them)")  # fmt: skip
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides on top of those (--cohorts app)")
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
    parser.add_argument("--variants", action="store_true",
                        help="also time the step's other formulations (bench/step_variants.py)")  # fmt: skip
    parser.add_argument("--plan-only", action="store_true", help="count each round's steps and shapes, train nothing")
    parser.add_argument("--out", type=Path, required=True)
    return parser


@dataclasses.dataclass
class _Setup:
    """What every measurement shares: the device, the resident split, each round's clients (their rows of the
    split), the local training config and the model."""

    device: torch.device
    train: TensorData
    split: TensorData
    cohorts: Callable[[int], list[np.ndarray]]
    config: LocalTrainingConfig
    model: torch.nn.Module

    def generators(self, round_: int) -> list[torch.Generator]:
        return [torch.Generator().manual_seed(1000 * round_ + i) for i in range(len(self.cohorts(round_)))]

    def plan(self, round_: int) -> StepPlan:
        indices, gens = self.cohorts(round_), self.generators(round_)
        schedules = [batch_schedule(len(ix), self.config, g) for ix, g in zip(indices, gens, strict=True)]
        return step_plan(indices, schedules, self.config.batch_size, self.device)


def _equal_cohorts(args: argparse.Namespace) -> tuple[Callable[[int], list[np.ndarray]], LocalTrainingConfig]:
    """``--clients`` clients of ``--samples`` consecutive images, the same every round."""
    rows = list(np.arange(args.clients * args.samples).reshape(args.clients, args.samples))
    config = LocalTrainingConfig(
        epochs=args.epochs, batch_size=args.batch_size, lr=0.1, momentum=0.5, weight_decay=5e-4, lr_decay=0.998,
        **OPTIMIZERS[args.optimizer],  # type: ignore[arg-type]
    )  # fmt: skip
    return lambda _round: rows, config


def _app_cohorts(args: argparse.Namespace) -> tuple[Callable[[int], list[np.ndarray]], LocalTrainingConfig]:
    """The app's clients at bench.run's GPU overrides (plus ``--override``): its partition of the training split
    (Dirichlet: unequal clients), a Poisson(q) cohort of them each round, and its local training (DP-FedSAM's)."""
    from bench.run import GPU_OVERRIDES, with_overrides
    from clients.local_update import client_indices
    from fl_app.config import compose_config
    from fl_app.instructions import DataSpec, local_training_config

    extra = [*args.override, *([f"dataset.data_dir={args.data_dir}"] if args.data_dir else [])]
    config = compose_config(with_overrides(GPU_OVERRIDES, *extra))
    d = config.dataset
    spec = DataSpec(d.name, d.data_dir or "", d.download, d.partition, d.alpha, d.num_clients, config.seed,
                    d.max_train_samples or 0)  # fmt: skip
    clients = [client_indices(spec, pid) for pid in range(d.num_clients)]
    rng = np.random.default_rng(config.seed)
    draws = rng.random((args.rounds + 2, d.num_clients)) < config.privacy.sample_rate
    cohorts = {r: [clients[i] for i in np.flatnonzero(draws[r - 1])] for r in range(1, args.rounds + 3)}
    return cohorts.__getitem__, local_training_config(config, "sam")


def _setup(args: argparse.Namespace) -> _Setup:
    device = torch.device(args.device)
    train = load_split("fashion_mnist", args.data_dir, train=True)
    cohorts, config = _app_cohorts(args) if args.cohorts == "app" else _equal_cohorts(args)
    model = build_model_for_dataset("cnn", "fashion_mnist", seed=0).to(device)
    return _Setup(device, train, resident_split(train, device), cohorts, config, model)


def worker_rounds(s: _Setup, rounds: int, clip_norm: float) -> list[dict[str, Any]]:
    """The worker's round, first (captures, on a GPU) and later (graphs cached), split into its parts, with the
    graphs captured, the steps replayed and those run eagerly in each."""
    out = []
    previous: tuple[CapturedCohort | None, tuple[int, int, int]] = (None, (0, 0, 0))
    for r in range(1, rounds + 1):
        indices = s.cohorts(r)
        _synchronize(s.device)
        t0 = time.perf_counter()
        plan = s.plan(r)
        _synchronize(s.device)
        t1 = time.perf_counter()
        outcome = train_captured(s.model, s.split.x, s.split.y, indices, s.config, r, s.generators(r))
        _synchronize(s.device)
        t2 = time.perf_counter()
        reference = {name: p.detach() for name, p in s.model.named_parameters()}
        deltas = [outcome.params[n] - reference[n] for n in reference]
        clipped, _norms, finite = clip_stacked(deltas, clip_norm)
        total = sum_rows(clipped, list(range(len(indices))))
        _synchronize(s.device)
        t3 = time.perf_counter()
        host = [t.cpu().numpy() for t in total]
        t4 = time.perf_counter()
        workspace = _workspace(s, len(indices))
        counts = (workspace.captures, workspace.replays, workspace.eager_steps)
        # A cohort larger than the workspace's room makes a new one (its counters start at zero).
        before = previous[1] if previous[0] is workspace else (0, 0, 0)
        captures, replays, eager_steps = (now - then for now, then in zip(counts, before, strict=True))
        previous = (workspace, counts)
        out.append({
            "round": r, "clients": len(indices), "plan_s": t1 - t0, "train_captured_s": t2 - t1,
            "clip_sum_s": t3 - t2, "to_host_s": t4 - t3, "steps": len(plan.active), "all_finite": bool(finite.all()),
            "sum_norm": float(np.sqrt(sum((h**2).sum() for h in host))),
            "captures": captures, "replays": replays, "eager_steps": eager_steps, "capacity": workspace.capacity,
        })  # fmt: skip
    return out


def _workspace(s: _Setup, clients: int) -> CapturedCohort:
    """The workspace :func:`clients.captured.train_captured` used for these clients (the same key, found again)."""
    return captured_cohort(s.model, s.split.x, s.split.y, s.config, clients, s.config.batch_size,
                           graphs=s.device.type == "cuda")  # fmt: skip


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of the module's docstring, for ``args`` (a parsed command line; not modified)."""
    s = _setup(args)
    gpu = torch.cuda.get_device_name(s.device) if s.device.type == "cuda" else None
    out: dict[str, Any] = {"device": args.device, "gpu": gpu, "torch": torch.__version__}
    out["args"] = {**vars(args), "out": str(args.out)}  # a copy: the namespace keeps its Path
    out["captured_rounds"] = rounds = worker_rounds(s, args.rounds, args.clip_norm)
    # The vectorized engine's round (the last round's clients and shuffles; data gathered from the host copy as the
    # app does).
    last = args.rounds
    rows = [torch.from_numpy(np.array(ix)) for ix in s.cohorts(last)]  # a copy: partitions are read-only
    data = [(s.train.x[r], s.train.y[r]) for r in rows]
    vec = timed(lambda: train_stacked(s.model, data, s.config, last, s.generators(last), s.device), 2, s.device)
    out["vectorized_round_s"] = min(vec)
    # The step limit of the last round, on a fixed batch.
    plan = s.plan(last)
    workspace = _workspace(s, len(plan.order))
    out.update(step_limit(workspace, plan, local_lr(s.config.lr, s.config.lr_decay, last), steps=args.steps))
    # train_captured makes the round's plan itself: plan_s (the same plan made apart) is what that part costs, not
    # more work of the worker's round.
    later = [r["train_captured_s"] + r["clip_sum_s"] + r["to_host_s"] for r in rounds[1:]] or [0.0]
    out["worker_round_s"] = statistics.median(later)
    out["last_worker_round_s"] = later[-1]
    out["last_worker_round_over_limit"] = later[-1] / out["round_limit_s"]
    out["vectorized_over_last_worker_round"] = out["vectorized_round_s"] / later[-1]
    if args.variants:
        from bench.step_variants import time_variants

        lr = local_lr(s.config.lr, s.config.lr_decay, last)
        out["step_variants"] = time_variants(s.model, s.split.x, s.split.y, s.config, plan, lr, args.steps)
    if args.profile:
        out["profile"] = _profile(workspace, step_shape(len(plan.order), workspace.capacity))
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


def plan_shapes(args: argparse.Namespace) -> dict[str, Any]:
    """Without training (any machine, seconds): per round the cohort's clients, its steps, how many distinct
    numbers k of training clients they have (the graphs a round needs keyed by k) and how many step shapes
    (:func:`clients.captured.step_shape`, keyed as the engine keys them)."""
    s = _setup(argparse.Namespace(**{**vars(args), "device": "cpu"}))  # nothing runs: the plans are the host's
    rounds, every_k = [], set()
    for r in range(1, args.rounds + 1):
        active = s.plan(r).active
        every_k.update(active)
        rounds.append({"round": r, "clients": len(s.cohorts(r)), "steps": len(active),
                       "distinct_k": len(set(active)), "shapes": len({step_shape(k) for k in active})})  # fmt: skip
    return {
        "args": {**vars(args), "out": str(args.out)},
        "rounds": rounds,
        # Over the whole run: the graphs keyed by k it needs, and keyed by shape.
        "run_distinct_k": len(every_k),
        "run_shapes": len({step_shape(k) for k in every_k}),
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.plan_only:
        out = plan_shapes(args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")
        print(json.dumps({k: v for k, v in out.items() if k != "args"}))
        return 0
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
