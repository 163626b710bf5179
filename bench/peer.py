"""The app against its peer and against the machine's compute limit, side by side in one invocation (issue 22).

* **Compute limit** (:func:`compute_limit`): the run's own local step (SGD, or SAM's two passes) on a fixed
  batch of the run's size, on one thread in a fresh process, timed over many steps; a round's limit is its
  samples × local epochs × (seconds per sample on one thread) / cores — every core busy with nothing but that
  step, perfectly balanced, no framework, no data movement. On a GPU: the whole round on one device is bounded
  below by the batched loop (bench/batched.py), which trains every client of the round at once.
* **Workload floor** (:func:`workload_floor`): every local step of a round at the bare step's speed for its batch
  size (short last batches included), spread perfectly over the cores.
* **The peer** (bench/pfl_peer.py): pfl-research replaying the app's run — the same clients, mini-batches,
  initial weights, step (set up as the app's workers set it up), C and σ — under ``torchrun`` with P processes of
  one thread (CPU) or one process on the GPU (pfl runs one worker per GPU, each worker's clients one after
  another); on the CPU once more with torch's defaults for the step.
* **Flower's engine floors** (bench/flower_floor.py): to the first local step (:func:`flower_engine_floor`) and a
  round (:func:`flower_round_floor`: the least FedAvg on Flower's engine for the app's rounds and cohorts).
* **The app** through its Hydra entry point, every process pinned to one BLAS/OpenMP thread.

Each contender is a fresh command; its peak resident memory is summed over every process it starts (the app's
Ray daemons and workers, pfl's torchrun agent, workers and sampler process), and its startup is the time from
the command's start to its first local step.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.pfl_peer import pfl_command, pfl_env, write_replay
from bench.processes import ROOT, PeakRSSMonitor, kill_processes_mentioning, run_env
from bench.run import _attempt
from fl_app.config import AppConfig, compose_config
from fl_app.metrics import read_metrics

THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: The GPU case's fixed-size cohorts (pfl's cohort size is a constant): M = 160 clients of 125 images of the 20k
#: subset, m = qM = 50 a round.
GPU_PEER_FIXED = ("privacy.sampling=fixed", "dataset.num_clients=160", "privacy.sample_rate=0.3125")

_LIMIT_CODE = r"""
import json, sys, time
import torch, torch.nn.functional as F
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
    torch and flwr (with the app's ``ray.init`` arguments, :func:`fl_app.main.backend_config`): the least any
    app on Flower's Ray engine takes to its first local step, before its own imports, config and data; and the CPU
    seconds its processes used by then (``cpu_s``)."""
    from fl_app.main import backend_config

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
    from fl_app.main import backend_config, concurrent_workers, simulation_nodes

    config = compose_config(overrides)
    out = tmp / f"flower_floor_{ray_start}.json"
    env = {**run_env(tmp / f"env_flower_floor_{ray_start}"), **THREAD_ENV}
    nodes, workers = simulation_nodes(config), concurrent_workers(config)
    cmd = [
        sys.executable, "-m", "bench.flower_floor", json.dumps(backend_config(config)), str(nodes), str(workers),
        str(out), ray_start,
    ]  # fmt: skip
    start, monitor = _run_monitored(cmd, env, tmp / f"flower_floor_{ray_start}.log", env["RAY_TMPDIR"], 600)
    floor = json.loads(out.read_text())
    return {
        "first_step_s": floor["first_step_unix"] - start,
        "cpu_s": monitor.cpu_seconds_at(floor["first_step_unix"]),
        "nodes": nodes,
        "workers": workers,
        "ray_start": ray_start,
    }


def round_floor_plan(config: AppConfig, replay_spec: dict[str, Any], workers: int) -> dict[str, Any]:
    """bench/flower_floor.py's ``--rounds`` plan from a replay of the app's run: per round the app's cohorts (its
    split, :func:`strategies.cohorts.balance_cohorts` by :func:`strategies.cohorts.local_work`), each a list of its
    clients' batch sizes in partition order (E epochs of ⌊n/B⌋ full batches and one of n mod B)."""
    from bench.baseline import check_supported
    from fl_app.data.datasets import DATASETS
    from fl_app.instructions import local_training_config
    from strategies.cohorts import balance_cohorts, local_work

    use_sam, _ = check_supported(config)
    training = local_training_config(config, "sam" if use_sam else "sgd")
    c, info = config.client, DATASETS[config.dataset.name]
    rounds: dict[int, dict[int, int]] = {}
    for user in replay_spec["users"]:
        rounds.setdefault(user["round"], {})[int(user["partition"])] = int(user["samples"])
    plan = []
    for t in sorted(rounds):
        samples = rounds[t]
        pids = sorted(samples)
        cohorts = balance_cohorts(pids, [local_work(config, training, pid) for pid in pids], workers)
        batches = {
            pid: (([c.batch_size] * (n // c.batch_size)) + ([n % c.batch_size] if n % c.batch_size else []))
            * c.local_epochs
            for pid, n in samples.items()
        }
        plan.append([[batches[pid] for pid in cohort] for cohort in cohorts])
    from fl_app.models import build_model_for_dataset, weight_shapes

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


def flower_round_floor(overrides: list[str], tmp: Path, replay_spec: dict[str, Any]) -> dict[str, Any]:
    """s/round of the least FedAvg on Flower's simulation engine for the app's run (bench/flower_floor.py
    ``--rounds``: the app's backend config, node count, Ray start and cohorts; the bare local step at each client's
    batch sizes; the model to each worker and a float32 sum back): the median over the steady rounds, each round
    from the previous round's end. What any app on Flower's engine costs a round before its own data, bookkeeping
    and privacy; and the peak resident memory of all its processes (Ray's daemons, the workers, a driver without
    torch)."""
    from fl_app.main import backend_config, concurrent_workers, simulation_nodes

    config = compose_config(overrides)
    nodes, workers = simulation_nodes(config), concurrent_workers(config)
    plan_file = tmp / "flower_round_floor_plan.json"
    plan_file.write_text(json.dumps(round_floor_plan(config, replay_spec, workers)))
    out = tmp / "flower_round_floor.json"
    env = {**run_env(tmp / "env_flower_round_floor"), **THREAD_ENV}
    cmd = [
        sys.executable, "-m", "bench.flower_floor", "--rounds", str(plan_file), json.dumps(backend_config(config)),
        str(nodes), str(workers), str(out),
    ]  # fmt: skip
    _, monitor = _run_monitored(cmd, env, tmp / "flower_round_floor.log", env["RAY_TMPDIR"], 1200)
    ends = json.loads(out.read_text())["round_ends"]
    rounds = [b - a for a, b in itertools.pairwise(ends)]
    steady = _steady(rounds, len(rounds))
    return {
        "round_s": statistics.median(steady),
        "round_s_each": steady,
        "nodes": nodes,
        "workers": workers,
        "peak_rss_mib": monitor.peak / 2**20,
        "peak_rss_by_kind_mib": monitor.peak_by_kind,
    }


def import_torch_rss_mib(python: str = sys.executable) -> float:
    """Resident MiB of a fresh process that has done nothing but ``import torch`` (with ``python``): what every
    process that trains or evaluates pays before its first tensor (the CUDA wheels load their libraries also on
    a CPU-only machine). The app runs three such processes on 2 cores (driver, two workers), pfl three (its
    torchrun agent and two workers)."""
    code = "import torch, resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"  # KiB on Linux
    env = {**os.environ, **THREAD_ENV}
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) / 1024


def round_samples(replay_spec: dict[str, Any], epochs: int) -> list[int]:
    """Per round, the samples its clients train on (Σ n_i × E), from a replay's schedule."""
    rows: dict[int, int] = {}
    for user in replay_spec["users"]:
        rows[user["round"]] = rows.get(user["round"], 0) + user["samples"] * epochs
    return [rows.get(t, 0) for t in range(1, max(rows) + 1)]


def round_batches(replay_spec: dict[str, Any], epochs: int, batch_size: int) -> list[dict[int, int]]:
    """Per round, how many local steps its clients take at each batch size: ⌊n/B⌋ full batches and one of n mod B
    per client and local epoch (the workload's shape, short last batches included)."""
    rounds: dict[int, dict[int, int]] = {}
    for user in replay_spec["users"]:
        counts = rounds.setdefault(user["round"], {})
        full, short = divmod(int(user["samples"]), batch_size)
        if full:
            counts[batch_size] = counts.get(batch_size, 0) + full * epochs
        if short:
            counts[short] = counts.get(short, 0) + epochs
    return [rounds.get(t, {}) for t in range(1, max(rounds) + 1)]


def workload_floor(batches: list[dict[int, int]], step_s_by_batch: dict[str, float], cores: int) -> list[float]:
    """Per round, the least time its local training can take on ``cores`` one-thread cores: every step of its
    clients at the bare step's speed for its batch size (:func:`compute_limit`), the sum spread perfectly over the
    cores — no framework, no data movement, no bookkeeping, no imbalance. Any framework that trains these clients
    with this step on these cores takes at least this long a round."""
    return [sum(n * step_s_by_batch[str(b)] for b, n in counts.items()) / cores for counts in batches]


def _steady(values: list[float], num_rounds: int) -> list[float]:
    return values[2 : num_rounds - 1]


def _run_monitored(
    cmd: list[str], env: dict[str, str], log: Path, marker: str, timeout: float
) -> tuple[float, PeakRSSMonitor]:
    """Run ``cmd``; returns (command start Unix time, the monitor of every process it started: peak RSS summed over
    them, at that peak the MiB of each kind of process — driver, each Ray daemon, workers — and their CPU seconds
    over time)."""
    start = time.time()
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with PeakRSSMonitor(proc.pid, marker=marker) as monitor:
                proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
            kill_processes_mentioning(marker)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}); see {log}")
    return start, monitor


