"""Benchmark harness: ``python -m bench [--quick] [--out DIR] [--only P1,P2,P3,P4,PEER,GPU]``;
``--only FTRL`` (not in the default set) adds the DP-FTRL arms' cost.

Writes ``results.json`` and ``results.md`` into ``--out`` (default ``bench/results/<timestamp>/``). Every
comparison is a ratio of two measurements taken side by side in this one invocation.

* **P1 startup** — seconds from the command's start to the first client's first local step, for the Hydra entry
  point and for ``flwr run`` (against an already running ``flower-superlink --simulation``; its own start is
  reported apart), split into: Python imports, up to the ServerApp's start (Hydra, validation, dataset check,
  Ray start), ServerApp → first client fit (strategy, test set, Ray workers and their imports), worker setup
  (dataset, partition, model in the worker). Target: ≤ 10 s through the Hydra entry point.
* **P2 steady state, fair CPU comparison** — for DP-FedAvg and DP-FedSAM on the compute-bound config, s/round
  (median over rounds 3 .. T−1; for the app the interval between consecutive rounds' records, so every cost
  between rounds counts) of: the app per client (``simulation.cohort_size=1``), the app in cohort mode
  (``simulation.cohort_size=auto``), the plain PyTorch loop on all cores (bench/baseline.py, BLAS pinned) and P
  one-thread loops in parallel processes (bench/parallel.py, P = cores: the CPU's physical limit, as
  pfl-research's torchrun setup). Every process runs with the same ``OMP/OPENBLAS/MKL_NUM_THREADS=1`` (torch's
  own thread count is set explicitly by each). Targets: cohort / parallel loops ≤ 1.10, cohort / loop ≤ 0.85.
  The final models are compared with the parallel loops'.
* **P3 memory** — peak resident memory summed over every process of a Hydra run (driver, Ray GCS/raylet,
  workers) for M = 100, 500, 5000 clients at the same number of clients per round. Targets: ≤ 3 GB at the
  default M = 500, largest / smallest ≤ 1.2.
* **P4 accounting** — seconds to compute ε after T = 300 rounds (RDP, PRV, PLD) and to calibrate σ for a target ε.
* **PEER** (``--peer pfl``) — the app against pfl-research and the machine's compute limit, for
  DP-FedAvg and DP-FedSAM on the P2 config (bench/peer.py): s/round, command → first local step and peak RSS of
  every process of the app (its CPU default) and of pfl (P one-thread ``torchrun`` workers replaying the app's
  clients, mini-batches, initial weights and local step, bench/pfl_peer.py), each run twice (``--peer-repeats``),
  the two alternating, and pooled (s/round: the median over every steady round of every run); each s/round also as a
  ratio to the limit (the run's bare local step on one thread × the cores), and the CPU seconds every process used
  by the first local step (÷ the cores: the least startup they allow); then Flower's engine floors (startup and
  round), the workload floor and pfl with torch's defaults for the step, which say which targets any app on Flower's
  engine can reach. Targets: app / pfl ≤ 0.90, app / limit ≤ 1.15, startup ≤ 10 s and below pfl's, peak RSS
  ≤ 3 GB. With a GPU, ``--peer pfl --only GPU`` adds
  bench/peer.py's GPU case.
* **GPU** (``--only GPU``; in the default set when torch sees a CUDA device) — the papers' scale on one GPU:
  Fashion-MNIST 20k-image subset, ``+scale=paper`` (30 local epochs, ASAM ρ = 0.5, C = 0.2, σ = 0.95) with
  M = 167 and q = 0.3 (about 50 clients of about 120 images a round): s/round of the app per client
  (``client_gpus=0.1``), the app in cohort mode (``client_gpus=1`` and ``0.5``) and the batched torch.func loop
  (bench/batched.py, the GPU's physical limit); then three cohort-mode runs launched at once on the same GPU
  (three Hydra processes, each with its own Ray) against one alone. Targets: cohort ≤ 1.5 s/round and ≤ 1.3×
  the batched loop; each of three sharing runs ≤ 1.5× its time alone. ``--gpu-rounds`` (default 6; the sharing
  runs do max(2×, 12) so that their steady rounds overlap) keeps it within about 8 minutes on one H100; pass the
  data with ``--data-dir`` (and any other override with ``--set KEY=VALUE``).
* **FTRL** (``--only FTRL``; not in the default set; bench/ftrl.py) — the cost of the four arms of
  conf/experiment/dp_ftrl.yaml (dp_fedavg, dp_fedavg_unamplified, dp_ftrl_fedavg, dp_ftrl_fedsam) at
  ``+scale=cpu privacy.target_epsilon=4``, one run each of ``--ftrl-rounds`` (default 6) rounds, evaluation only
  after the last: s/round (median over rounds 3..T−1, as P2) and its ratio to dp_fedavg's, peak RSS of every
  process (and by kind) and the driver's own (the ServerApp's process: where the BLT's float64 buffers live).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.processes import ROOT, THREAD_ENV, PeakRSSMonitor, kill_processes_mentioning, run_env, simulation_superlink
from fl_app.metrics import read_metrics

#: The compute-bound steady-state config: paper CNN, Fashion-MNIST, 20 clients a round (fixed-size
#: sampling, so every round has exactly 20), 1 local epoch, batch 32, DP-FedSAM; evaluation only after the last
#: round, which the steady-state window leaves out.
P2_OVERRIDES = [
    "strategy=dp_fedsam",
    "dataset.num_clients=500",
    "privacy.sampling=fixed",
    "privacy.sample_rate=0.04",
    "client.local_epochs=1",
    "client.batch_size=32",
    "eval_every=1000",
]
QUICK_OVERRIDES = ["dataset.max_train_samples=6000", "dataset.max_test_samples=1000"]
P3_POPULATIONS = (100, 500, 5000)
P3_DEFAULT_POPULATION = 500  # conf/dataset/fashion_mnist.yaml's M
P3_TARGET_MIB = 3e9 / 2**20  # 3 GB summed over every process of the run, at the default M
P1_TARGET_S = 10.0  # command start → first local step


def with_overrides(overrides: list[str], *extra: str) -> list[str]:
    """``overrides`` with the keys of ``extra`` replaced (Hydra rejects a key given twice)."""
    keys = {item.split("=", 1)[0] for item in extra}
    return [item for item in overrides if item.split("=", 1)[0] not in keys] + list(extra)


def _hydra_cmd(overrides: list[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "apps.main", *overrides, f"output_dir={out}", f"hydra.run.dir={out}/hydra"]


def _run_logged(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
            kill_processes_mentioning(env["RAY_TMPDIR"])
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}); see {log}")
    return proc


def _per_core(cpu_s: float | None, cores: int) -> float | None:
    return None if cpu_s is None or cores <= 0 else cpu_s / cores


def _startup_split(t0: float, out: Path) -> dict[str, float]:
    meta = json.loads((out / "run.json").read_text())
    first = read_metrics(out / "metrics.jsonl")[0]
    return {
        "total_s": first["first_train_started_unix"] - t0,
        "to_serverapp_start_s": meta["started_unix"] - t0,
        "serverapp_to_first_fit_s": first["first_fit_started_unix"] - meta["started_unix"],
        "worker_setup_s": first["first_train_started_unix"] - first["first_fit_started_unix"],
    }


def measure_imports() -> float:
    code = "import time; t = time.perf_counter(); import apps.main, apps.server_app, apps.client_app; "
    code += "import flwr.simulation; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def measure_ray_init(tmp: Path) -> float:
    code = "import time, ray; t = time.perf_counter(); ray.init(logging_level='ERROR'); "
    code += "print(time.perf_counter() - t); ray.shutdown()"
    env = run_env(tmp)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    kill_processes_mentioning(env["RAY_TMPDIR"])
    return float(out.stdout.strip().splitlines()[-1])


#: Measures, in a fresh process, what ``flwr run .`` spends on this checkout before it sends anything: the CLI's
#: imports, Flower's walk of the app directory (``flwr.cli.utils.collect_files`` lists every file under it, the
#: virtualenv included, and the FAB's include/exclude rules filter the list afterwards) and the FAB's build.
_FAB_CODE = """
import json, time
from pathlib import Path
t = time.perf_counter(); import flwr.cli.app; imports = time.perf_counter() - t
from flwr.cli.build import build_fab_from_files
from flwr.cli.utils import collect_files
root = Path('.').resolve()
t = time.perf_counter(); files = collect_files(root); walk = time.perf_counter() - t
t = time.perf_counter(); fab, _ = build_fab_from_files(files); build = time.perf_counter() - t
venv = sum(1 for name in files if name.startswith('.venv/'))
print(json.dumps({"cli_imports_s": imports, "collect_files_s": walk, "build_s": build, "files_walked": len(files),
                  "files_walked_in_venv": venv, "fab_bytes": len(fab)}))
