"""The app against its peer and against the machine's limits, side by side in one invocation.

* **The limits and floors** (bench/floors.py): the compute limit, the workload floor, and Ray's and Flower's
  engine floors to the first local step and for a round. On a GPU: the whole round on one device is bounded
  below by the batched loop (bench/batched.py), which trains every client of the round at once.
* **The peer** (bench/pfl_peer.py): pfl-research replaying the app's run — the same clients, mini-batches,
  initial weights, step (set up as the app's workers set it up), C and σ — under ``torchrun`` with P processes of
  one thread (CPU) or one process on the GPU (pfl runs one worker per GPU, each worker's clients one after
  another); on the CPU once more with torch's defaults for the step.
* **The app** through its Hydra entry point, every process pinned to one BLAS/OpenMP thread.

Each contender is a fresh command; its peak resident memory is summed over every process it starts (the app's
Ray daemons and workers, pfl's torchrun agent, workers and sampler process), and its startup is the time from
the command's start to its first local step.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.floors import (
    compute_limit,
    flower_engine_floor,
    flower_round_floor,
    ray_engine_floor,
    round_batches,
    steady_rounds,
    workload_floor,
)
from bench.pfl_peer import pfl_command, pfl_env, write_replay
from bench.processes import THREAD_ENV, run_env, run_monitored
from bench.run import _attempt
from fl_app.config import compose_config
from fl_app.metrics import read_metrics

#: The GPU case's fixed-size cohorts (pfl's cohort size is a constant): M = 160 clients of 125 images of the 20k
#: subset, m = qM = 50 a round.
GPU_PEER_FIXED = ("privacy.sampling=fixed", "dataset.num_clients=160", "privacy.sample_rate=0.3125")


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


def app_contender(overrides: list[str], num_rounds: int, tmp: Path, label: str) -> dict[str, Any]:
    """The app through ``python -m apps.main``: s/round (interval between consecutive rounds' records), startup
    (command → first local step), peak RSS of all its processes."""
    out = tmp / f"app_{label}"
    env = {**run_env(tmp / f"env_{label}"), **THREAD_ENV}
    cmd = [
        sys.executable, "-m", "apps.main", *overrides, f"num_rounds={num_rounds}",
        f"output_dir={out}", f"hydra.run.dir={out}/hydra",
    ]  # fmt: skip
    start, monitor = run_monitored(cmd, env, tmp / f"{label}.log", env["RAY_TMPDIR"], 3600)
    records = read_metrics(out / "metrics.jsonl")
    first_step = records[0]["first_train_started_unix"]
    stamps = {r["round"]: r["finished_unix"] for r in records}
    rounds = [stamps[t] - stamps[t - 1] for t in range(2, num_rounds + 1)]
    steady = steady_rounds([stamps[1] - start, *rounds], num_rounds)
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
    start, monitor = run_monitored(
        pfl_command(python, procs, replay, result), env, tmp / f"pfl_{label}.log", str(replay), 3600
    )
    summary = json.loads(result.read_text())
    steady = steady_rounds(summary["round_seconds"], num_rounds)
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
        entry["pfl"], entry["app"] = pooled(runs["pfl"]), pooled(runs["app"])
        entry["flower_round_floor"] = _attempt(
            f"{name}/flower_round_floor", errors, flower_round_floor, run, part, num_rounds
        )
        entry["pfl_torch_defaults"] = _attempt(
            f"{name}/pfl_torch_defaults", errors, pfl_contender, run, num_rounds, part, "pfl_torch_defaults",
            python, procs, "cpu", "torch_defaults",
        )  # fmt: skip
        batches = steady_rounds(entry["pfl"]["round_batches"], num_rounds) if entry["pfl"] else []
        sizes = sorted({b for counts in batches for b in counts})
        limit = _attempt(f"{name}/limit", errors, compute_limit, run, procs, 60, sizes)
        entry["limit"] = limit
        if limit and entry["pfl"]:
            samples = steady_rounds(entry["pfl"]["round_samples"], num_rounds)
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