def app_contender(overrides: list[str], num_rounds: int, tmp: Path, label: str) -> dict[str, Any]:
    """The app through ``python -m fl_app.main``: s/round (interval between consecutive rounds' records), startup
    (command → first local step), peak RSS of all its processes."""
    out = tmp / f"app_{label}"
    env = {**run_env(tmp / f"env_{label}"), **THREAD_ENV}
    cmd = [
        sys.executable, "-m", "fl_app.main", *overrides, f"num_rounds={num_rounds}",
        f"output_dir={out}", f"hydra.run.dir={out}/hydra",
    ]  # fmt: skip
    start, monitor = _run_monitored(cmd, env, tmp / f"{label}.log", env["RAY_TMPDIR"], 3600)
    records = read_metrics(out / "metrics.jsonl")
    first_step = records[0]["first_train_started_unix"]
    stamps = {r["round"]: r["finished_unix"] for r in records}
    rounds = [stamps[t] - stamps[t - 1] for t in range(2, num_rounds + 1)]
    steady = _steady([stamps[1] - start, *rounds], num_rounds)
    return {
        "round_s": statistics.median(steady),
        "round_s_each": steady,
        "startup_s": first_step - start,
        "startup_cpu_s": monitor.cpu_seconds_at(first_step),
        "peak_rss_mib": monitor.peak / 2**20,
        "peak_rss_by_kind_mib": monitor.peak_by_kind,
        "model_file": str(out / "final_model.npz"),
    }