"""


def measure_fab_packaging() -> dict[str, float]:
    """``flwr run .``'s packaging of this checkout, measured alone (:data:`_FAB_CODE`)."""
    out = subprocess.run([sys.executable, "-c", _FAB_CODE], cwd=ROOT, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def p1_startup(overrides: list[str], tmp: Path) -> dict[str, Any]:
    """Command start → first local step, for both front doors."""
    result: dict[str, Any] = {"python_imports_s": measure_imports(), "ray_init_alone_s": measure_ray_init(tmp)}
    result["flwr_run_packaging"] = measure_fab_packaging()
    hydra_out = tmp / "p1_hydra"
    env = run_env(tmp / "p1h")
    t0 = time.time()
    _run_logged(_hydra_cmd(with_overrides(overrides, "num_rounds=1"), hydra_out), env, tmp / "p1_hydra.log", 900)
    result["hydra"] = _startup_split(t0, hydra_out)

    flwr_out = tmp / "p1_flwr"
    run_config = f"num_rounds=1 overrides='{' '.join(overrides)}' output_dir='{flwr_out}'"
    (tmp / "p1f").mkdir(exist_ok=True)
    t_link = time.time()
    with simulation_superlink(tmp / "p1f") as (connection, env):
        result["superlink_start_s"] = time.time() - t_link
        t0 = time.time()
        cmd = ["flwr", "run", ".", connection, "--run-config", run_config, "--stream"]
        with (tmp / "p1_flwr.log").open("wb") as log:
            subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=900, check=True)
    kill_processes_mentioning(env["RAY_TMPDIR"])
    result["flwr_run"] = _startup_split(t0, flwr_out)
    return result


def _app_round_seconds(records: list[dict[str, Any]]) -> list[float]:
    """Interval between consecutive rounds' records, for rounds 3 .. T−1 (warm-up and the final evaluation out)."""
    stamps = {r["round"]: r["finished_unix"] for r in records}
    last = max(stamps)
    return [stamps[t] - stamps[t - 1] for t in range(3, last)]


#: Every P2 process gets the same pinning environment: NumPy's BLAS and MKL on one thread (the app's and the
#: loops' only BLAS work is the float64 norm of each clip), OpenMP's default 1; torch's thread count is set
#: explicitly by each contender (Ray gives each ClientApp client_cpus threads, the loop takes --threads).
P2_STRATEGIES = ("dp_fedavg", "dp_fedsam")
#: (target, bound): the fair CPU comparison's targets (docs/performance.md, "The app against its own reference loops").
P2_TARGETS = {"ratio_cohort_over_parallel": 1.10, "ratio_cohort_over_loop": 0.85}


def steady(values: list[float], num_rounds: int) -> list[float]:
    """Rounds 3 .. T−1 of a per-round list (round 1 first): warm-up and the final evaluation left out."""
    return values[2 : num_rounds - 1]


def _loop_cmd(module: str, overrides: list[str], out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *overrides, *args, "--out", str(out)]


def _run_loop(cmd: list[str], env: dict[str, str], log: Path, timeout: float = 3600) -> dict[str, Any]:
    """A reference loop (bench.baseline / bench.parallel / bench.batched) in a fresh process: its own imports and
    dataset load, like the app. Returns its JSON summary."""
    out = Path(cmd[cmd.index("--out") + 1])
    with log.open("wb") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(cmd[:3])} failed ({proc.returncode}); see {log}:\n{tail}")
    return dict(json.loads(out.read_text()))


def _app_run(overrides: list[str], num_rounds: int, tmp: Path, label: str, env_extra: dict[str, str]) -> dict[str, Any]:
    """One Hydra run of the app; s/round over rounds 3..T−1 and where an app round goes."""
    out = tmp / f"app_{label}"
    env = {**run_env(tmp / f"env_{label}"), **env_extra}
    _run_logged(_hydra_cmd(with_overrides(overrides, f"num_rounds={num_rounds}"), out), env, tmp / f"{label}.log", 3600)
    return _app_summary(out, num_rounds)


def _app_summary(out: Path, num_rounds: int) -> dict[str, Any]:
    records = read_metrics(out / "metrics.jsonl")
    rounds = _app_round_seconds(records)
    window = records[2 : num_rounds - 1]
    # Where an app round goes: clients phase (messages out, training, replies in), server aggregation, and the
    # rest (accounting, metrics line, checkpoint, next round's messages).
    split = {key: statistics.median(r[key] for r in window) for key in ("clients_phase_s", "aggregate_s")}
    median = statistics.median(rounds)
    clients = statistics.mean(r["aggregated"] for r in window)
    return {
        "round_s": median,
        "round_s_each": rounds,
        "clients_per_round": clients,
        "updates_per_s": clients / median,
        "clients_phase_s": split["clients_phase_s"],
        "aggregate_s": split["aggregate_s"],
        "other_s": median - split["clients_phase_s"] - split["aggregate_s"],
        "model_file": str(out / "final_model.npz"),
        "finished_unix": [r["finished_unix"] for r in records],
    }


