"""Where a round's time goes on the server's side (docs/performance.md "Where a P2 DP-FedAvg round goes").

``python -m bench.round_split [--out FILE] [OVERRIDE ...]`` runs the app's Hydra entry point in this process
(``python -m apps.main OVERRIDE ...``; default: the P2 config, DP-FedAvg, 30 rounds) with timers around the run
loop's calls — nothing in the app is changed — and prints, as medians over the steady rounds (3..T-1):

* the round (interval between consecutive pushes of the round's messages);
* push → first local fit (the earliest ``fit_started_unix`` a reply reports, from ``metrics.jsonl``);
* first → last reply as the server pulled them (the cohorts' spread, plus the pulls);
* **last reply → next round's push**: the server's path between rounds (the last replies' screening, the rest of
  the aggregation, the release digest and its fsync-ed log line, the ledger, ``run.json``, the record, the next
  plan), and of it: the aggregation after the last reply, the digest, the log line, the plan;
* the observers (checkpoint, metrics line), which run after the push, off that path.

Every process is pinned to one BLAS/OpenMP thread, as in the benchmark.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import runpy
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: What the run loop calls, timed: (module, attribute path, key). Each call adds (start, seconds) under its key.
TIMED = (
    ("strategies.base", "FederatedStrategy.plan_round", "plan"),
    ("strategies.round_aggregator", "RoundAggregator.aggregate_taken", "aggregate"),
    ("strategies.base", "FederatedStrategy._release", "digest"),
    ("strategies.client_dp.releasing", "RunReleases.record", "release_log"),
    ("strategies.aggregation", "RoundReplies.take", "take"),
)


def install(events: dict[str, list[tuple[float, float]]]) -> None:
    """Wrap :data:`TIMED` and the run loop's ``send_and_receive`` (its push, each pull's replies, the observers run
    after the push) so that every call is recorded in ``events``."""
    import importlib

    def timed(key: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.time()
            try:
                return function(*args, **kwargs)
            finally:
                events.setdefault(key, []).append((start, time.time() - start))

        return wrapper

    for module_name, path, key in TIMED:
        owner_name, attribute = path.split(".")
        owner = getattr(importlib.import_module(module_name), owner_name)
        setattr(owner, attribute, timed(key, getattr(owner, attribute)))

    import strategies.run_loop as run_loop

    original = run_loop.send_and_receive

    def send_and_receive(grid: Any, messages: Any, timeout: Any, on_arrival: Any = None, on_pushed: Any = None) -> Any:
        def pushed() -> None:
            events.setdefault("push", []).append((time.time(), 0.0))
            if on_pushed is not None:
                timed("observers", on_pushed)()

        def arrived(replies: list[Any], still_pending: int) -> None:
            events.setdefault("arrival", []).append((time.time(), float(len(replies))))
            if on_arrival is not None:
                on_arrival(replies, still_pending)

        return original(grid, messages, timeout, on_arrival=arrived, on_pushed=pushed)

    run_loop.send_and_receive = send_and_receive


def split(events: dict[str, list[tuple[float, float]]], first_fits: list[float]) -> dict[str, float]:
    """Medians (seconds) over the steady rounds 3..T-1 of the round's parts (see the module docstring); ``events``
    as :func:`install` records them, ``first_fits`` each round's earliest local fit start (Unix time)."""
    pushes = [at for at, _ in events["push"]]
    rounds = len(pushes)
    per_round: dict[str, list[float]] = {}

    def within(key: str, begin: float, end: float) -> list[tuple[float, float]]:
        return [(at, took) for at, took in events.get(key, []) if begin <= at < end]

    for index in range(2, rounds - 1):  # rounds 3..T-1 (index 0 is round 1); each has a next push
        begin, end = pushes[index], pushes[index + 1]
        arrivals = [at for at, _ in within("arrival", begin, end)]
        last = max(arrivals)
        parts = {
            "round_s": end - begin,
            "push_to_first_fit_s": first_fits[index] - begin,
            "first_to_last_reply_s": last - min(arrivals),
            "last_reply_to_next_push_s": end - last,
            "aggregate_after_last_reply_s": sum(t for _, t in within("take", last, end))
            + sum(t for _, t in within("aggregate", last, end)),
            "digest_s": sum(t for _, t in within("digest", last, end)),
            "release_log_s": sum(t for _, t in within("release_log", last, end)),
            "plan_s": sum(t for _, t in within("plan", last, end)),
            "observers_after_push_s": sum(t for _, t in within("observers", begin, end)),
        }
        for key, value in parts.items():
            per_round.setdefault(key, []).append(value)
    return {key: statistics.median(values) for key, values in per_round.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="also write the medians here (JSON)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (default: the P2 config, DP-FedAvg, 30 rounds)")
    args = parser.parse_args(argv)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # before torch is imported
        os.environ[variable] = "1"
    from bench.run import P2_OVERRIDES, with_overrides

    overrides = args.overrides or with_overrides(P2_OVERRIDES, "strategy=dp_fedavg", "num_rounds=30")
    events: dict[str, list[tuple[float, float]]] = {}
    install(events)
    with tempfile.TemporaryDirectory(prefix="round_split_") as tmp:
        os.environ.setdefault("RAY_TMPDIR", tmp)
        os.environ.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
        sys.argv = ["apps.main", *overrides, f"output_dir={tmp}/run", f"hydra.run.dir={tmp}/hydra"]
        runpy.run_module("apps.main", run_name="__main__")
        from fl_app.metrics import read_metrics

        first_fits = [float(r["first_fit_started_unix"]) for r in read_metrics(Path(tmp) / "run" / "metrics.jsonl")]
    result = {"overrides": overrides, **split(events, first_fits)}
    for key, value in result.items():
        print(f"{key}: {value * 1000:.1f} ms" if key.endswith("_s") else f"{key}: {value}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