def pfl_contender(
    overrides: list[str],
    num_rounds: int,
    tmp: Path,
    label: str,
    python: str,
    procs: int,
    device: str,
    step: str = "app",
) -> dict[str, Any]:
    """pfl replaying the same run: s/round (rank 0's interval between consecutive rounds' ends), startup (the
    ``torchrun`` command → first local step on any worker), peak RSS of all its processes. The replay is written
    before the command starts (it is the app's schedule, not part of pfl's run); ``step`` is its local step's
    set-up (bench/pfl_peer.py: the app's by default)."""
    replay = tmp / f"replay_{label}"
    spec = write_replay(compose_config([*overrides, f"num_rounds={num_rounds}"]), num_rounds, replay, step)
    result = tmp / f"pfl_{label}.json"
    env = {**pfl_env(1, device), "PEER_RUN_MARKER": str(replay)}
    start, monitor = _run_monitored(
        pfl_command(python, procs, replay, result), env, tmp / f"pfl_{label}.log", str(replay), 3600
    )
    summary = json.loads(result.read_text())
    steady = _steady(summary["round_seconds"], num_rounds)
    return {
        "round_s": statistics.median(steady),
        "round_s_each": steady,
        "startup_s": summary["first_step_unix"] - start,
        "startup_cpu_s": monitor.cpu_seconds_at(summary["first_step_unix"]),
        "peak_rss_mib": monitor.peak / 2**20,
        "peak_rss_by_kind_mib": monitor.peak_by_kind,
        "procs": procs,
        "device": summary["device"],
        "model_file": summary["weights_file"],
        "round_samples": round_samples(spec, int(spec["config"]["local_epochs"])),
        "round_batches": round_batches(spec, int(spec["config"]["local_epochs"]), int(spec["config"]["batch_size"])),
        "step": step,
        "replay_spec": {"users": spec["users"]},
    }


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str = "round_s") -> float | None:
    if not a or not b or a.get(key) is None or not b.get(key):
        return None
    return float(a[key] / b[key])