def _loop_summary(result: dict[str, Any], num_rounds: int) -> dict[str, Any]:
    rounds = steady(result["round_seconds"], num_rounds)
    summary = {key: value for key, value in result.items() if key not in ("round_seconds", "weights_file")}
    median = statistics.median(rounds)
    clients = statistics.mean(steady(result["clients_per_round"], num_rounds))
    summary.update(
        round_s=median,
        round_s_each=rounds,
        clients_per_round=clients,
        updates_per_s=clients / median,
        model_file=result["weights_file"],
    )
    return summary


def max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """Largest element-wise |a − b| over two models (lists of arrays of the same shapes)."""
    return max(
        float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max()) for x, y in zip(a, b, strict=True)
    )


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    if not a or not b or "round_s" not in a or "round_s" not in b:
        return None
    return float(a["round_s"] / b["round_s"])


def _attempt(label: str, errors: dict[str, str], fn: Any, *args: Any) -> dict[str, Any] | None:
    """``fn(*args)``, or None with the error recorded (a contender that fails does not stop the others)."""
    try:
        return dict(fn(*args))
    except Exception as exc:  # recorded in the results and the table, not hidden
        head, _, rest = str(exc).partition("\n")
        errors[label] = f"{type(exc).__name__}: {head[:500]}" + (f"\n{rest[-1500:]}" if rest else "")
        print(f"[bench] {label} failed: {errors[label].splitlines()[0]}", file=sys.stderr)
        return None


def p2_fair(overrides: list[str], num_rounds: int, tmp: Path, procs: int | None = None) -> dict[str, Any]:
    """The fair CPU comparison for DP-FedAvg and DP-FedSAM: app per client, app cohort mode, the loop on all cores,
    ``procs`` one-thread loops in parallel processes (default: one per core)."""
    cores = os.cpu_count() or 1
    procs = procs or cores
    env = {**os.environ, **THREAD_ENV}
    result: dict[str, Any] = {
        "cores": cores,
        "thread_env": THREAD_ENV,
        "rounds_measured": f"3..{num_rounds - 1}",
        "statistic": "median",
        "targets": P2_TARGETS,
    }
    for strategy in P2_STRATEGIES:
        ov = with_overrides(overrides, f"strategy={strategy}")
        ov_rounds = with_overrides(ov, f"num_rounds={num_rounds}")
        errors: dict[str, str] = {}
        entry: dict[str, Any] = {}
        part = tmp / f"p2_{strategy}"
        part.mkdir(parents=True, exist_ok=True)
        entry["app_per_client"] = _attempt(
            "app_per_client", errors, _app_run,
            with_overrides(ov, "simulation.cohort_size=1"), num_rounds, part, "per_client", THREAD_ENV,
        )  # fmt: skip
        entry["app_cohort"] = _attempt(
            "app_cohort", errors, _app_run,
            with_overrides(ov, "simulation.cohort_size=auto"), num_rounds, part, "cohort", THREAD_ENV,
        )  # fmt: skip
        loop = _attempt(
            "loop", errors, _run_loop,
            _loop_cmd("bench.baseline", ov_rounds, part / "loop.json", "--threads", str(cores)), env, part / "loop.log",
        )  # fmt: skip
        parallel = _attempt(
            "parallel_loops", errors, _run_loop,
            _loop_cmd("bench.parallel", ov_rounds, part / "parallel.json", "--procs", str(procs), "--threads", "1"),
            env, part / "parallel.log",
        )  # fmt: skip
        entry["loop"] = _loop_summary(loop, num_rounds) if loop else None
        entry["parallel_loops"] = _loop_summary(parallel, num_rounds) if parallel else None
        if parallel:
            busy = [
                sum(b) / (len(b) * r) for b, r in zip(parallel["busy_seconds"], parallel["round_seconds"], strict=True)
            ]
            entry["parallel_loops"]["busy_fraction"] = statistics.median(steady(busy, num_rounds))
        entry["ratio_cohort_over_parallel"] = _ratio(entry["app_cohort"], entry["parallel_loops"])
        entry["ratio_cohort_over_loop"] = _ratio(entry["app_cohort"], entry["loop"])
        entry["ratio_per_client_over_loop"] = _ratio(entry["app_per_client"], entry["loop"])
        entry["ratio_per_client_over_parallel"] = _ratio(entry["app_per_client"], entry["parallel_loops"])
        entry["ratio_loop_over_parallel"] = _ratio(entry["loop"], entry["parallel_loops"])
        if parallel:
            reference = _load_weights(parallel["weights_file"])
            diffs: dict[str, float] = {}
            for name in ("app_per_client", "app_cohort", "loop"):
                if entry[name]:
                    diffs[f"{name}_vs_parallel"] = max_abs_diff(_load_weights(entry[name]["model_file"]), reference)
            entry["final_model_max_abs_diff"] = diffs
        if errors:
            entry["errors"] = errors
        result[strategy] = entry
    return result


def _load_weights(path: str) -> list[np.ndarray]:
    """A saved model's arrays in saved order (``np.savez`` keeps the order, named or positional)."""
    with np.load(path) as saved:
        return [saved[key] for key in saved.files]


def p3_memory(overrides: list[str], tmp: Path, clients_per_round: int = 20, rounds: int = 3) -> dict[str, Any]:
    peaks: dict[str, float] = {}
    for population in P3_POPULATIONS:
        out = tmp / f"p3_{population}"
        env = run_env(tmp / f"p3m{population}")
        run_overrides = with_overrides(
            overrides,
            f"dataset.num_clients={population}",
            f"privacy.sample_rate={clients_per_round / population}",
            f"num_rounds={rounds}",
        )
        log = (tmp / f"p3_{population}.log").open("wb")
        cmd = _hydra_cmd(run_overrides, out)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        with PeakRSSMonitor(proc.pid, marker=env["RAY_TMPDIR"]) as monitor:
            proc.wait(timeout=1800)
        log.close()
        kill_processes_mentioning(env["RAY_TMPDIR"])
        if proc.returncode != 0:
            raise RuntimeError(f"P3 run with M={population} failed; see {log.name}")
        peaks[str(population)] = monitor.peak / 2**20
    smallest, largest = str(P3_POPULATIONS[0]), str(P3_POPULATIONS[-1])
    return {
        "clients_per_round": clients_per_round,
        "rounds": rounds,
        "peak_rss_mib": peaks,
        "ratio_largest_over_smallest": peaks[largest] / peaks[smallest],
    }


