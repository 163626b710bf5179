"""The least a round or a startup can take on this machine: limits and floors for bench/peer.py.

* **Compute limit** (:func:`compute_limit`): the run's own local step (SGD, or SAM's two passes) on a fixed
  batch of the run's size, on one thread in a fresh process, timed over many steps; a round's limit is its
  samples × local epochs × (seconds per sample on one thread) / cores — every core busy with nothing but that
  step, perfectly balanced, no framework, no data movement.
* **Workload floor** (:func:`workload_floor`): every local step of a round at the bare step's speed for its batch
  size (short last batches included, :func:`round_batches`), spread perfectly over the cores.
* **Ray's and Flower's engine floors**: to the first local step (:func:`ray_engine_floor`,
  :func:`flower_engine_floor`) and a round (:func:`flower_round_floor`: the least FedAvg on Flower's engine for the
  app's rounds and cohorts, bench/flower_floor.py).
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.processes import ROOT, THREAD_ENV, run_env, run_monitored
from fl_app.config import AppConfig, compose_config

_LIMIT_CODE = r"""
import json, sys, time
import torch, torch.nn.functional as F
import strategies  # registers the strategy names a config is validated by
from fl_app.config import compose_config
from fl_app.models import build_model_for_dataset, to_compute_layout
from fl_app.allocator import keep_freed_memory
from fl_app.threads import limit_library_threads
torch.set_num_threads(1); limit_library_threads(1); keep_freed_memory()  # as the app's workers run
overrides, steps, device = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cfg = compose_config(overrides)
c = cfg.client
model = build_model_for_dataset(cfg.model.name, cfg.dataset.name, seed=cfg.seed)
model = to_compute_layout(model, torch.device(device))  # the layout the app trains in
from fl_app.data.datasets import DATASETS
info = DATASETS[cfg.dataset.name]
x = torch.randn(c.batch_size, info.in_channels, info.image_size, info.image_size, device=device)
y = torch.randint(0, info.num_classes, (c.batch_size,), device=device)
from clients.training import sgd_kernels  # the optimizer kernels the app's local training runs
kernels = sgd_kernels(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=c.momentum, weight_decay=c.weight_decay, **kernels)
sam = cfg.strategy.name in ("dp_fedsam", "fedsam", "dp_fedsam_topk")
def step(xb, yb):
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(xb), yb).backward()
    if sam:  # the second pass of SAM; the ascent's elementwise work is part of the app's cost, not the limit's
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(xb), yb).backward()
    opt.step()
def best_step_s(size, count):
    xb, yb = x[:size].contiguous(), y[:size].contiguous()
    best = float("inf")
    for _ in range(3):
        if device != "cpu": torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(count):
            step(xb, yb)
        if device != "cpu": torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / count)
    return best
for _ in range(10):
    step(x, y)
