"""The report as text: ``table.md`` (the papers' layout), ``table.csv``, ``runs.csv`` and ``rounds.csv``."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from fl_app.report.grouping import Cell, Report, combo_labels, mean_std, sweep_value
from fl_app.report.runs import COMPLETED_STATUSES, RunRecord, canon, run_value

# (metric name, header label, unit); accuracies are fractions in metrics.jsonl and percent in the report.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("best_test_accuracy", "best", "%"),
    ("final_test_accuracy", "final", "%"),
    ("train_accuracy", "train", "%"),
    ("gap", "gap", "pp"),
    ("epsilon", "ε", ""),
)
#: ``--audit`` adds the canary audit (run.json ``audit``; docs/audit.md): Andrew et al.'s estimates from the final
#: model and from all iterates, and Steinke et al.'s one-run lower bound (at its own δ, see the run's audit section).
AUDIT_METRICS: tuple[tuple[str, str, str], ...] = (
    ("audit_eps_estimate_final", "ε̂ final", ""),
    ("audit_eps_estimate_iterates", "ε̂ iterates", ""),
    ("audit_eps_lower_bound", "ε lower bound", ""),
)
COUNT_COLUMNS = ("n_completed", "n_expected", "n_failed", "n_missing")
RUN_METRICS = ("best_test_accuracy", "final_test_accuracy", "train_accuracy", "gap")
#: Per-round fields of ``rounds.csv`` (``metrics.jsonl``'s names and units; empty where a run did not record one).
ROUND_COLUMNS = (
    "test_accuracy",
    "epsilon",
    "noise_multiplier",
    "clip_norm",
    "clip_norm_next",
    "fraction_clipped_noisy",
    "norm_mean",
    "norm_median",
    "fraction_clipped",
)


def format_cell(cell: Cell | None, metric: str) -> str:
    """The table text of one metric of one cell (see the module docstring)."""
    if cell is None:
        return "–"
    k, n = len(cell.completed), cell.n_expected
    if k == 0:
        return f"failed ({cell.n_failed}/{n})" if cell.n_failed else "missing"
    values = cell.values(metric)
    if not values:
        return "-"
    stat = mean_std(values)
    assert stat.mean is not None
    if metric == "epsilon" or metric.startswith("audit_"):
        same = max(values) - min(values) <= 1e-9
        body = f"{stat.mean:.2f}" if same or stat.std is None else f"{stat.mean:.2f} ± {stat.std:.2f}"
        return body + (f" ({k}/{n} seeds)" if k < n else "")
    body = f"{100 * stat.mean:.2f}" if stat.std is None else f"{100 * stat.mean:.2f} ± {100 * stat.std:.2f}"
    if k < n:
        return f"{body} ({k}/{n} seeds)"
    if len(values) < k or len(values) == 1:
        return f"{body} (n={len(values)})"
    return body


def _run_keys(report: Report, run: RunRecord) -> str:
    keys = [report.row_key, *report.col_keys, "seed"]
    return ", ".join(f"{k}={canon(run_value(run, k))}" for k in keys)


def problem_lines(report: Report, root: Path | None = None) -> list[str]:
    """One line per missing job and per failed/incomplete run."""
    lines = []
    for job in report.missing:
        where = job.sweep_dir if root is None else relative(job.sweep_dir, root)
        lines.append(f"- **MISSING** {job.describe()}: job {job.index} of sweep `{where}` has no job directory")
    for run in report.runs:
        if run.ok:
            continue
        where = run.path if root is None else relative(run.path, root)
        kind = "FAILED" if run.status in ("failed", "unreadable run.json") else "INCOMPLETE"
        if run.status in COMPLETED_STATUSES:
            why = f"status {run.status} but no metrics.jsonl rows"
        elif run.status == "no run.json":
            why = "job directory without run.json (died before training; see its log)"
        else:
            why = f"status {run.status} after {run.rounds} round(s)"
        err = f": {run.error}" if run.error else ""
        lines.append(f"- **{kind}** `{where}` ({_run_keys(report, run)}): {why}{err}")
    return lines


def relative(path: Path, root: Path) -> str:
    try:
        rel = str(path.relative_to(root))
    except ValueError:
        return str(path)
    return rel or "."


def to_markdown(
    report: Report,
    title: str | None = None,
    root: Path | None = None,
    metrics: Sequence[tuple[str, str, str]] = METRICS,
) -> str:
    """The table (one line per row value; per column group best / final / train / gap / ε) and the problem lines."""
    lines = [f"# {title}", ""] if title else []
    lines += [
        "Test accuracy in %, mean ± std over seeds (sample std; `(n=1)`: one seed). best = max over rounds "
        "(best-averaged); final = last evaluated round; train = last round's mean local training accuracy; "
        "gap = train − final test (pp); ε = after the last round."
        + (
            " ε̂ = the canary audit's estimates, ε lower bound = its one-run bound (docs/audit.md)."
            if len(metrics) > len(METRICS)
            else ""
        ),
        "",
    ]
    header = [report.row_key]
    for combo in report.combos:
        prefix = ", ".join(combo_labels(report.col_keys, combo))
        header += [f"{prefix} {label}" if prefix else label for _, label, _ in metrics]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for row in report.rows:
        cells = [row]
        for combo in report.combos:
            cell = report.cell(row, combo)
            cells += [format_cell(cell, metric) for metric, _, _ in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    n_ok = sum(r.ok for r in report.runs)
    n_bad = len(report.runs) - n_ok
    lines += ["", f"{n_ok} completed run(s), {n_bad} failed/incomplete, {len(report.missing)} missing."]
    problems = problem_lines(report, root)
    if problems:
        lines += ["", "**Runs not in the means:**", "", *problems]
    return "\n".join(lines) + "\n"


def write_csv(
    report: Report, out_dir: Path, root: Path | None = None, metrics: Sequence[tuple[str, str, str]] = METRICS
) -> tuple[Path, Path]:
    """``table.csv`` (one row per cell × metric) and ``runs.csv`` (one row per run and per missing job)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    table_path, runs_path = out_dir / "table.csv", out_dir / "runs.csv"
    with table_path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([report.row_key, *report.col_keys, "metric", "unit", "mean", "std", *COUNT_COLUMNS, "cell"])
        for cell in report.groups():
            for metric, _, unit in metrics:
                stat = cell.stat(metric)
                scale = 100.0 if unit in ("%", "pp") else 1.0
                w.writerow(
                    [
                        cell.row,
                        *cell.cols,
                        metric,
                        unit,
                        "" if stat.mean is None else repr(scale * stat.mean),
                        "" if stat.std is None else repr(scale * stat.std),
                        len(cell.completed),
                        cell.n_expected,
                        cell.n_failed,
                        len(cell.missing),
                        format_cell(cell, metric),
                    ]
                )
    keys = [report.row_key, *report.col_keys]
    if "seed" not in keys:
        keys.append("seed")
    with runs_path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["path", "status", *keys, *RUN_METRICS, "epsilon", "rounds", "error"])
        for run in report.runs:
            path = str(run.path) if root is None else relative(run.path, root)
            metrics = [run.metric(m) for m in RUN_METRICS]
            w.writerow(
                [
                    path,
                    run.status,
                    *[canon(run_value(run, k)) for k in keys],
                    *["" if v is None else repr(v) for v in metrics],
                    "" if run.epsilon is None else repr(run.epsilon),
                    run.rounds,
                    run.error or "",
                ]
            )
        for job in report.missing:
            path = str(job.sweep_dir) if root is None else relative(job.sweep_dir, root)
            values = [canon(sweep_value(job, k, report.runs)) for k in keys]
            w.writerow([f"{path} (job {job.index})", "missing", *values, "", "", "", "", "", 0, ""])
    return table_path, runs_path


def write_rounds_csv(report: Report, out_dir: Path, root: Path | None = None) -> Path:
    """``rounds.csv``: one row per completed run and round, with :data:`ROUND_COLUMNS` as ``metrics.jsonl`` has
    them, so that a per-round number a document quotes has a committed source."""
    keys = [report.row_key, *report.col_keys]
    if "seed" not in keys:
        keys.append("seed")
    path = out_dir / "rounds.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["path", *keys, "round", *ROUND_COLUMNS])
        for run in report.runs:
            if not run.ok:
                continue
            values = [canon(run_value(run, k)) for k in keys]
            for record in run.records:
                cells = [record.get(column) for column in ROUND_COLUMNS]
                w.writerow(
                    [
                        str(run.path) if root is None else relative(run.path, root),
                        *values,
                        record.get("round"),
                        *["" if v is None else repr(v) for v in cells],
                    ]
                )
    return path