def p4_accounting() -> dict[str, Any]:
    from fl_app.privacy.accountants import CompositionHistory, calibrate_noise_multiplier, compute_epsilon

    q, sigma, steps, population = 0.1, 0.95, 300, 500
    delta = 1 / population
    result: dict[str, Any] = {"q": q, "sigma": sigma, "T": steps, "delta": delta}
    for name in ("rdp", "prv", "pld"):
        t = time.perf_counter()
        eps = compute_epsilon(sigma, q, steps, delta, accountant=name)  # type: ignore[arg-type]
        result[f"epsilon_{name}"] = eps
        result[f"epsilon_{name}_s"] = time.perf_counter() - t
    t = time.perf_counter()
    eps = compute_epsilon(sigma, q, steps, delta, sampling="fixed", population=population)
    result.update(epsilon_rdp_fixed=eps, epsilon_rdp_fixed_s=time.perf_counter() - t)
    t = time.perf_counter()
    result["calibrated_sigma_for_eps_8"] = calibrate_noise_multiplier(8.0, delta, q, steps)
    result["calibrate_rdp_s"] = time.perf_counter() - t
    # What a round costs the server at T = 300: record the round, then the epsilon and the budget projection.
    accountant = CompositionHistory("rdp", "poisson", population)
    accountant.step(sigma, q, steps - 1)
    t = time.perf_counter()
    accountant.step(sigma, q)
    accountant.get_epsilon(delta)
    accountant.epsilon_after(1, sigma, q, delta)
    result["per_round_accounting_at_T300_s"] = time.perf_counter() - t
    return result


#: The papers' scale on one GPU: Fashion-MNIST's first 20k training images over M = 167 clients (about
#: 120 images each), q = 0.3 (about 50 clients a round, Poisson), +scale=paper: 30 local epochs of batch 32, ASAM
#: ρ = 0.5, C = 0.2, σ = 0.95, DP-FedSAM; evaluation only after the last round (outside the measured window).
GPU_OVERRIDES = [
    "+scale=paper",
    "strategy=dp_fedsam",
    "dataset.max_train_samples=20000",
    "dataset.max_test_samples=2000",
    "dataset.num_clients=167",
    "privacy.sample_rate=0.3",
    "eval_every=1000",
]
#: The app's GPU contenders: per client (10 Ray workers share the GPU) and cohort mode (one cohort per worker).
GPU_APP_RUNS = {
    "app_per_client": ["simulation.cohort_size=1", "simulation.client_gpus=0.1"],
    # The vectorized engine (``auto`` on a GPU before the captured engine had run on one), named: ``auto`` is
    # now the captured engine.
    "app_cohort_gpus_1": [
        "simulation.cohort_size=auto", "simulation.client_gpus=1", "simulation.cohort_engine=vectorized"
    ],
    "app_cohort_gpus_0.5": [
        "simulation.cohort_size=auto", "simulation.client_gpus=0.5", "simulation.cohort_engine=vectorized"
    ],
    # The captured engine (``auto`` on a GPU): cohort mode with the step captured as a CUDA graph, data resident,
    # clip and sum on the GPU.
    "app_cohort_captured": [
        "simulation.cohort_size=auto", "simulation.client_gpus=1", "simulation.cohort_engine=captured"
    ],
}  # fmt: skip
GPU_TARGETS = {
    "cohort_round_s": 1.5, "ratio_cohort_over_batched": 1.3, "ratio_shared_over_alone": 1.5,
    # the captured engine's targets: the captured round, its ratios to the step's limit and to the batched loop
    "captured_round_s": 0.5, "ratio_captured_over_limit": 1.3, "ratio_captured_over_batched": 1.0,
}  # fmt: skip
#: The captured step's limit is measured on the app's own clients at the GPU overrides (bench/captured_step.py
#: ``--cohorts app``: the Dirichlet partition of 20,000 images over 167 clients, Poisson cohorts at q = 0.3, 30
#: epochs, B = 32, ASAM): unequal clients, whose rounds run more and narrower steps than 50 equal clients of 120
#: images (``--cohorts equal``, the step's own limit at full width, reported as captured_step_ms too).
GPU_STEP_LIMIT_ARGS = ["--cohorts", "app", "--rounds", "4"]
GPU_SHARED_RUNS = 3


def require_cuda() -> None:
    """Stop with a clear message when torch sees no CUDA device (the GPU case cannot run)."""
    if not torch.cuda.is_available():
        raise SystemExit(
            "bench: the GPU case needs a CUDA device, but torch.cuda.is_available() is False on this machine "
            f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}). Run `python -m bench --only GPU` "
            "on a GPU machine, or leave GPU out of --only."
        )


def overlap_rounds(stamps: list[list[float]], num_rounds: int) -> list[list[float]]:
    """Per run, the intervals of rounds 3..T−1 that lie entirely inside the window where every run was in its
    round loop: after the last of the runs finished round 2 and before the first of them finished round T−1.

    ``stamps[i][t−1]`` is run i's finish time of round t. A run whose steady rounds fall outside the window
    (the runs did not overlap) gets an empty list."""
    start = max(s[1] for s in stamps)
    end = min(s[num_rounds - 2] for s in stamps)
    return [
        [s[t - 1] - s[t - 2] for t in range(3, num_rounds) if s[t - 2] >= start and s[t - 1] <= end] for s in stamps
    ]


def _shared_app_runs(overrides: list[str], num_rounds: int, tmp: Path, count: int) -> dict[str, Any]:
    """``count`` Hydra runs of the app launched at once, each with its own Ray (and its own RAY_TMPDIR), all on
    the one GPU; each run's s/round over the rounds where all of them were training."""
    started = []
    for i in range(count):
        out = tmp / f"app_shared_{i}"
        env = {**run_env(tmp / f"env_shared_{i}"), **THREAD_ENV}
        log = (tmp / f"shared_{i}.log").open("wb")
        cmd = _hydra_cmd(with_overrides(overrides, f"num_rounds={num_rounds}"), out)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        started.append((proc, env, log, out))
    failed = []
    deadline = time.monotonic() + 3600
    for proc, env, log, _ in started:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        kill_processes_mentioning(env["RAY_TMPDIR"])
        if proc.returncode != 0:
            failed.append(f"{log.name} ({proc.returncode})")
    if failed:
        raise RuntimeError(f"shared-GPU runs failed: {', '.join(failed)}")
    summaries = [_app_summary(out, num_rounds) for *_, out in started]
    overlapped = overlap_rounds([s["finished_unix"] for s in summaries], num_rounds)
    per_run = [statistics.median(o) if o else None for o in overlapped]
    return {
        "runs": count,
        "rounds": num_rounds,
        "round_s_each_run": [
            statistics.median(o) if o else s["round_s"] for o, s in zip(overlapped, summaries, strict=True)
        ],
        "overlapping_rounds_each_run": [len(o) for o in overlapped],
        "fully_overlapped": all(v is not None for v in per_run),
        "round_s": max(statistics.median(o) if o else s["round_s"] for o, s in zip(overlapped, summaries, strict=True)),
    }


def gpu_batched_loop(
    overrides: list[str], num_rounds: int, part: Path, errors: dict[str, str]
) -> dict[str, Any] | None:
    """bench/batched.py on the GPU (every client of a round at once: the GPU's limit), or None with the error kept."""
    cmd = _loop_cmd("bench.batched", with_overrides(overrides, f"num_rounds={num_rounds}"), part / "batched.json",
                    "--device", "cuda")  # fmt: skip
    return _attempt("batched_loop", errors, _run_loop, cmd, {**os.environ, **THREAD_ENV}, part / "batched.log")


