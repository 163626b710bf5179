"""The report's PNG plots: accuracy and ε per round, the norm histogram (journal Fig. 4), C_t, ablations."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fl_app.plotting import pyplot
from fl_app.report.grouping import Report, Stat
from fl_app.report.runs import RunRecord, as_number, is_finite_number


def _integer_locator() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def round_series(runs: Sequence[RunRecord], key: str) -> tuple[list[int], list[float], list[float]]:
    """Per round: mean and sample std (0 for one run) of ``key`` over the runs that have it at that round."""
    by_round: dict[int, list[float]] = {}
    for run in runs:
        for r in run.records:
            if is_finite_number(r.get(key)):
                by_round.setdefault(int(r["round"]), []).append(float(r[key]))
    rounds = sorted(by_round)
    means = [statistics.fmean(by_round[t]) for t in rounds]
    stds = [statistics.stdev(by_round[t]) if len(by_round[t]) > 1 else 0.0 for t in rounds]
    return rounds, means, stds


def _band(ax: Any, rounds: list[int], means: list[float], stds: list[float], label: str) -> None:
    """A mean line with a shaded ±std band in the line's colour."""
    (line,) = ax.plot(rounds, means, label=label)
    lo = [m - d for m, d in zip(means, stds, strict=True)]
    hi = [m + d for m, d in zip(means, stds, strict=True)]
    ax.fill_between(rounds, lo, hi, color=line.get_color(), alpha=0.2)


def _line_plot(report: Report, key: str, scale: float, ylabel: str, title: str, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    drawn = 0
    for cell in report.groups():
        rounds, means, stds = round_series(cell.completed, key)
        if not rounds:
            continue
        label = f"{report.label(cell)} (n={len(cell.completed)})"
        _band(ax, rounds, [scale * v for v in means], [scale * v for v in stds], label)
        drawn += 1
    if drawn:
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, f"no {key} recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(_integer_locator())
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_accuracy_vs_round(report: Report, path: Path) -> Path:
    return _line_plot(
        report, "test_accuracy", 100.0, "test accuracy (%)", "Test accuracy (mean ± std over seeds)", path
    )


def plot_epsilon_vs_round(report: Report, path: Path) -> Path:
    return _line_plot(report, "epsilon", 1.0, "ε", "Privacy loss ε per round (mean ± std over seeds)", path)


def plot_clip_norm_vs_round(report: Report, path: Path) -> Path:
    """C_t per round (adaptive clipping moves it; fixed clipping draws a flat line), mean ± std over seeds."""
    return _line_plot(report, "clip_norm", 1.0, "C_t", "Clip norm C_t per round (mean ± std over seeds)", path)


def _records_clip_norm(report: Report) -> bool:
    return any("clip_norm" in rec for run in report.runs for rec in run.records)


def plot_norm_histogram(report: Report, path: Path) -> Path:
    """Left: pooled pre-clip client update norms ‖Δ‖ (all rounds, seeds) per group; right: mean ‖Δ‖ per round."""
    plt = pyplot()
    import numpy as np

    fig, (ax_h, ax_r) = plt.subplots(1, 2, figsize=(13, 5))
    pooled = {}
    for cell in report.groups():
        norms = [float(v) for r in cell.completed for rec in r.records for v in rec.get("client_norms") or []]
        norms = [v for v in norms if math.isfinite(v)]
        if norms:
            pooled[report.label(cell)] = norms
    if pooled:
        edges = np.histogram_bin_edges(np.concatenate([np.asarray(v) for v in pooled.values()]), bins=50)
        for label, norms in pooled.items():
            ax_h.hist(norms, bins=edges, histtype="step", density=True, linewidth=1.5, label=label)
        ax_h.legend(fontsize="small")
    else:
        ax_h.text(0.5, 0.5, "no client_norms recorded", ha="center", va="center", transform=ax_h.transAxes)
    ax_h.set_xlabel("client update norm ‖Δ‖ (before clipping)")
    ax_h.set_ylabel("density")
    ax_h.set_title("Norm distribution, pooled over rounds and seeds")
    drawn = 0
    for cell in report.groups():
        runs = []
        for run in cell.completed:
            recs = []
            for rec in run.records:
                value = rec.get("norm_mean")
                if not is_finite_number(value):
                    norms = [v for v in rec.get("client_norms") or [] if is_finite_number(v)]
                    value = statistics.fmean(norms) if norms else None
                recs.append({"round": rec["round"], "norm_mean": value})
            runs.append(RunRecord(path=run.path, status=run.status, records=recs))
        rounds, means, stds = round_series(runs, "norm_mean")
        if not rounds:
            continue
        _band(ax_r, rounds, means, stds, report.label(cell))
        drawn += 1
    if drawn:
        ax_r.legend(fontsize="small")
    ax_r.set_xlabel("round")
    ax_r.xaxis.set_major_locator(_integer_locator())
    ax_r.set_ylabel("mean ‖Δ‖")
    ax_r.set_title("Mean client update norm per round")
    ax_r.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def ablation_key(report: Report) -> str | None:
    """The single column key, when there is exactly one and all its values are numbers."""
    if len(report.col_keys) != 1 or not report.combos:
        return None
    return report.col_keys[0] if all(as_number(c[0]) is not None for c in report.combos) else None


def plot_ablation(report: Report, path: Path) -> Path:
    """Best test accuracy (mean ± std over seeds) against the single numeric column key, one line per row."""
    key = ablation_key(report)
    if key is None:
        raise ValueError("an ablation plot needs exactly one numeric column key")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    for row in report.rows:
        xs, ys, es = [], [], []
        for combo in report.combos:
            cell = report.cell(row, combo)
            stat = cell.stat("best_test_accuracy") if cell else Stat(None, None, 0)
            if stat.mean is None:
                continue
            xs.append(float(combo[0]))
            ys.append(100 * stat.mean)
            es.append(100 * (stat.std or 0.0))
        if xs:
            ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=row)
    ax.set_xlabel(key)
    ax.set_ylabel("best test accuracy (%)")
    ax.set_title(f"Ablation over {key} (mean ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", title=report.row_key)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(report: Report, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        plot_accuracy_vs_round(report, out_dir / "accuracy_vs_round.png"),
        plot_epsilon_vs_round(report, out_dir / "epsilon_vs_round.png"),
        plot_norm_histogram(report, out_dir / "norm_histogram.png"),
    ]
    if _records_clip_norm(report):
        paths.append(plot_clip_norm_vs_round(report, out_dir / "clip_norm_vs_round.png"))
    if ablation_key(report) is not None:
        paths.append(plot_ablation(report, out_dir / "ablation.png"))
    return paths
