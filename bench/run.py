"""Benchmark harness (issue 5): ``python -m bench [--quick] [--out DIR] [--only P1,P2,P3,P4]``.

Writes ``results.json`` and ``results.md`` into ``--out`` (default ``bench/results/<timestamp>/``). Every
comparison is a ratio of two measurements taken side by side in this one invocation.

* **P1 startup** — seconds from the command's start to the first client's first local step, for the Hydra entry
  point and for ``flwr run`` (against an already running ``flower-superlink --simulation``; its own start is
  reported apart), split into: Python imports, up to the ServerApp's start (Hydra, validation, dataset check,
  Ray start), ServerApp → first client fit (strategy, test set, Ray workers and their imports), worker setup
  (dataset, partition, model in the worker).
* **P2 steady state** — the app's per-round wall time (the interval between consecutive rounds' records, rounds
  3 .. T−1, so every cost between rounds counts; the last round's evaluation is left out) divided by the plain
  PyTorch loop's (bench/baseline.py, the same sampled clients and local training), on a compute-bound config.
  The loop's final model is compared with the app's.
* **P3 memory** — peak resident memory summed over every process of a Hydra run (driver, Ray GCS/raylet,
  workers) for M = 100, 500, 5000 clients at the same number of clients per round.
* **P4 accounting** — seconds to compute ε after T = 300 rounds (RDP, PRV, PLD) and to calibrate σ for a target ε.
* Client updates per second (app and loop), and the GPU when one is present.
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

from bench.processes import ROOT, PeakRSSMonitor, kill_processes_mentioning, run_env, simulation_superlink
from fl_app.metrics import read_metrics

#: The compute-bound steady-state config (issue 5): paper CNN, Fashion-MNIST, 20 clients a round (fixed-size
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


def with_overrides(overrides: list[str], *extra: str) -> list[str]:
    """``overrides`` with the keys of ``extra`` replaced (Hydra rejects a key given twice)."""
    keys = {item.split("=", 1)[0] for item in extra}
    return [item for item in overrides if item.split("=", 1)[0] not in keys] + list(extra)


def _hydra_cmd(overrides: list[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "fl_app.main", *overrides, f"output_dir={out}", f"hydra.run.dir={out}/hydra"]


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
    code = "import time; t = time.perf_counter(); import fl_app.main, fl_app.server_app, fl_app.client_app; "
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


def p1_startup(overrides: list[str], tmp: Path) -> dict[str, Any]:
    """Command start → first local step, for both front doors."""
    result: dict[str, Any] = {"python_imports_s": measure_imports(), "ray_init_alone_s": measure_ray_init(tmp)}
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


def _baseline(overrides: list[str], num_rounds: int, tmp: Path, threads: int, device: str) -> dict[str, Any]:
    """bench/baseline.py in a fresh process (its own imports and dataset load, like the app)."""
    out = tmp / f"baseline_{threads}t_{device}.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.baseline",
        *with_overrides(overrides, f"num_rounds={num_rounds}"),
        "--threads",
        str(threads),
        "--device",
        device,
        "--out",
        str(out),
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(out.read_text())


def p2_steady_state(overrides: list[str], num_rounds: int, tmp: Path, device: str = "cpu") -> dict[str, Any]:
    cores = os.cpu_count() or 1
    extra = ["simulation.device=cuda", "simulation.client_gpus=0.5"] if device == "cuda" else []
    app_out = tmp / f"p2_app_{device}"
    env = run_env(tmp / f"p2_{device}")
    cmd = _hydra_cmd(with_overrides(overrides, *extra, f"num_rounds={num_rounds}"), app_out)
    _run_logged(cmd, env, tmp / "p2.log", 3600)
    records = read_metrics(app_out / "metrics.jsonl")
    app_rounds = _app_round_seconds(records)
    loop = _baseline(overrides, num_rounds, tmp, threads=cores, device=device)
    loop_1t = _baseline(overrides, num_rounds, tmp, threads=1, device=device) if device == "cpu" else None
    loop_rounds = loop["round_seconds"][2 : num_rounds - 1]
    with np.load(app_out / "final_model.npz") as saved:
        app_weights = list(saved.values())
    reference = loop_1t or loop
    max_abs_diff = max(
        float(np.abs(a - np.asarray(b, dtype=np.float32)).max())
        for a, b in zip(app_weights, _load_weights(reference["weights_file"]), strict=True)
    )
    steady = records[2 : num_rounds - 1]
    clients = statistics.mean(r["aggregated"] for r in steady)
    # Where an app round goes: clients phase (messages out, training, replies in), server aggregation, and the
    # rest (accounting, metrics line, checkpoint, next round's messages).
    split = {key: statistics.mean(r[key] for r in steady) for key in ("clients_phase_s", "aggregate_s")}
    app_s, loop_s = statistics.mean(app_rounds), statistics.mean(loop_rounds)
    result: dict[str, Any] = {
        "device": device,
        "rounds_measured": f"3..{num_rounds - 1}",
        "clients_per_round": clients,
        "app_round_s": app_s,
        "app_round_s_each": app_rounds,
        "loop_round_s": loop_s,
        "loop_round_s_each": loop_rounds,
        "app_clients_phase_s": split["clients_phase_s"],
        "app_aggregate_s": split["aggregate_s"],
        "app_other_s": statistics.mean(app_rounds) - split["clients_phase_s"] - split["aggregate_s"],
        "loop_threads": loop["threads"],
        "ratio_app_over_loop": app_s / loop_s,
        "app_updates_per_s": clients / app_s,
        "loop_updates_per_s": clients / loop_s,
        "final_model_max_abs_diff_vs_loop": max_abs_diff,
        "final_model_compared_with": f"loop with {reference['threads']} thread(s)",
    }
    if loop_1t is not None:
        one = statistics.mean(loop_1t["round_seconds"][2 : num_rounds - 1])
        result.update(loop_1thread_round_s=one, ratio_app_over_loop_1thread=app_s / one)
    return result


def _load_weights(path: str) -> list[np.ndarray]:
    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


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
    from fl_app.privacy.accounting import PrivacyAccountant, calibrate_noise_multiplier, compute_epsilon

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
    accountant = PrivacyAccountant("rdp", "poisson", population)
    accountant.step(sigma, q, steps - 1)
    t = time.perf_counter()
    accountant.step(sigma, q)
    accountant.get_epsilon(delta)
    accountant.epsilon_after(1, sigma, q, delta)
    result["per_round_accounting_at_T300_s"] = time.perf_counter() - t
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


def to_markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"# Benchmark ({m['date']})",
        "",
        f"Machine: {m['cpu_count']} cores ({m['processor']}), GPU: {m['cuda'] or 'none'}; torch {m['torch']}.",
        f"Config: `{' '.join(results['overrides'])}`; command: `{results['command']}`.",
        "",
        "| measure | value | target |",
        "|---|---|---|",
    ]
    if p1 := results.get("P1"):
        for door in ("hydra", "flwr_run"):
            s = p1[door]
            lines.append(
                f"| P1 startup, {door} (s) | {s['total_s']:.1f} = {s['to_serverapp_start_s']:.1f} to ServerApp + "
                f"{s['serverapp_to_first_fit_s']:.1f} to first fit + {s['worker_setup_s']:.1f} worker setup | "
                "as low as the engine allows |"
            )
        lines.append(
            f"| P1 parts measured alone (s) | imports {p1['python_imports_s']:.1f}, ray.init "
            f"{p1['ray_init_alone_s']:.1f}, SuperLink start {p1['superlink_start_s']:.1f} | |"
        )
    for key in ("P2", "P2_gpu"):
        if p2 := results.get(key):
            lines.append(
                f"| {key} steady state, {p2['device']}: app / loop per round | **{p2['ratio_app_over_loop']:.3f}** "
                f"({p2['app_round_s']:.2f} s / {p2['loop_round_s']:.2f} s, loop {p2['loop_threads']} threads)"
                " | ≤ 1.10 |"
            )
            lines.append(
                f"| {key} app round split (s) | clients phase {p2['app_clients_phase_s']:.2f}, aggregation "
                f"{p2['app_aggregate_s']:.2f}, other {p2['app_other_s']:.2f} | |"
            )
            if "ratio_app_over_loop_1thread" in p2:
                lines.append(
                    f"| {key} vs the loop on 1 thread | {p2['ratio_app_over_loop_1thread']:.3f} "
                    f"({p2['loop_1thread_round_s']:.2f} s) | |"
                )
            lines.append(
                f"| {key} client updates / s | app {p2['app_updates_per_s']:.2f}, loop {p2['loop_updates_per_s']:.2f} "
                f"({p2['clients_per_round']:.0f} clients/round) | |"
            )
            lines.append(
                f"| {key} final model vs loop, max abs diff | {p2['final_model_max_abs_diff_vs_loop']:.3g} "
                f"({p2['final_model_compared_with']}) | float tolerance |"
            )
    if p3 := results.get("P3"):
        peaks = ", ".join(f"M={k}: {v:.0f}" for k, v in p3["peak_rss_mib"].items())
        lines.append(
            f"| P3 peak RSS, all processes (MiB) | {peaks}; ratio **{p3['ratio_largest_over_smallest']:.3f}** | ≤ 1.2 |"
        )
    if p4 := results.get("P4"):
        lines.append(
            f"| P4 ε after T={p4['T']} (s) | RDP {p4['epsilon_rdp_s']:.3f}, PRV {p4['epsilon_prv_s']:.3f}, "
            f"PLD {p4['epsilon_pld_s']:.3f}, RDP fixed-size {p4['epsilon_rdp_fixed_s']:.3f} | < 1 |"
        )
        lines.append(f"| P4 calibrate σ for ε=8 (s) | {p4['calibrate_rdp_s']:.3f} | < 1 |")
        lines.append(f"| P4 accounting per round at T=300 (s) | {p4['per_round_accounting_at_T300_s']:.3f} | |")
    if "gpu" in results:
        lines.append(f"| GPU | {results['gpu']} | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="results directory (default bench/results/<time>)")
    parser.add_argument("--only", default="P1,P2,P3,P4", help="comma-separated subset of P1,P2,P3,P4")
    parser.add_argument("--rounds", type=int, default=8, help="P2 rounds (steady state = rounds 3..T-1)")
    parser.add_argument("--quick", action="store_true", help="a 6000-image subset and 5 rounds (smoke test)")
    parser.add_argument("--keep", action="store_true", help="keep the runs' directories")
    args = parser.parse_args(argv)
    only = {s.strip().upper() for s in args.only.split(",")}
    out = args.out or ROOT / "bench" / "results" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    overrides = P2_OVERRIDES + (QUICK_OVERRIDES if args.quick else [])
    rounds = 5 if args.quick else args.rounds
    results: dict[str, Any] = {
        "machine": machine(),
        "overrides": overrides,
        "command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    tmp = Path(tempfile.mkdtemp(prefix="bench", dir="/tmp"))
    try:
        if "P4" in only:
            results["P4"] = p4_accounting()
        if "P2" in only:
            results["P2"] = p2_steady_state(overrides, rounds, tmp)
            if torch.cuda.is_available():
                results["P2_gpu"] = p2_steady_state(overrides, rounds, tmp, device="cuda")
            else:
                results["gpu"] = "not present on this machine: GPU steady state not measured"
        if "P1" in only:
            results["P1"] = p1_startup(overrides, tmp)
        if "P3" in only:
            results["P3"] = p3_memory(overrides, tmp)
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