def gpu_step_limit(overrides: list[str], part: Path, errors: dict[str, str]) -> dict[str, Any] | None:
    """bench/captured_step.py: the captured step replayed on a fixed batch (the round's compute limit on this GPU)
    and the worker's round split, or None with the error kept."""
    data_dir = [o.split("=", 1)[1] for o in overrides if o.startswith("dataset.data_dir=")]
    cmd = [sys.executable, "-m", "bench.captured_step", *GPU_STEP_LIMIT_ARGS, "--out", str(part / "step.json")]
    if data_dir:
        cmd[3:3] = ["--data-dir", data_dir[-1]]
    return _attempt("captured_step", errors, _run_loop, cmd, {**os.environ, **THREAD_ENV}, part / "step.log")


def gpu_paper_scale(overrides: list[str], num_rounds: int, tmp: Path) -> dict[str, Any]:
    """The papers' scale on the GPU: app per client, app cohort mode (vectorized engine on the whole GPU and on half;
    the captured engine), the batched loop, the captured step's limit, and three captured runs sharing the GPU."""
    require_cuda()
    errors: dict[str, str] = {}
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "overrides": overrides,
        "rounds_measured": f"3..{num_rounds - 1}",
        "statistic": "median",
        "targets": GPU_TARGETS,
    }
    part = tmp / "gpu"
    part.mkdir(parents=True, exist_ok=True)
    cuda = with_overrides(overrides, "simulation.device=cuda")
    for name, extra in GPU_APP_RUNS.items():
        result[name] = _attempt(
            name, errors, _app_run, with_overrides(cuda, *extra), num_rounds, part, name, THREAD_ENV
        )
    batched = gpu_batched_loop(overrides, num_rounds, part, errors)
    result["batched_loop"] = _loop_summary(batched, num_rounds) if batched else None
    step = gpu_step_limit(overrides, part, errors)
    result["captured_step"] = step
    captured = result["app_cohort_captured"]
    result["captured_round_s"] = captured["round_s"] if captured else None
    limit = {"round_s": step["round_limit_s"]} if step else None
    result["ratio_captured_over_limit"] = _ratio(captured, limit)
    result["ratio_captured_over_batched"] = _ratio(captured, result["batched_loop"])
    alone = captured  # the engine a run on a GPU gets by default
    # More rounds than alone, so that the three runs' steady rounds overlap despite their staggered starts.
    shared_rounds = max(2 * num_rounds, 12)
    shared = _attempt(
        "shared", errors, _shared_app_runs,
        with_overrides(cuda, *GPU_APP_RUNS["app_cohort_captured"]), shared_rounds, part, GPU_SHARED_RUNS,
    )  # fmt: skip
    result["shared"] = shared
    best = min(
        (result[n] for n in ("app_cohort_gpus_1", "app_cohort_gpus_0.5") if result[n]),
        key=lambda r: r["round_s"],
        default=None,
    )
    result["cohort_round_s"] = best["round_s"] if best else None
    result["ratio_cohort_over_batched"] = _ratio(best, result["batched_loop"])
    result["ratio_per_client_over_batched"] = _ratio(result["app_per_client"], result["batched_loop"])
    result["ratio_per_client_over_cohort"] = _ratio(result["app_per_client"], best)
    result["ratio_shared_over_alone"] = _ratio(shared, alone)
    if shared and alone:
        shared["ratio_each_run_over_alone"] = [v / alone["round_s"] for v in shared["round_s_each_run"]]
    if batched:
        reference = _load_weights(batched["weights_file"])
        result["final_model_max_abs_diff"] = {
            f"{name}_vs_batched": max_abs_diff(_load_weights(result[name]["model_file"]), reference)
            for name in GPU_APP_RUNS
            if result[name]
        }
    if errors:
        result["errors"] = errors
    return result


def machine() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "date": dt.datetime.now().isoformat(timespec="seconds"),
    }


