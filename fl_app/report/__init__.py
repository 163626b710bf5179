"""Sweep report in the papers' table layout: ``python -m fl_app.report <sweep dir> [--rows KEY] [--cols KEY ...]``.

Collects every run below a Hydra sweep directory (``python -m apps.main --multirun ...``) and writes, into
``--out`` (default ``<sweep dir>/report/``): ``table.md`` (also printed), ``table.csv`` (long form), ``runs.csv``
(one row per run, missing jobs included), ``rounds.csv`` (one row per run and round: the per-round values that
docs quote, e.g. C_t, ‖Δ‖ statistics, σ) and PNG plots.

Table layout (as in the DP-FedSAM papers' result tables): one row per value of ``--rows`` (default the
strategy name), one column group per combination of the ``--cols`` keys (default: every swept key except the row
key and ``seed``), and in every group, over the seeds of that cell:

- **best**: best test accuracy, ``max_t test_accuracy(t)`` over the evaluated rounds of a run, then averaged over
  seeds ("best-averaged", as the papers report it);
- **final**: test accuracy of the last evaluated round;
- **train**: ``train_accuracy`` of the last round, i.e. the mean local training accuracy of that round's clients;
- **gap**: train − final test accuracy (last round), in percentage points (a generalisation gap);
- **ε**: the accountant's ε after the last round ("-" for non-private runs).

Accuracies are percentages with two decimals, ``mean ± std`` with the sample standard deviation (ddof = 1);
a single seed shows the mean and ``(n=1)``. ε shows the mean alone when all seeds agree (the usual case: the
noise is calibrated to a target ε).

Nothing is dropped silently. A run is *completed* when ``run.json`` says ``completed`` or ``stopped`` (stopped at
its ε budget) and it has metrics; anything else (``failed``, still ``running`` or killed, a job directory without
``run.json``) is *failed/incomplete*; a job the sweep's cartesian product expects (``multirun.yaml``,
``hydra.overrides.task``) with no job directory is *missing*. Each gets its own line under the table; a cell with
no completed seed reads ``missing`` or ``failed (k/n)`` (k of its n expected seeds failed), and a cell with some
seeds completed averages those and says ``(k/n seeds)``. An expected job counts as present when a job directory
of its sweep has the same override values (``.hydra/overrides.yaml``, else the config).

``table.csv`` holds the table's numbers in its units (accuracy and gap in %, ε as is) with the seed counts;
``runs.csv`` keeps ``metrics.jsonl``'s units (accuracies as fractions).

Keys are dotted config paths (``dataset.alpha``, ``privacy.target_epsilon``, ``strategy.sparsity``) or
``strategy`` (``config.strategy.name``), read from ``run.json["config"]`` and else from ``.hydra/overrides.yaml``.

Plots: ``accuracy_vs_round.png`` and ``epsilon_vs_round.png`` (mean over seeds, shaded ± std, one line per
row × column group), ``norm_histogram.png`` (pooled pre-clip client update norms ‖Δ‖ and the mean ‖Δ‖ per round,
as in journal Fig. 4) and, when exactly one numeric column key is swept, ``ablation.png`` (best test accuracy
mean ± std against that key, one line per row value: the ρ / local epochs / clients / sparsity / ε ablations).

The package, a module per job: :mod:`~fl_app.report.runs` (find a sweep's runs and expected jobs),
:mod:`~fl_app.report.grouping` (the cells of the table), :mod:`~fl_app.report.tables` (markdown and CSV),
:mod:`~fl_app.report.plots`, :mod:`~fl_app.report.summary` (one line per run: ``python -m fl_app.report.summary``)
and :mod:`~fl_app.report.cli`.
"""

from __future__ import annotations

from fl_app.report.cli import main
from fl_app.report.grouping import Cell, Report, Stat, build_report, detect_column_keys, group_runs
from fl_app.report.plots import (
    plot_ablation,
    plot_accuracy_vs_round,
    plot_clip_norm_vs_round,
    plot_epsilon_vs_round,
    plot_norm_histogram,
    write_plots,
)
from fl_app.report.runs import ExpectedJob, RunRecord, canon, collect_runs, expected_jobs, missing_jobs, run_value
from fl_app.report.tables import AUDIT_METRICS, METRICS, format_cell, to_markdown, write_csv, write_rounds_csv

__all__ = [
    "AUDIT_METRICS",
    "METRICS",
    "Cell",
    "ExpectedJob",
    "Report",
    "RunRecord",
    "Stat",
    "build_report",
    "canon",
    "collect_runs",
    "detect_column_keys",
    "expected_jobs",
    "format_cell",
    "group_runs",
    "main",
    "missing_jobs",
    "plot_ablation",
    "plot_accuracy_vs_round",
    "plot_clip_norm_vs_round",
    "plot_epsilon_vs_round",
    "plot_norm_histogram",
    "run_value",
    "to_markdown",
    "write_csv",
    "write_plots",
    "write_rounds_csv",
]