def peer_ratios(entry: dict[str, Any]) -> dict[str, float | None]:
    """A strategy's ratios from its contenders' s/round (``round_s``; the limit's ``workload_round_s`` for the
    workload floor): None where a side is missing."""
    app, pfl, limit = entry.get("app"), entry.get("pfl"), entry.get("limit")
    workload = {"round_s": limit.get("workload_round_s")} if limit else None
    return {
        "ratio_app_over_pfl": _ratio(app, pfl),
        "ratio_app_over_pfl_torch_defaults": _ratio(app, entry.get("pfl_torch_defaults")),
        "ratio_flower_round_floor_over_pfl": _ratio(entry.get("flower_round_floor"), pfl),
        "ratio_workload_floor_over_pfl": _ratio(workload, pfl),
        "ratio_app_over_limit": _ratio(app, limit),
        "ratio_pfl_over_limit": _ratio(pfl, limit),
    }


def gpu_peer(overrides: list[str], num_rounds: int, tmp: Path, python: str) -> dict[str, Any]:
    """The papers' scale on one GPU, fixed-size cohorts: the app in cohort mode (vectorized engine, the whole GPU)
    against pfl (one worker on the GPU, clients one after another) and the batched loop (bench/batched.py)."""
    import torch

    from bench.run import _loop_summary, gpu_batched_loop, with_overrides

    errors: dict[str, str] = {}
    part = tmp / "gpu_peer"
    part.mkdir(parents=True, exist_ok=True)
    app_overrides = with_overrides(
        overrides, "simulation.device=cuda", "simulation.cohort_size=auto", "simulation.client_gpus=1"
    )
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "overrides": overrides, "rounds": num_rounds}
    result["app_cohort"] = _attempt("app_cohort", errors, app_contender, app_overrides, num_rounds, part, "app")
    result["pfl"] = _attempt("pfl", errors, pfl_contender, overrides, num_rounds, part, "pfl", python, 1, "cuda")
    batched = gpu_batched_loop(overrides, num_rounds, part, errors)
    result["batched_loop"] = _loop_summary(batched, num_rounds) if batched else None
    result["ratio_app_over_pfl"] = _ratio(result["app_cohort"], result["pfl"])
    result["ratio_app_over_batched"] = _ratio(result["app_cohort"], result["batched_loop"])
    result["ratio_pfl_over_batched"] = _ratio(result["pfl"], result["batched_loop"])
    if errors:
        result["errors"] = errors
    return result


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Repeated runs of one contender as one: s/round the median over every steady round of every run, startup
    (and the CPU seconds used by then) the median of the runs', peak RSS the largest run's (with its breakdown by
    kind); each run's figures under ``runs``. None when no run succeeded."""
    if not runs:
        return None
    peak = max(runs, key=lambda run: run["peak_rss_mib"])
    every_round = [t for run in runs for t in run["round_s_each"]]
    return {
        **runs[0],
        "round_s": statistics.median(every_round),
        "round_s_each": every_round,
        "startup_s": statistics.median(run["startup_s"] for run in runs),
        "startup_cpu_s": statistics.median(run.get("startup_cpu_s", math.nan) for run in runs),
        "peak_rss_mib": peak["peak_rss_mib"],
        "peak_rss_by_kind_mib": peak["peak_rss_by_kind_mib"],
        "runs": [{k: run[k] for k in ("round_s", "startup_s", "peak_rss_mib")} for run in runs],
    }