def _num(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def _met(value: float | None, bound: float) -> str:
    return "n/a" if value is None else ("yes" if value <= bound else "**no**")


def _target_row(label: str, value: float | None, bound: float, extra: str = "", spec: str = ".3f") -> str:
    """``| label | **value** extra | ≤ bound | yes/no |``."""
    return f"| {label} | **{_num(value, spec)}**{extra} | ≤ {bound} | {_met(value, bound)} |"


def _p2_rows(p2: dict[str, Any]) -> list[str]:
    lines = []
    names = {
        "app_per_client": "app per client (`cohort_size=1`)",
        "app_cohort": "app cohort mode (`cohort_size=auto`)",
        "loop": "plain loop, all cores",
        "parallel_loops": "parallel 1-thread loops",
    }
    for strategy in P2_STRATEGIES:
        entry = p2.get(strategy)
        if not entry:
            continue
        parts = []
        for key, label in names.items():
            run = entry.get(key)
            if not run:
                parts.append(f"{label}: failed")
                continue
            detail = ""
            if key == "loop":
                detail = f", {run.get('threads')} threads"
            elif key == "parallel_loops":
                detail = (
                    f", {run.get('procs')}×{run.get('threads')} thread, busy {_num(run.get('busy_fraction'), '.0%')}"
                )
            parts.append(f"{label}{detail}: {run['round_s']:.2f}")
        lines.append(f"| P2 {strategy} s/round (median) | {'; '.join(parts)} | | |")
        t = P2_TARGETS
        for key, label in (
            ("ratio_cohort_over_parallel", "cohort / parallel loops"),
            ("ratio_cohort_over_loop", "cohort / loop"),
        ):
            lines.append(_target_row(f"P2 {strategy}: {label}", entry[key], t[key]))
        lines.append(
            f"| P2 {strategy}: per client / loop (per client / parallel loops) | "
            f"{_num(entry['ratio_per_client_over_loop'], '.3f')} "
            f"({_num(entry['ratio_per_client_over_parallel'], '.3f')}) | | |"
        )
        for key in ("app_per_client", "app_cohort"):
            run = entry.get(key)
            if run:
                lines.append(
                    f"| P2 {strategy}: {names[key]} round split (s) | clients phase {run['clients_phase_s']:.2f}, "
                    f"aggregation {run['aggregate_s']:.2f}, other {run['other_s']:.2f} | | |"
                )
        ups = ", ".join(f"{key} {entry[key]['updates_per_s']:.2f}" for key in names if entry.get(key))
        lines.append(f"| P2 {strategy} client updates / s | {ups} | | |")
        if diffs := entry.get("final_model_max_abs_diff"):
            text = ", ".join(f"{k.replace('_vs_parallel', '')} {v:.3g}" for k, v in diffs.items())
            lines.append(f"| P2 {strategy} final model vs parallel loops, max abs diff | {text} | float tolerance | |")
        for key, message in entry.get("errors", {}).items():
            lines.append(f"| P2 {strategy} {key} FAILED | {message.splitlines()[0][:200]} | | |")
    return lines


def _gpu_rows(gpu: dict[str, Any]) -> list[str]:
    t = GPU_TARGETS
    lines = []
    parts = []
    for key in (*GPU_APP_RUNS, "batched_loop"):
        run = gpu.get(key)
        parts.append(f"{key} {run['round_s']:.2f}" if run else f"{key} failed")
    lines.append(f"| GPU ({gpu['gpu']}) s/round (median, rounds {gpu['rounds_measured']}) | {'; '.join(parts)} | | |")
    label = "GPU cohort mode s/round (best of client_gpus 1, 0.5)"
    lines.append(_target_row(label, gpu["cohort_round_s"], t["cohort_round_s"], spec=".2f"))
    lines.append(
        _target_row("GPU cohort / batched loop", gpu["ratio_cohort_over_batched"], t["ratio_cohort_over_batched"])
    )
    lines.append(
        f"| GPU per client / batched loop (per client / cohort) | {_num(gpu['ratio_per_client_over_batched'], '.3f')} "
        f"({_num(gpu['ratio_per_client_over_cohort'], '.3f')}) | | |"
    )
    lines.append(
        _target_row("GPU captured cohort s/round", gpu.get("captured_round_s"), t["captured_round_s"], spec=".2f")
    )
    step = gpu.get("captured_step")
    limit = f" (limit {step['round_limit_s']:.2f} s/round = {step['captured_step_ms']:.2f} ms a step)" if step else ""
    lines.append(_target_row("GPU captured / its step's limit", gpu.get("ratio_captured_over_limit"),
                             t["ratio_captured_over_limit"], limit))  # fmt: skip
    lines.append(_target_row("GPU captured / batched loop", gpu.get("ratio_captured_over_batched"),
                             t["ratio_captured_over_batched"]))  # fmt: skip
    if shared := gpu.get("shared"):
        each = ", ".join(f"{v:.2f}" for v in shared["round_s_each_run"])
        overlap = "" if shared["fully_overlapped"] else " (runs did not fully overlap)"
        label = f"GPU {shared['runs']} cohort runs sharing the GPU: slowest / alone"
        extra = f" (s/round each: {each}){overlap}"
        lines.append(_target_row(label, gpu["ratio_shared_over_alone"], t["ratio_shared_over_alone"], extra))
    if diffs := gpu.get("final_model_max_abs_diff"):
        text = ", ".join(f"{k.replace('_vs_batched', '')} {v:.3g}" for k, v in diffs.items())
        lines.append(f"| GPU final model vs batched loop, max abs diff | {text} | float tolerance (30 epochs) | |")
    for key, message in gpu.get("errors", {}).items():
        lines.append(f"| GPU {key} FAILED | {message.splitlines()[0][:200]} | | |")
    return lines


PEER_TARGETS = {
    "ratio_app_over_pfl": 0.90,
    "ratio_app_over_limit": 1.15,
    "startup_s": 10.0,
    "peak_rss_mib": 3e9 / 2**20,
}


def _peer_rows(peer: dict[str, Any]) -> list[str]:
    t = PEER_TARGETS
    lines = []
    for name in ("dp_fedavg", "dp_fedsam"):
        entry = peer.get(name)
        if not entry:
            continue
        app, pfl, limit = entry.get("app") or {}, entry.get("pfl") or {}, entry.get("limit") or {}
        lines.append(
            f"| PEER {name} s/round: app / pfl-research ({peer['cores']}×1 thread, the app's step) / compute limit | "
            f"{_num(app.get('round_s'))} / {_num(pfl.get('round_s'))} / {_num(limit.get('round_s'))} | | |"
        )
        if app.get("runs") and pfl.get("runs"):
            each = " / ".join(
                ", ".join(_num(run["round_s"], ".3f") for run in side["runs"]) for side in (app, pfl)
            )  # fmt: skip
            lines.append(f"| PEER {name} s/round of each run (medians): app / pfl | {each} | | |")
        lines.append(
            f"| PEER {name} app / pfl | **{_num(entry['ratio_app_over_pfl'], '.3f')}** | ≤ {t['ratio_app_over_pfl']} "
            f"| {_met(entry['ratio_app_over_pfl'], t['ratio_app_over_pfl'])} |"
        )
        if defaults := entry.get("pfl_torch_defaults"):
            lines.append(
                f"| PEER {name} pfl with torch's defaults for the step (NCHW, glibc's malloc, default SGD kernels; "
                f"one run): s/round, and app / it | {_num(defaults.get('round_s'))}, "
                f"{_num(entry.get('ratio_app_over_pfl_torch_defaults'), '.3f')} | | |"
            )
        lines.append(
            f"| PEER {name} app / limit (pfl / limit) | **{_num(entry['ratio_app_over_limit'], '.3f')}** "
            f"({_num(entry['ratio_pfl_over_limit'], '.3f')}) | ≤ {t['ratio_app_over_limit']} "
            f"| {_met(entry['ratio_app_over_limit'], t['ratio_app_over_limit'])} |"
        )
        if (engine := entry.get("flower_round_floor")) is not None:
            ratio = entry.get("ratio_flower_round_floor_over_pfl")
            reach = "" if ratio is None else (
                "out of reach on Flower's engine" if ratio > t["ratio_app_over_pfl"] else "within reach"
            )  # fmt: skip
            lines.append(
                f"| PEER {name} Flower's engine floor (the least FedAvg on it, run as the app runs it, for these "
                f"rounds and cohorts: the bare step at each client's batch sizes, the model out and a float32 sum "
                f"back; one run): s/round, and floor / pfl | {_num(engine.get('round_s'))}, **{_num(ratio, '.3f')}** "
                f"| app / pfl ≤ {t['ratio_app_over_pfl']} needs floor / pfl below it | {reach} |"
            )
            if engine.get("peak_rss_mib"):
                lines.append(
                    f"| PEER {name} Flower's engine floor: peak RSS all processes (MiB), and by kind | "
                    f"{_num(engine['peak_rss_mib'], '.0f')}: "
                    + ", ".join(f"{k} {v:.0f}" for k, v in (engine.get("peak_rss_by_kind_mib") or {}).items())
                    + f" | ≤ {t['peak_rss_mib']:.0f} needs it below | "
                    + (
                        "out of reach on Flower's engine"
                        if engine["peak_rss_mib"] > t["peak_rss_mib"]
                        else "within reach"
                    )
                    + " |"
                )
        if (floor := entry.get("ratio_workload_floor_over_pfl")) is not None:
            reach = "out of reach for any framework" if floor > t["ratio_app_over_pfl"] else "within reach"
            lines.append(
                f"| PEER {name} workload floor (every local step of the steady rounds' clients at the bare step's "
                f"speed for its batch size, spread perfectly over the cores; no framework): s/round, and floor / pfl "
                f"| {_num(limit.get('workload_round_s'))}, **{_num(floor, '.3f')}** "
                f"| app / pfl ≤ {t['ratio_app_over_pfl']} needs floor / pfl below it | {reach} |"
            )
        lines.append(
            f"| PEER {name} command → first local step, app / pfl (s) | {_num(app.get('startup_s'), '.1f')} / "
            f"{_num(pfl.get('startup_s'), '.1f')} | ≤ {t['startup_s']:.0f} and below pfl | "
            f"{_met(app.get('startup_s'), min(t['startup_s'], pfl.get('startup_s') or t['startup_s']))} |"
        )
        cores = peer["cores"]
        lines.append(
            f"| PEER {name} CPU seconds every process used by the first local step, app / pfl (÷ {cores} cores: the "
            f"least wall time they allow, s) | {_num(app.get('startup_cpu_s'), '.1f')} / "
            f"{_num(pfl.get('startup_cpu_s'), '.1f')} ({_num(_per_core(app.get('startup_cpu_s'), cores), '.1f')} / "
            f"{_num(_per_core(pfl.get('startup_cpu_s'), cores), '.1f')}) | | |"
        )
        lines.append(
            f"| PEER {name} peak RSS all processes, app / pfl (MiB) | {_num(app.get('peak_rss_mib'), '.0f')} / "
            f"{_num(pfl.get('peak_rss_mib'), '.0f')} | ≤ {t['peak_rss_mib']:.0f} | "
            f"{_met(app.get('peak_rss_mib'), t['peak_rss_mib'])} |"
        )
        for who, side in (("app", app), ("pfl", pfl)):
            if kinds := side.get("peak_rss_by_kind_mib"):
                parts = ", ".join(f"{kind} {mib:.0f}" for kind, mib in sorted(kinds.items(), key=lambda kv: -kv[1]))
                lines.append(f"| PEER {name} {who} at its peak, MiB per kind of process | {parts} | | |")
    if floor := peer.get("import_torch_rss_mib"):
        lines.append(
            f"| PEER a process that only imports torch, MiB (app / pfl venv) | {floor['app']:.0f} / {floor['pfl']:.0f} "
            "| | |"
        )
    if (ray_floor := peer.get("ray_engine_floor")) and (pfl_startups := [
        peer[n]["pfl"]["startup_s"] for n in ("dp_fedavg", "dp_fedsam") if (peer.get(n) or {}).get("pfl")
    ]):  # fmt: skip
        lines.append(
            f"| PEER Flower's Ray engine alone: command → ray.init / → {peer['cores']} workers with torch + flwr "
            f"imported (s), against pfl's command → first local step | {ray_floor['ray_init_s']:.1f} / "
            f"{ray_floor['workers_ready_s']:.1f} (pfl {min(pfl_startups):.1f}) | | |"
        )
        if "cpu_s" in ray_floor:
            lines.append(
                f"| PEER Flower's Ray engine alone: CPU seconds its processes used by then | {ray_floor['cpu_s']:.1f} "
                "| | |"
            )
    if flower_floor := peer.get("flower_engine_floor"):
        startups = {
            n: (peer[n]["app"]["startup_s"], peer[n]["pfl"]["startup_s"])
            for n in ("dp_fedavg", "dp_fedsam")
            if (peer.get(n) or {}).get("app") and peer[n].get("pfl")
        }
        against = "; ".join(f"{n} app {a:.1f} / pfl {b:.1f}" for n, (a, b) in startups.items())
        lines.append(
            f"| PEER Flower's simulation engine alone (run_simulation, the app's backend config and Ray start, "
            f"{flower_floor['nodes']} nodes, a ClientApp that only imports torch): command → first local step, s "
            f"(CPU seconds by then), against app / pfl | {flower_floor['first_step_s']:.1f} "
            f"({flower_floor['cpu_s']:.1f}) ({against}) | | |"
        )
    if flower_ray := peer.get("flower_engine_floor_flower_ray"):
        lines.append(
            "| PEER the same with Ray started by Flower's backend (a job runtime_env): command → first local step, s "
            f"(CPU seconds by then) | {flower_ray['first_step_s']:.1f} ({flower_ray['cpu_s']:.1f}) | | |"
        )
    if limit_step := next((peer[n]["limit"] for n in ("dp_fedavg", "dp_fedsam") if peer.get(n, {}).get("limit")), None):
        lines.append(
            f"| PEER limit: bare SGD step, one thread (samples/s) | {limit_step['samples_per_s_one_thread']:.0f} | | |"
        )
    for label, error in peer.get("errors", {}).items():
        lines.append(f"| PEER {label} failed | {error.splitlines()[0][:200]} | | |")
    return lines


def _gpu_peer_rows(gpu: dict[str, Any]) -> list[str]:
    app, pfl, batched = gpu.get("app_cohort") or {}, gpu.get("pfl") or {}, gpu.get("batched_loop") or {}
    return [
        f"| GPU_PEER ({gpu['gpu']}) s/round: app cohort / pfl (1 worker) / batched loop | "
        f"{_num(app.get('round_s'))} / {_num(pfl.get('round_s'))} / {_num(batched.get('round_s'))} | | |",
        f"| GPU_PEER app / pfl | **{_num(gpu.get('ratio_app_over_pfl'), '.3f')}** | ≤ 0.9 | "
        f"{_met(gpu.get('ratio_app_over_pfl'), 0.9)} |",
    ]


def to_markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"# Benchmark ({m['date']})",
        "",
        f"Machine: {m['cpu_count']} cores ({m['processor']}), GPU: {m['cuda'] or 'none'}; torch {m['torch']}.",
        f"Config: `{' '.join(results['overrides'])}`; command: `{results['command']}`.",
    ]
    if p2 := results.get("P2"):
        env = " ".join(f"{k}={v}" for k, v in p2["thread_env"].items())
        lines.append(f"P2: every process with `{env}`; rounds {p2['rounds_measured']}, medians.")
    lines += ["", "| measure | value | target | met |", "|---|---|---|---|"]
    if p1 := results.get("P1"):
        for door in ("hydra", "flwr_run"):
            s = p1[door]
            lines.append(
                f"| P1 startup, {door} (s) | {s['total_s']:.1f} = {s['to_serverapp_start_s']:.1f} to ServerApp + "
                f"{s['serverapp_to_first_fit_s']:.1f} to first fit + {s['worker_setup_s']:.1f} worker setup | "
                f"≤ {P1_TARGET_S:.0f} | {_met(s['total_s'], P1_TARGET_S)} |"
            )
        lines.append(
            f"| P1 parts measured alone (s) | imports {p1['python_imports_s']:.1f}, ray.init "
            f"{p1['ray_init_alone_s']:.1f}, SuperLink start {p1['superlink_start_s']:.1f} | | |"
        )
        if pack := p1.get("flwr_run_packaging"):
            lines.append(
                f"| P1 `flwr run .` packaging alone (s) | CLI imports {pack['cli_imports_s']:.1f}, walk of "
                f"{pack['files_walked']} files ({pack['files_walked_in_venv']} in .venv) "
                f"{pack['collect_files_s']:.1f}, FAB build {pack['build_s']:.1f} | | |"
            )
    if p2 := results.get("P2"):
        lines += _p2_rows(p2)
    if p3 := results.get("P3"):
        peaks = ", ".join(f"M={k}: {v:.0f}" for k, v in p3["peak_rss_mib"].items())
        default = p3["peak_rss_mib"].get(str(P3_DEFAULT_POPULATION))
        lines.append(
            f"| P3 peak RSS, all processes (MiB) | {peaks}; ratio **{p3['ratio_largest_over_smallest']:.3f}** "
            f"| ≤ 1.2 | {_met(p3['ratio_largest_over_smallest'], 1.2)} |"
        )
        lines.append(
            f"| P3 peak RSS at the default M={P3_DEFAULT_POPULATION} (MiB) | **{_num(default, '.0f')}** "
            f"| ≤ 3 GB ({P3_TARGET_MIB:.0f} MiB) | {_met(default, P3_TARGET_MIB)} |"
        )
    if p4 := results.get("P4"):
        worst = max(p4[f"epsilon_{k}_s"] for k in ("rdp", "prv", "pld", "rdp_fixed"))
        lines.append(
            f"| P4 ε after T={p4['T']} (s) | RDP {p4['epsilon_rdp_s']:.3f}, PRV {p4['epsilon_prv_s']:.3f}, "
            f"PLD {p4['epsilon_pld_s']:.3f}, RDP fixed-size {p4['epsilon_rdp_fixed_s']:.3f} | < 1 "
            f"| {_met(worst, 1.0)} |"
        )
        lines.append(
            f"| P4 calibrate σ for ε=8 (s) | {p4['calibrate_rdp_s']:.3f} | < 1 | {_met(p4['calibrate_rdp_s'], 1.0)} |"
        )
        lines.append(f"| P4 accounting per round at T=300 (s) | {p4['per_round_accounting_at_T300_s']:.3f} | | |")
    if peer := results.get("PEER"):
        lines += _peer_rows(peer)
    if gpu_peer := results.get("GPU_PEER"):
        lines += _gpu_peer_rows(gpu_peer)
    if gpu := results.get("GPU"):
        lines += _gpu_rows(gpu)
    if ftrl := results.get("FTRL"):
        from bench.ftrl import ftrl_rows

        lines += ftrl_rows(ftrl)
    if "gpu" in results:
        lines.append(f"| GPU | {results['gpu']} | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="results directory (default bench/results/<time>)")
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated subset of P1,P2,P3,P4,PEER,GPU,FTRL (default: all but FTRL; GPU when CUDA is present; "
        "PEER with --peer)",
    )
    parser.add_argument("--peer", choices=("pfl",), default=None, help="compare with pfl-research (bench/peer.py)")
    parser.add_argument("--pfl-python", default=None, help="an interpreter with pfl (default: .bench-peer/pfl-venv)")
    parser.add_argument(
        "--peer-repeats", type=int, default=2, help="runs of each PEER contender, the app and pfl alternating"
    )
    parser.add_argument("--rounds", type=int, default=8, help="P2 rounds (steady state = rounds 3..T-1)")
    parser.add_argument("--gpu-rounds", type=int, default=6, help="rounds of each GPU run (steady state = 3..T-1)")
    parser.add_argument("--ftrl-rounds", type=int, default=6, help="rounds of each FTRL run (steady = 3..T-1)")
    parser.add_argument("--procs", type=int, default=None, help="P2 parallel loops' processes (default: cores)")
    parser.add_argument("--quick", action="store_true", help="a 6000-image subset and 5 rounds (smoke test)")
    parser.add_argument("--data-dir", default=None, help="dataset.data_dir for every run (where Fashion-MNIST is)")
    parser.add_argument(
        "--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
        help="an extra Hydra override for every run (repeatable), e.g. --set dataset.download=true",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the runs' directories")
    args = parser.parse_args(argv)
    default_only = "P1,P2,P3,P4" + (",PEER" if args.peer else "") + (",GPU" if torch.cuda.is_available() else "")
    only = {s.strip().upper() for s in (args.only or default_only).split(",") if s.strip()}
    if unknown := only - {"P1", "P2", "P3", "P4", "PEER", "GPU", "FTRL"}:
        parser.error(f"--only: unknown {sorted(unknown)}")
    if args.rounds < 4 or args.gpu_rounds < 4 or args.ftrl_rounds < 4:
        parser.error("--rounds, --gpu-rounds and --ftrl-rounds must be >= 4 (the steady state is rounds 3..T-1)")
    if "GPU" in only:
        require_cuda()
    if "PEER" in only and not args.peer:
        parser.error("--only PEER needs --peer pfl")
    passthrough = ([f"dataset.data_dir={args.data_dir}"] if args.data_dir else []) + list(args.extra)
    out = args.out or ROOT / "bench" / "results" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    overrides = with_overrides(P2_OVERRIDES + (QUICK_OVERRIDES if args.quick else []), *passthrough)
    rounds = 5 if args.quick else args.rounds
    gpu_rounds = min(args.gpu_rounds, 5) if args.quick else args.gpu_rounds
    results: dict[str, Any] = {
        "machine": machine(),
        "overrides": overrides,
        "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    tmp = Path(tempfile.mkdtemp(prefix="bench", dir="/tmp"))
    try:
        if "P4" in only:
            results["P4"] = p4_accounting()
        if "PEER" in only or (args.peer and "GPU" in only):
            from bench.peer import GPU_PEER_FIXED, cpu_peer, gpu_peer
            from bench.pfl_peer import ensure_pfl_python

            pfl_python = args.pfl_python or str(ensure_pfl_python())
            if "PEER" in only:
                peer_rounds = 5 if args.quick else max(args.rounds, 12)
                results["PEER"] = cpu_peer(
                    overrides,
                    peer_rounds,
                    tmp,
                    pfl_python,
                    P2_STRATEGIES,
                    args.procs or os.cpu_count() or 1,
                    repeats=args.peer_repeats,
                )
            if "GPU" in only:
                gpu_overrides = with_overrides(GPU_OVERRIDES, *GPU_PEER_FIXED, *passthrough)
                results["GPU_PEER"] = gpu_peer(gpu_overrides, gpu_rounds, tmp, pfl_python)
        if "P2" in only:
            results["P2"] = p2_fair(overrides, rounds, tmp, procs=args.procs)
        if "GPU" in only:
            results["GPU"] = gpu_paper_scale(with_overrides(GPU_OVERRIDES, *passthrough), gpu_rounds, tmp)
        elif not torch.cuda.is_available():
            results["gpu"] = "not present on this machine: the GPU case was not measured"
        if "P1" in only:
            results["P1"] = p1_startup(overrides, tmp)
        if "P3" in only:
            results["P3"] = p3_memory(overrides, tmp)
        if "FTRL" in only:
            from bench.ftrl import ftrl_cost

            results["FTRL"] = ftrl_cost(passthrough, args.ftrl_rounds, tmp)
    finally:
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        (out / "results.md").write_text(to_markdown(results))
        if args.keep:
            print(f"runs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(to_markdown(results))
    print(f"written: {out / 'results.json'}, {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