out = {"step_s": best_step_s(c.batch_size, steps), "batch_size": c.batch_size, "sam": sam}
# The workload's other batch sizes (clients' short last batches), fewer steps each: argv[4], a JSON list.
sizes = json.loads(sys.argv[4]) if len(sys.argv) > 4 else []
out["step_s_by_batch"] = {str(b): best_step_s(b, max(steps // 4, 5)) for b in sizes if b != c.batch_size}
out["step_s_by_batch"][str(c.batch_size)] = out["step_s"]
print(json.dumps(out))
"""


def compute_limit(overrides: list[str], cores: int, steps: int = 60, batch_sizes: Sequence[int] = ()) -> dict[str, Any]:
    """Seconds per sample of the run's bare local step on one thread (best of 3 × ``steps`` steps after 10 warm-up
    steps), and the machine's rate with ``cores`` such threads; with ``batch_sizes``, the bare step's seconds at each
    of them too (best of 3 × ``steps // 4``), under ``step_s_by_batch`` (for :func:`workload_floor`)."""
    env = {**os.environ, **THREAD_ENV}
    sizes = sorted({int(b) for b in batch_sizes})
    proc = subprocess.run(
        [sys.executable, "-c", _LIMIT_CODE, json.dumps(overrides), str(steps), "cpu", json.dumps(sizes)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    step = json.loads(proc.stdout.strip().splitlines()[-1])
    per_sample = step["step_s"] / step["batch_size"]
    return {
        **step,
        "cores": cores,
        "seconds_per_sample_one_thread": per_sample,
        "samples_per_s_one_thread": 1 / per_sample,
        "samples_per_s_machine": cores / per_sample,
    }


# What Flower's Ray engine costs before any of the app's code can run: the interpreter, ``import ray``, ``ray.init``
# with the app's own init arguments, then one actor per core that imports torch and flwr (what every ClientApp
# worker imports before its first local step), all answered. Times are seconds from the command's start.
_RAY_FLOOR_CODE = r"""
import json, sys, time
start = float(sys.argv[1])
import psutil, ray
ray.init(**json.loads(sys.argv[2]))
initialised = time.time()
@ray.remote(num_cpus=1)
class Worker:
    def ready(self):
        import torch, flwr
        return time.time()
workers = [Worker.remote() for _ in range(int(sys.argv[3]))]
ready = ray.get([w.ready.remote() for w in workers])
cpu = 0.0
for proc in [psutil.Process()] + psutil.Process().children(recursive=True):  # Ray's daemons and workers
    try:
        t = proc.cpu_times()
        cpu += t.user + t.system + t.children_user + t.children_system
    except psutil.Error:
        pass
print(json.dumps({"ray_init_s": initialised - start, "workers_ready_s": max(ready) - start, "cpu_s": cpu}))
ray.shutdown()
"""


def ray_engine_floor(overrides: list[str], workers: int, tmp: Path) -> dict[str, float]:
    """Seconds from a command's start to ``ray.init`` returning and to ``workers`` Ray actors that have imported
    torch and flwr (with the app's ``ray.init`` arguments, :func:`apps.main.backend_config`): the least any
    app on Flower's Ray engine takes to its first local step, before its own imports, config and data; and the CPU
    seconds its processes used by then (``cpu_s``)."""
    from apps.main import backend_config

    init_args = backend_config(compose_config(overrides))["init_args"]
    env = {**run_env(tmp / "env_ray_floor"), **THREAD_ENV}
    start = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", _RAY_FLOOR_CODE, repr(start), json.dumps(init_args), str(workers)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])


def flower_engine_floor(overrides: list[str], tmp: Path, ray_start: str = "app") -> dict[str, float]:
    """Seconds from a command's start to the first local step of a ClientApp that does nothing but import torch,
    run by Flower's ``run_simulation`` with the app's backend config and SuperNode count (bench/flower_floor.py),
    Ray started as the app starts it (``ray_start="app"``) or by Flower's backend (``"flower"``); ``cpu_s``: the CPU
    seconds every process of that command had used by then. The least any app on Flower's simulation engine can
    start in, on this machine, before its own config, data, model and strategy."""
    from apps.main import backend_config, concurrent_workers, simulation_nodes

    config = compose_config(overrides)
    out = tmp / f"flower_floor_{ray_start}.json"
    env = {**run_env(tmp / f"env_flower_floor_{ray_start}"), **THREAD_ENV}
    nodes, workers = simulation_nodes(config), concurrent_workers(config)
    cmd = [
        sys.executable, "-m", "bench.flower_floor", json.dumps(backend_config(config)), str(nodes), str(workers),
        str(out), ray_start,
    ]  # fmt: skip
    start, monitor = run_monitored(cmd, env, tmp / f"flower_floor_{ray_start}.log", env["RAY_TMPDIR"], 600)
    floor = json.loads(out.read_text())
    return {
        "first_step_s": floor["first_step_unix"] - start,
        "cpu_s": monitor.cpu_seconds_at(floor["first_step_unix"]),
        "nodes": nodes,
        "workers": workers,
        "ray_start": ray_start,
    }


def client_batch_sizes(samples: int, batch_size: int, epochs: int) -> list[int]:
    """The batch size of each local step of a client with ``samples`` examples: per epoch ⌊n/B⌋ full batches and
    one of n mod B (the workload's shape, the short last batch included)."""
    full, short = divmod(samples, batch_size)
    return ([batch_size] * full + ([short] if short else [])) * epochs


def round_floor_plan(config: AppConfig, workers: int) -> dict[str, Any]:
    """bench/flower_floor.py's ``--rounds`` plan for the app's run of ``config.num_rounds`` rounds: per round the
    app's sampled clients (:func:`bench.baseline.sampled_partitions`) in the app's cohorts (its split,
    :func:`strategies.cohorts.balance_cohorts` by :func:`strategies.cohorts.local_work`), each a list of its
    clients' batch sizes (:func:`client_batch_sizes`) in partition order."""
    from bench.baseline import check_supported, partition_indices, sampled_partitions
    from fl_app.data.datasets import DATASETS
    from fl_app.instructions import local_training_config
    from fl_app.models import build_model_for_dataset, weight_shapes
    from strategies.cohorts import balance_cohorts, local_work

    use_sam, _ = check_supported(config)
    training = local_training_config(config, "sam" if use_sam else "sgd")
    c, info = config.client, DATASETS[config.dataset.name]
    plan = []
    for t in range(1, config.num_rounds + 1):
        pids = sampled_partitions(config, t)
        cohorts = balance_cohorts(pids, [local_work(config, training, pid) for pid in pids], workers)
        plan.append(
            [
                [
                    client_batch_sizes(len(partition_indices(config, pid)), c.batch_size, c.local_epochs)
                    for pid in cohort
                ]
                for cohort in cohorts
            ]
        )
    shapes = weight_shapes(build_model_for_dataset(config.model.name, config.dataset.name, seed=config.seed))
    spec = {
        "model": config.model.name,
        "shapes": [list(shape) for shape in shapes],
        "model_kwargs": {
            "num_classes": info.num_classes,
            "in_channels": info.in_channels,
            "image_size": info.image_size,
        },
        "seed": config.seed,
        "batch_size": c.batch_size,
        "lr": c.lr,
        "momentum": c.momentum,
        "weight_decay": c.weight_decay,
        "sam": use_sam,
    }
    return {"spec": spec, "rounds": plan}


def flower_round_floor(overrides: list[str], tmp: Path, num_rounds: int) -> dict[str, Any]:
    """s/round of the least FedAvg on Flower's simulation engine for the app's run of ``num_rounds`` rounds
    (bench/flower_floor.py ``--rounds``: the app's backend config, node count, Ray start and cohorts; the bare local
    step at each client's batch sizes; the model to each worker and a float32 sum back): the median over the steady
    rounds, each round from the previous round's end. What any app on Flower's engine costs a round before its own
    data, bookkeeping and privacy; and the peak resident memory of all its processes (Ray's daemons, the workers, a
    driver without torch)."""
    from apps.main import backend_config, concurrent_workers, simulation_nodes

    config = compose_config([*overrides, f"num_rounds={num_rounds}"])
    nodes, workers = simulation_nodes(config), concurrent_workers(config)
    plan_file = tmp / "flower_round_floor_plan.json"
    plan_file.write_text(json.dumps(round_floor_plan(config, workers)))
    out = tmp / "flower_round_floor.json"
    env = {**run_env(tmp / "env_flower_round_floor"), **THREAD_ENV}
    cmd = [
        sys.executable, "-m", "bench.flower_floor", "--rounds", str(plan_file), json.dumps(backend_config(config)),
        str(nodes), str(workers), str(out),
    ]  # fmt: skip
    _, monitor = run_monitored(cmd, env, tmp / "flower_round_floor.log", env["RAY_TMPDIR"], 1200)
    ends = json.loads(out.read_text())["round_ends"]
    rounds = [b - a for a, b in itertools.pairwise(ends)]
    steady = steady_rounds(rounds, len(rounds))
    return {
        "round_s": statistics.median(steady),
        "round_s_each": steady,
        "nodes": nodes,
        "workers": workers,
        "peak_rss_mib": monitor.peak / 2**20,
        "peak_rss_by_kind_mib": monitor.peak_by_kind,
    }


def round_batches(replay_spec: dict[str, Any], epochs: int, batch_size: int) -> list[dict[int, int]]:
    """Per round, how many local steps its clients take at each batch size (:func:`client_batch_sizes`)."""
    rounds: dict[int, Counter[int]] = {}
    for user in replay_spec["users"]:
        rounds.setdefault(user["round"], Counter()).update(client_batch_sizes(int(user["samples"]), batch_size, epochs))
    return [dict(rounds.get(t, {})) for t in range(1, max(rounds) + 1)]


def workload_floor(batches: list[dict[int, int]], step_s_by_batch: dict[str, float], cores: int) -> list[float]:
    """Per round, the least time its local training can take on ``cores`` one-thread cores: every step of its
    clients at the bare step's speed for its batch size (:func:`compute_limit`), the sum spread perfectly over the
    cores — no framework, no data movement, no bookkeeping, no imbalance. Any framework that trains these clients
    with this step on these cores takes at least this long a round."""
    return [sum(n * step_s_by_batch[str(b)] for b, n in counts.items()) / cores for counts in batches]


def steady_rounds(values: list[float], num_rounds: int) -> list[float]:
    """The steady rounds of a run of ``num_rounds``: rounds 3..T-1 of per-round values indexed from round 1."""
    return values[2 : num_rounds - 1]
