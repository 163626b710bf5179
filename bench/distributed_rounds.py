"""What a distributed-DP round costs end to end on Flower's simulation engine, against a central-DP round of the same
clients (docs/performance.md "Distributed DP"): real DP-FedAvg runs from the Hydra front door, local training
included.

``python -m bench.distributed_rounds [--clients 10 50 100] [--rounds 3] [--out FILE]`` runs, for each m, DP-FedAvg
on M = 2m clients at q = 0.5 (a Poisson sample of about m a round) with server placement and with
``privacy=distributed``, the same seed (so the same samples, the same local training), one client a message in both
(``simulation.cohort_size=1``, the cohorts of central DP's default would be a different engine path), 60 images per
client and one local epoch. Each round's ``clients_phase_s`` (from the round's start to the last reply: four
exchanges under secure aggregation, one otherwise) and ``aggregate_s`` (the unmasking and decoding, or the noisy
average) come from the runs' ``metrics.jsonl``, the sample sizes from it or from ``operator_counts.jsonl``;
``round_s`` is their sum (the round without the evaluation, which is the same in both). The medians over rounds
2..T (round 1 starts Ray's workers) are reported, with the ratio of ``round_s``. On this machine's 2 cores the
clients' work is serialised, so the distributed clients' part grows with m; in a deployment each client's stages
run on its own machine (``bench.secure_sum`` gives the per-client and server compute of a round without training).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.processes import ROOT, THREAD_ENV, run_env

PLACEMENTS = {"central": "privacy=default", "distributed": "privacy=distributed"}
#: Every round's timings in metrics.jsonl.
TIMINGS = ("clients_phase_s", "aggregate_s")


def overrides(clients: int, rounds: int, placement: str) -> list[str]:
    """The Hydra overrides of one run: M = 2m clients at q = 0.5, 60 images each, one local epoch."""
    population = 2 * clients
    return [
        "strategy=dp_fedavg",
        PLACEMENTS[placement],
        f"dataset.num_clients={population}",
        f"dataset.max_train_samples={60 * population}",
        "dataset.max_test_samples=500",
        "privacy.sample_rate=0.5",
        "privacy.clip_norm=0.05",
        "client.local_epochs=1",
        "simulation.cohort_size=1",
        f"num_rounds={rounds}",
        f"eval_every={rounds}",
        "checkpoint_every=0",
        "seed=0",
    ]


def summarise(metrics: list[dict[str, Any]], counts: list[dict[str, Any]]) -> dict[str, float]:
    """The medians over rounds 2..T of a run's round timings and sample sizes (round 1 alone if T = 1)."""
    later = [r for r in metrics if r["round"] > 1] or metrics
    sampled = {c["round"]: c["sampled"] for c in counts}
    summary = {key: statistics.median(float(r[key]) for r in later) for key in TIMINGS}
    summary["round_s"] = statistics.median(sum(float(r[key]) for key in TIMINGS) for r in later)
    summary["sampled"] = statistics.median(float(sampled[r["round"]]) for r in later)
    return summary


def run_one(clients: int, rounds: int, placement: str, timeout: float = 1800) -> dict[str, float]:
    """One run's :func:`summarise`d timings; a failed run raises with the end of its output."""
    with tempfile.TemporaryDirectory(prefix="dround", dir="/tmp") as tmp:
        out = Path(tmp) / "out"
        env = {**run_env(Path(tmp)), **THREAD_ENV}
        cmd = [sys.executable, "-m", "apps.main", *overrides(clients, rounds, placement), f"output_dir={out}",
               f"hydra.run.dir={Path(tmp) / 'hydra'}"]  # fmt: skip
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{placement} run at m = {clients} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
        metrics = _lines(out / "metrics.jsonl")
        # The counts are in metrics.jsonl where the run publishes client statistics, else in the operator's file.
        counts_file = out / "operator_counts.jsonl"
        return summarise(metrics, _lines(counts_file) if counts_file.exists() else metrics)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def measure(clients: list[int], rounds: int) -> dict[str, Any]:
    rows = []
    for m in clients:
        row: dict[str, Any] = {"clients": m, "population": 2 * m}
        for placement in PLACEMENTS:
            for key, value in run_one(m, rounds, placement).items():
                row[f"{placement}_{key}"] = value
        row["round_ratio"] = row["distributed_round_s"] / row["central_round_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"strategy": "dp_fedavg", "rounds": rounds, "sample_rate": 0.5, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = measure(args.clients, args.rounds)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