def cpu_peer(
    overrides: list[str],
    num_rounds: int,
    tmp: Path,
    python: str,
    strategies: tuple[str, ...],
    procs: int,
    repeats: int = 2,
) -> dict[str, Any]:
    """The P2 configuration on this machine's cores, per strategy: the app (its CPU default), pfl with ``procs``
    one-thread workers training the app's local step, and the compute limit; every s/round also as a ratio to the
    limit. Each contender runs ``repeats`` times, the two alternating (pfl first, then the app first, ...), so that a
    slow spell of the machine does not fall on one side only; their runs are :func:`pooled`. Then the least FedAvg on
    Flower's engine for the same rounds (:func:`flower_round_floor`), and pfl once more with torch's defaults for the
    step (``pfl_torch_defaults``: what the app's step set-up is worth to a pfl user)."""
    from bench.run import with_overrides

    errors: dict[str, str] = {}
    result: dict[str, Any] = {"overrides": overrides, "rounds": num_rounds, "cores": procs, "repeats": repeats}
    result["import_torch_rss_mib"] = {"app": import_torch_rss_mib(), "pfl": import_torch_rss_mib(python)}
    result["ray_engine_floor"] = _attempt("ray_engine_floor", errors, ray_engine_floor, overrides, procs, tmp)
    result["flower_engine_floor"] = _attempt("flower_engine_floor", errors, flower_engine_floor, overrides, tmp)
    result["flower_engine_floor_flower_ray"] = _attempt(
        "flower_engine_floor_flower_ray", errors, flower_engine_floor, overrides, tmp, "flower"
    )
    for name in strategies:
        run = with_overrides(overrides, f"strategy={name}")
        part = tmp / f"peer_{name}"
        part.mkdir(parents=True, exist_ok=True)
        entry: dict[str, Any] = {}
        runs: dict[str, list[dict[str, Any]]] = {"pfl": [], "app": []}
        for repeat in range(repeats):
            for side in ("pfl", "app") if repeat % 2 == 0 else ("app", "pfl"):
                label = f"{side}{repeat}"
                if side == "pfl":
                    done = _attempt(
                        f"{name}/{label}", errors, pfl_contender, run, num_rounds, part, label, python, procs, "cpu"
                    )
                else:
                    done = _attempt(f"{name}/{label}", errors, app_contender, run, num_rounds, part, label)
                if done is not None:
                    runs[side].append(done)
        replays = [done.pop("replay_spec") for done in runs["pfl"]]  # the schedule, not a result
        entry["pfl"], entry["app"] = pooled(runs["pfl"]), pooled(runs["app"])
        if replays:
            entry["flower_round_floor"] = _attempt(
                f"{name}/flower_round_floor", errors, flower_round_floor, run, part, replays[0]
            )
        entry["pfl_torch_defaults"] = _attempt(
            f"{name}/pfl_torch_defaults", errors, pfl_contender, run, num_rounds, part, "pfl_torch_defaults",
            python, procs, "cpu", "torch_defaults",
        )  # fmt: skip
        if entry["pfl_torch_defaults"]:
            entry["pfl_torch_defaults"].pop("replay_spec")
        batches = _steady(entry["pfl"]["round_batches"], num_rounds) if entry["pfl"] else []
        sizes = sorted({b for counts in batches for b in counts})
        limit = _attempt(f"{name}/limit", errors, compute_limit, run, procs, 60, sizes)
        entry["limit"] = limit
        if limit and entry["pfl"]:
            samples = _steady(entry["pfl"]["round_samples"], num_rounds)
            per_round = [n / limit["samples_per_s_machine"] for n in samples]
            limit["round_s"] = statistics.median(per_round)
            limit["workload_round_s"] = statistics.median(workload_floor(batches, limit["step_s_by_batch"], procs))
        entry.update(peer_ratios(entry))
        result[name] = entry
    if errors:
        result["errors"] = errors
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.peer --case cpu|gpu [--rounds T] [--pfl-python PY] [--set KEY=VALUE] --out result.json``."""
    import argparse

    from bench.pfl_peer import ensure_pfl_python
    from bench.run import GPU_OVERRIDES, P2_OVERRIDES, with_overrides

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1, help="pfl's CPU workers (= cores)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each CPU contender, alternating")
    parser.add_argument("--pfl-python", default=None)
    parser.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    python = args.pfl_python or str(ensure_pfl_python())
    tmp = args.out.parent / (args.out.stem + "_runs")
    tmp.mkdir(parents=True, exist_ok=True)
    if args.case == "gpu":
        overrides = with_overrides(GPU_OVERRIDES, *GPU_PEER_FIXED, *args.extra)
        result = gpu_peer(overrides, args.rounds, tmp, python)
    else:
        overrides = with_overrides(P2_OVERRIDES, *args.extra)
        result = cpu_peer(overrides, args.rounds, tmp, python, ("dp_fedavg", "dp_fedsam"), args.procs, args.repeats)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
