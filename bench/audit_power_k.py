"""What the one-run lower bound can certify at each number of canaries K, and what K sparse canaries cost.

``.venv/bin/python -m bench.audit_power_k`` prints a markdown table: for each K, the lower bound's δ_LB =
min(δ, 0.01/K) (the audit's default, δ = 0.01 as in CPU Table IV), the ceiling of Steinke, Nasr & Jagielski's
one-run bound (NeurIPS 2023, arXiv 2305.08846) at K and δ_LB — the ε it certifies when every guess is right
(:func:`fl_app.privacy.audit.certifiable_epsilon`) — next to the accountant's ε of CPU Table IV (σ = 0.95,
q = 0.1, 12 rounds, Poisson sampling, RDP: :func:`fl_app.privacy.accountants.compute_epsilon`) at the same δ_LB
(a bound can only flag a violation where the ceiling is above it), and the time to generate and score K sparse
canaries (:func:`fl_app.privacy.audit.sparse_canary_direction`, support 1,000) against 12 model deltas of the
paper CNN's d = 1,663,370 weights, against the dense canaries' time, extrapolated from a measured sample of 50.

The ceiling assumes every inserted canary can be told apart. In the app an inserted canary joins each round with
the sampler's rate q, so a fraction (1 − q)^T of them (28% at q = 0.1, T = 12) never joins any round and is, under
any mechanism, indistinguishable from a never-inserted one. The script also simulates that best case — the
inserted canaries that joined a round score above every other canary, the rest are random — and reports what
:func:`~fl_app.privacy.audit.one_run_lower_bound` certifies on it with the two-sided rule ("inserted" on the highest
half of the guesses, "not inserted" on the lowest half; median of a few draws), and what the one-sided rule (the
app's default ``audit.guess_rule``: "inserted" on the highest scores only, abstaining on the rest) certifies (all
r ≤ J guesses right, J the number of joined canaries, Bonferroni over the same default counts).

Everything runs on one thread: torch, OpenMP and BLAS pools are pinned to 1 at import
(:func:`fl_app.threads.limit_library_threads`), as in the app's processes.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch

from fl_app.privacy.accountants import compute_epsilon
from fl_app.privacy.audit import (
    canary_dots,
    certifiable_epsilon,
    default_guess_counts,
    one_run_lower_bound,
    sparse_canary_direction,
)
from fl_app.threads import library_thread_counts, limit_library_threads

torch.set_num_threads(1)
limit_library_threads(1)

#: Parameters of the paper CNN (the CPU Table IV model): the length of every model delta.
PAPER_CNN_SIZE = 1_663_370
#: CPU Table IV's privacy: σ, q, rounds, δ (Poisson sampling, RDP accountant).
NOISE_MULTIPLIER, SAMPLE_RATE, ROUNDS, DELTA = 0.95, 0.1, 12, 0.01
SEED = 0

T = TypeVar("T")


def timed(function: Callable[[], T]) -> tuple[T, float, float]:
    """(result, wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def generate_sparse(canaries: int, size: int, support: int) -> None:
    for index in range(canaries):
        sparse_canary_direction(SEED, index, size, support)


def participation_best_cases(canaries: int, delta: float, draws: int) -> tuple[float, float]:
    """(two-sided, one-sided) bound when only the inserted canaries that joined a round stand out: medians."""
    join = 1.0 - (1.0 - SAMPLE_RATE) ** ROUNDS
    counts = default_guess_counts(canaries)
    two_sided, one_sided = [], []
    for draw in range(draws):
        rng = np.random.default_rng([canaries, draw])
        inserted = rng.random(canaries) < 0.5
        joined = inserted & (rng.random(canaries) < join)
        scores = rng.normal(size=canaries) + 100.0 * joined
        two_sided.append(one_run_lower_bound(scores, inserted, delta).epsilon)
        # One-sided: r ≤ J guesses, all right; the p-value depends on (m, r, v) only, so this is the two-sided
        # ceiling restricted to those counts, each still at significance 0.05/len(counts) (the full grid).
        usable = [count for count in counts if count <= int(joined.sum())]
        confidence = 1.0 - 0.05 * len(usable) / len(counts)
        one_sided.append(certifiable_epsilon(canaries, delta, confidence, guesses=usable) if usable else 0.0)
    return float(np.median(two_sided)), float(np.median(one_sided))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--canaries", type=int, nargs="+", default=[500, 2000, 10_000, 50_000])
    parser.add_argument("--support", type=int, default=1_000)
    parser.add_argument("--deltas", type=int, default=ROUNDS, help="model deltas scored against (rounds)")
    parser.add_argument("--size", type=int, default=PAPER_CNN_SIZE)
    parser.add_argument("--dense-sample", type=int, default=50, help="dense canaries actually timed")
    parser.add_argument("--draws", type=int, default=5, help="draws of the participation best case")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(1)
    deltas = [rng.standard_normal(args.size, dtype=np.float32) for _ in range(args.deltas)]
    limit_library_threads(1)

    _, dense_wall, dense_cpu = timed(lambda: canary_dots(SEED, range(args.dense_sample), deltas))
    dense_per_canary = dense_wall / args.dense_sample

    rows, certify_rows = [], []
    for k in args.canaries:
        bound_delta = min(DELTA, 0.01 / k)
        ceiling, ceiling_wall, _ = timed(lambda k=k, d=bound_delta: certifiable_epsilon(k, d))
        accountant = compute_epsilon(NOISE_MULTIPLIER, SAMPLE_RATE, ROUNDS, bound_delta, "rdp", "poisson")
        _, generate_wall, _ = timed(lambda k=k: generate_sparse(k, args.size, args.support))
        dots, score_wall, score_cpu = timed(lambda k=k: canary_dots(SEED, range(k), deltas, support=args.support))
        assert dots.shape == (k, args.deltas) and np.isfinite(dots).all()
        dense = k * dense_per_canary
        two_sided, one_sided = participation_best_cases(k, bound_delta, args.draws)
        certify_rows.append(
            f"| {k:,} | {bound_delta:.0e} | {accountant:.2f} | {ceiling:.2f} | "
            f"{'**yes**' if ceiling > accountant else 'no'} | {two_sided:.2f} | "
            f"{'**yes**' if two_sided > accountant else 'no'} | {one_sided:.2f} | "
            f"{'**yes**' if one_sided > accountant else 'no'} | {ceiling_wall:.2f} |"
        )
        rows.append(
            f"| {k:,} | {generate_wall:.2f} | {score_wall:.2f} ({score_cpu:.2f}) | "
            f"{dense:,.1f} (≈ {dense / 60:,.1f} min) | {dense / score_wall:,.0f}× |"
        )

    command = " ".join([".venv/bin/python -m bench.audit_power_k", *(argv if argv is not None else sys.argv[1:])])
    print(f"# One-run lower bound: ceiling and cost at K canaries ({time.strftime('%Y-%m-%dT%H:%M:%S')})\n")
    print(f"Command: `{command}`\n")
    print(
        f"Machine: {os.cpu_count()} cores ({platform.machine()}), numpy {np.__version__}, torch {torch.__version__}; "
        f"one thread: {library_thread_counts()}.\n"
    )
    print(
        f"Canaries scored against {args.deltas} random float32 deltas of d = {args.size:,}; sparse canaries of "
        f"support {args.support:,}. Accountant: CPU Table IV, σ = {NOISE_MULTIPLIER}, q = {SAMPLE_RATE}, "
        f"{ROUNDS} rounds, Poisson, RDP, at δ_LB = min({DELTA}, 0.01/K). Ceiling = `certifiable_epsilon(K, δ_LB)`, "
        "the largest ε Steinke et al.'s bound certifies at 95% confidence (Bonferroni over the default guess "
        "counts) when every guess is right. A bound can only flag a violation where it exceeds the accountant's ε.\n"
    )
    print("## What the bound can certify\n")
    print(
        "| K | δ_LB | accountant ε at δ_LB | ceiling ε (every canary separable) | > accountant "
        f"| app's two-sided rule, best case at q = {SAMPLE_RATE}, {ROUNDS} rounds | > accountant "
        "| one-sided rule, same best case | > accountant | ceiling s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(certify_rows))
    print(
        f"\nBest cases: {args.draws} draws each (median), an inserted canary joining some round with probability "
        f"1 − (1 − {SAMPLE_RATE})^{ROUNDS} = {1 - (1 - SAMPLE_RATE) ** ROUNDS:.3f}; the joined ones score above "
        "every other canary, the others are random. Two-sided: `one_run_lower_bound(..., rule='two_sided')`. "
        "One-sided: 'inserted' on the r highest scores only (r ≤ the number joined, all right), the app's default "
        "`audit.guess_rule`.\n"
    )
    print("## Cost of K canaries\n")
    print(
        "| K | sparse: generate s | sparse: generate + score s (CPU s) | dense: generate + score s, extrapolated "
        "| dense / sparse |"
    )
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print(
        f"\nDense times are extrapolated linearly in K from {args.dense_sample} dense canaries actually scored "
        f"against the same {args.deltas} deltas: {dense_wall:.2f} s wall ({dense_cpu:.2f} s CPU), "
        f"{1e3 * dense_per_canary:.1f} ms a canary (the cost is per canary: generating d normal draws and "
        f"{args.deltas} products of length d). Sparse times are measured at every K, wall clock (CPU in brackets); "
        "'generate' is the canary directions alone, 'generate + score' is the whole `canary_dots(..., support=s)` "
        "call (it generates the canaries again)."
    )


if __name__ == "__main__":
    main()
