"""Sweep report in the papers' table layout: ``python -m fl_app.report <sweep dir> [--rows KEY] [--cols KEY ...]``.

Collects every run below a Hydra sweep directory (``python -m fl_app.main --multirun ...``) and writes, into
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
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import re
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fl_app.metrics import read_metrics

__all__ = [
    "AUDIT_METRICS",
    "METRICS",
    "Cell",
    "ExpectedJob",
    "Report",
    "RunRecord",
    "Stat",
    "canon",
    "collect_runs",
    "detect_column_keys",
    "expected_jobs",
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
]

COMPLETED_STATUSES = ("completed", "stopped")
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
# Overrides that differ between jobs without being an experimental factor.
_NOT_FACTORS = frozenset({"seed", "output_dir", "resume"})
_MISSING: Any = object()
_COUNT_COLUMNS = ("n_completed", "n_expected", "n_failed", "n_missing")
_RUN_METRICS = ("best_test_accuracy", "final_test_accuracy", "train_accuracy", "gap")
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


# --- values ------------------------------------------------------------------------------------------------------


def canon(value: Any) -> str:
    """One string per value, equal for ``0.3`` (config), ``"0.3"`` (override text) and ``1`` vs ``1.0``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        f = float(value)
        if math.isfinite(f) and f.is_integer() and abs(f) < 1e15:
            return str(int(f))
        return repr(f)
    if isinstance(value, str):
        try:
            return canon(float(value)) if value.strip().lower() not in ("nan", "inf", "-inf", "infinity") else value
        except ValueError:
            return value
    return json.dumps(value, sort_keys=True, default=str)


def _as_number(text: str) -> float | None:
    try:
        f = float(text)
    except ValueError:
        return None
    return f if math.isfinite(f) else None


def _lookup(config: Mapping[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _natural(text: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def _parse_overrides(lines: Sequence[str]) -> dict[str, Any]:
    """``key=value`` overrides → {key: typed value}, with Hydra's parser (``+key`` → ``key``, ``~key`` dropped)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    result: dict[str, Any] = {}
    parser = OverridesParser.create()
    for line in lines:
        try:
            override = parser.parse_overrides([str(line)])[0]
        except Exception:  # not Hydra syntax: keep the raw text
            key, _, value = str(line).partition("=")
            result[key.lstrip("+~")] = value
            continue
        if override.is_delete():
            continue
        result[override.key_or_group] = override.value()
    return result


# --- runs --------------------------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    """One job directory: its status, config, overrides and per-round metrics, with the report's metrics."""

    path: Path
    status: str
    config: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Completed (or stopped at its budget) with metrics: the runs that enter means and curves."""
        return self.status in COMPLETED_STATUSES and bool(self.records)

    @property
    def rounds(self) -> int:
        return len(self.records)

    def _series(self, key: str) -> list[float]:
        return [float(r[key]) for r in self.records if _finite(r.get(key))]

    @property
    def best_test_accuracy(self) -> float | None:
        accs = self._series("test_accuracy")
        return max(accs) if accs else None

    @property
    def final_test_accuracy(self) -> float | None:
        accs = self._series("test_accuracy")
        if accs:
            return accs[-1]
        value = (self.meta.get("final") or {}).get("test_accuracy")
        return float(value) if _finite(value) else None

    @property
    def train_accuracy(self) -> float | None:
        accs = self._series("train_accuracy")
        return accs[-1] if accs else None

    @property
    def gap(self) -> float | None:
        train, test = self.train_accuracy, self.final_test_accuracy
        return None if train is None or test is None else train - test

    @property
    def epsilon(self) -> float | None:
        eps = self._series("epsilon")
        if eps:
            return eps[-1]
        value = self.meta.get("epsilon")
        return float(value) if _finite(value) else None

    def metric(self, name: str) -> float | None:
        if name.startswith("audit_"):
            value = (self.meta.get("audit") or {}).get(name.removeprefix("audit_"))
            return float(value) if _finite(value) else None
        return getattr(self, name)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _read_records(path: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl`` rows; a crash can leave a half-written last line, which is skipped with a warning."""
    if not path.exists():
        return []
    try:
        return read_metrics(path)
    except json.JSONDecodeError:
        rows = []
        for i, line in enumerate(path.read_text().splitlines(), 1):
            try:
                if line.strip():
                    rows.append(json.loads(line))
            except json.JSONDecodeError:
                print(f"warning: {path}:{i} is not JSON (truncated by a crash?); skipped", file=sys.stderr)
        return rows


def collect_runs(root: Path) -> list[RunRecord]:
    """Every job directory below ``root``: a directory with ``run.json`` or with Hydra's ``.hydra/overrides.yaml``
    (a job that died before writing ``run.json`` has only the latter; its status is ``no run.json``)."""
    dirs = {p.parent for p in root.rglob("run.json")}
    dirs |= {p.parent.parent for p in root.rglob("overrides.yaml") if p.parent.name == ".hydra"}
    runs = []
    for d in sorted(dirs, key=lambda p: _natural(str(p))):
        overrides_path = d / ".hydra" / "overrides.yaml"
        overrides: dict[str, Any] = {}
        if overrides_path.exists():
            lines = yaml.safe_load(overrides_path.read_text()) or []
            overrides = _parse_overrides([str(x) for x in lines])
        meta_path = d / "run.json"
        if not meta_path.exists():
            runs.append(RunRecord(path=d, status="no run.json", overrides=overrides))
            continue
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError as exc:
            runs.append(RunRecord(path=d, status="unreadable run.json", overrides=overrides, error=str(exc)))
            continue
        runs.append(
            RunRecord(
                path=d,
                status=str(meta.get("status", "?")),
                config=meta.get("config") or {},
                overrides=overrides,
                records=_read_records(d / "metrics.jsonl"),
                error=meta.get("error"),
                meta=meta,
            )
        )
    return runs


def run_value(run: RunRecord, key: str) -> Any:
    """Value of ``key`` for a run: ``run.json`` config first (a config group gives its ``name``), then overrides."""
    value = _lookup(run.config, key)
    if isinstance(value, Mapping):
        value = value.get("name", _MISSING)
    if value is _MISSING:
        value = run.overrides.get(key, _MISSING)
    return "?" if value is _MISSING else value


# --- expected jobs -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpectedJob:
    """One job of a sweep's cartesian product (``index`` = Hydra's job number)."""

    sweep_dir: Path
    index: int
    overrides: dict[str, Any]

    def describe(self) -> str:
        return ", ".join(f"{k}={canon(v)}" for k, v in self.overrides.items())


def expected_jobs(root: Path) -> list[ExpectedJob]:
    """The jobs every ``multirun.yaml`` below ``root`` asked for, in Hydra's BasicSweeper order."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    jobs: list[ExpectedJob] = []
    for path in sorted(root.rglob("multirun.yaml")):
        try:
            hydra_cfg = (yaml.safe_load(path.read_text()) or {}).get("hydra") or {}
            task = (hydra_cfg.get("overrides") or {}).get("task")
            # As Hydra's BasicSweeper: the sweep params of the config (e.g. an experiment preset's
            # hydra.sweeper.params) first, then the command line's overrides; a key given twice keeps its first
            # position and its last values.
            params = (hydra_cfg.get("sweeper") or {}).get("params") or {}
            arguments = [f"{k}={v}" for k, v in params.items()] + [str(t) for t in task or []]
            by_key: dict[str, list[tuple[str, Any]]] = {}
            for override in parser.parse_overrides(arguments):
                if override.is_delete():
                    continue
                key = override.key_or_group
                if override.is_sweep_override():
                    values = [parser.parse_override(f"{key}={s}").value() for s in override.sweep_string_iterator()]
                else:
                    values = [override.value()]
                by_key[key] = [(key, v) for v in values]
            axes = list(by_key.values())
        except Exception as exc:  # a sweep we cannot expand must not hide the runs we have
            print(
                f"warning: cannot expand the sweep of {path}: {exc}; missing jobs not detected there", file=sys.stderr
            )
            continue
        for index, combo in enumerate(itertools.product(*axes)):
            jobs.append(ExpectedJob(sweep_dir=path.parent, index=index, overrides=dict(combo)))
    return jobs


def _is_under(path: Path, parent: Path) -> bool:
    try:
        path.relative_to(parent)
    except ValueError:
        return False
    return True


def _job_value(run: RunRecord, key: str) -> Any:
    # Matching uses what Hydra actually applied (overrides.yaml) before the validated config, which may differ
    # from the override text (e.g. privacy.delta=null becomes 1/M).
    return run.overrides[key] if key in run.overrides else run_value(run, key)


def missing_jobs(expected: Sequence[ExpectedJob], runs: Sequence[RunRecord]) -> list[ExpectedJob]:
    """Expected jobs that no job directory of their sweep matches (by override values)."""
    missing = []
    for job in expected:
        candidates = [r for r in runs if _is_under(r.path, job.sweep_dir)]
        if not any(all(canon(_job_value(r, k)) == canon(v) for k, v in job.overrides.items()) for r in candidates):
            missing.append(job)
    return missing


# --- grouping ----------------------------------------------------------------------------------------------------


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def detect_column_keys(runs: Sequence[RunRecord], expected: Sequence[ExpectedJob], row_key: str) -> list[str]:
    """Swept keys other than ``row_key`` and ``seed``: override keys whose values differ between jobs.

    Without any overrides (runs started by ``flwr run``), the differing leaves of the runs' configs, leaving out
    keys that are a function of the row value (e.g. ``strategy.server_lr`` when the rows are strategies).
    """
    keys: dict[str, None] = {}
    for job in expected:
        keys.update(dict.fromkeys(job.overrides))
    for run in runs:
        keys.update(dict.fromkeys(run.overrides))
    if keys:
        candidates = [k for k in keys if k != row_key and k not in _NOT_FACTORS and not k.startswith("hydra")]
        result = []
        for key in candidates:
            values = {canon(_job_value(r, key)) for r in runs} | {
                canon(j.overrides[key]) for j in expected if key in j.overrides
            }
            if len(values) > 1:
                result.append(key)
        return result
    flat = [_flatten(r.config) for r in runs if r.config]
    all_keys = dict.fromkeys(k for f in flat for k in f)
    result = []
    for key in all_keys:
        if key in _NOT_FACTORS or key in ("strategy.name", "strategy.target") or key == row_key:
            continue
        if len({canon(f.get(key)) for f in flat}) < 2:
            continue
        by_row: dict[str, set[str]] = {}
        for run, f in zip([r for r in runs if r.config], flat, strict=True):
            by_row.setdefault(canon(run_value(run, row_key)), set()).add(canon(f.get(key)))
        if any(len(v) > 1 for v in by_row.values()):
            result.append(key)
    return result


@dataclass(frozen=True)
class Stat:
    mean: float | None
    std: float | None
    n: int


def _stat(values: Sequence[float]) -> Stat:
    if not values:
        return Stat(None, None, 0)
    return Stat(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None, len(values))


@dataclass
class Cell:
    """The runs (all seeds) of one row value × column combination, and its expected jobs that never ran."""

    row: str
    cols: tuple[str, ...]
    runs: list[RunRecord] = field(default_factory=list)
    missing: list[ExpectedJob] = field(default_factory=list)

    @property
    def completed(self) -> list[RunRecord]:
        return [r for r in self.runs if r.ok]

    @property
    def n_expected(self) -> int:
        return len(self.runs) + len(self.missing)

    @property
    def n_failed(self) -> int:
        return len(self.runs) - len(self.completed)

    def values(self, metric: str) -> list[float]:
        return [v for r in self.completed if (v := r.metric(metric)) is not None]

    def stat(self, metric: str) -> Stat:
        return _stat(self.values(metric))


@dataclass
class Report:
    row_key: str
    col_keys: list[str]
    rows: list[str]
    combos: list[tuple[str, ...]]
    cells: dict[tuple[str, tuple[str, ...]], Cell]
    runs: list[RunRecord]
    missing: list[ExpectedJob]

    def cell(self, row: str, combo: tuple[str, ...]) -> Cell | None:
        return self.cells.get((row, combo))

    def groups(self) -> list[Cell]:
        """Non-empty cells in table order (rows, then column combinations)."""
        return [c for r in self.rows for combo in self.combos if (c := self.cells.get((r, combo))) is not None]

    def label(self, cell: Cell) -> str:
        return " | ".join([cell.row, *_combo_labels(self.col_keys, cell.cols)])


def _sweep_value(job: ExpectedJob, key: str, runs: Sequence[RunRecord]) -> Any:
    """A missing job's value of ``key``: its override, else the value all runs of its sweep share."""
    if key in job.overrides:
        return job.overrides[key]
    if key == "strategy" or key.endswith(".name"):
        group = key.removesuffix(".name")
        if group in job.overrides:
            return job.overrides[group]
    values = {canon(run_value(r, key)) for r in runs if _is_under(r.path, job.sweep_dir)}
    return values.pop() if len(values) == 1 else "?"


def _ordered(values: Iterable[str]) -> list[str]:
    unique = list(dict.fromkeys(values))
    numbers = [_as_number(v) for v in unique]
    if unique and all(n is not None for n in numbers):
        return [v for _, v in sorted(zip(numbers, unique, strict=True), key=lambda t: t[0])]
    return unique


def group_runs(
    runs: Sequence[RunRecord],
    missing: Sequence[ExpectedJob],
    row_key: str,
    col_keys: Sequence[str],
    expected: Sequence[ExpectedJob] = (),
) -> Report:
    """Put every run and every missing job into its (row value, column combination) cell.

    Row and column values are ordered numerically when they are all numbers, else in sweep order (the order of the
    ``multirun.yaml`` overrides, then of the job directories).
    """
    cells: dict[tuple[str, tuple[str, ...]], Cell] = {}
    order_rows: list[str] = []
    order_cols: list[list[str]] = [[] for _ in col_keys]

    def key_of(values: Sequence[str]) -> tuple[str, tuple[str, ...]]:
        order_rows.append(values[0])
        for i, v in enumerate(values[1:]):
            order_cols[i].append(v)
        return values[0], tuple(values[1:])

    for job in expected:  # sweep order first, for the ordering of values only
        key_of([canon(_sweep_value(job, k, runs)) for k in (row_key, *col_keys)])
    for run in runs:
        k = key_of([canon(run_value(run, key)) for key in (row_key, *col_keys)])
        cells.setdefault(k, Cell(k[0], k[1])).runs.append(run)
    for job in missing:
        k = key_of([canon(_sweep_value(job, key, runs)) for key in (row_key, *col_keys)])
        cells.setdefault(k, Cell(k[0], k[1])).missing.append(job)
    rows = _ordered(order_rows)
    col_orders = [_ordered(o) for o in order_cols]
    present = {combo for _, combo in cells}
    combos = [c for c in itertools.product(*col_orders) if c in present]
    rows = [r for r in rows if any((r, c) in cells for c in combos)]
    return Report(row_key, list(col_keys), rows, combos, cells, list(runs), list(missing))


# --- markdown and CSV --------------------------------------------------------------------------------------------


def _short_keys(keys: Sequence[str]) -> list[str]:
    short = [k.rsplit(".", 1)[-1] for k in keys]
    return short if len(set(short)) == len(short) else list(keys)


def _combo_labels(keys: Sequence[str], combo: Sequence[str]) -> list[str]:
    return [f"{k}={v}" for k, v in zip(_short_keys(keys), combo, strict=True)]


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
    stat = _stat(values)
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
        where = job.sweep_dir if root is None else _rel(job.sweep_dir, root)
        lines.append(f"- **MISSING** {job.describe()}: job {job.index} of sweep `{where}` has no job directory")
    for run in report.runs:
        if run.ok:
            continue
        where = run.path if root is None else _rel(run.path, root)
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


def _rel(path: Path, root: Path) -> str:
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
        prefix = ", ".join(_combo_labels(report.col_keys, combo))
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
        w.writerow([report.row_key, *report.col_keys, "metric", "unit", "mean", "std", *_COUNT_COLUMNS, "cell"])
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
        w.writerow(["path", "status", *keys, *_RUN_METRICS, "epsilon", "rounds", "error"])
        for run in report.runs:
            path = str(run.path) if root is None else _rel(run.path, root)
            metrics = [run.metric(m) for m in _RUN_METRICS]
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
            path = str(job.sweep_dir) if root is None else _rel(job.sweep_dir, root)
            values = [canon(_sweep_value(job, k, report.runs)) for k in keys]
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
                        str(run.path) if root is None else _rel(run.path, root),
                        *values,
                        record.get("round"),
                        *["" if v is None else repr(v) for v in cells],
                    ]
                )
    return path


# --- plots -------------------------------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _integer_locator() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def round_series(runs: Sequence[RunRecord], key: str) -> tuple[list[int], list[float], list[float]]:
    """Per round: mean and sample std (0 for one run) of ``key`` over the runs that have it at that round."""
    by_round: dict[int, list[float]] = {}
    for run in runs:
        for r in run.records:
            if _finite(r.get(key)):
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
    plt = _pyplot()
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
    plt = _pyplot()
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
                if not _finite(value):
                    norms = [v for v in rec.get("client_norms") or [] if _finite(v)]
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
    return report.col_keys[0] if all(_as_number(c[0]) is not None for c in report.combos) else None


def plot_ablation(report: Report, path: Path) -> Path:
    """Best test accuracy (mean ± std over seeds) against the single numeric column key, one line per row."""
    key = ablation_key(report)
    if key is None:
        raise ValueError("an ablation plot needs exactly one numeric column key")
    plt = _pyplot()
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


# --- CLI ---------------------------------------------------------------------------------------------------------


def build_report(root: Path, row_key: str = "strategy", col_keys: Sequence[str] | None = None) -> Report:
    """Collect, match against the sweep's expected jobs, and group."""
    runs = collect_runs(root)
    expected = expected_jobs(root)
    missing = missing_jobs(expected, runs)
    cols = detect_column_keys(runs, expected, row_key) if col_keys is None else list(col_keys)
    return group_runs(runs, missing, row_key, cols, expected)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fl_app.report",
        description="Sweep report: markdown/CSV table in the papers' layout and plots.",
    )
    parser.add_argument("root", type=Path, help="a sweep directory (multirun/...) or any directory of runs")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: <root>/report)")
    parser.add_argument("--rows", default="strategy", help="key whose values are the rows (default: strategy)")
    parser.add_argument(
        "--cols", nargs="*", default=None, help="column keys (default: every swept key but the row key and seed)"
    )
    parser.add_argument("--title", default=None, help="title line of table.md")
    parser.add_argument("--audit", action="store_true", help="add the canary audit's columns (runs with canaries)")
    args = parser.parse_args(argv)
    root: Path = args.root
    if not root.is_dir():
        print(f"error: {root} is not a directory", file=sys.stderr)
        return 1
    report = build_report(root, args.rows, args.cols)
    if not report.runs:
        extra = f" ({len(report.missing)} job(s) expected by multirun.yaml, none ran)" if report.missing else ""
        print(f"error: no runs (run.json or .hydra/overrides.yaml) below {root}{extra}", file=sys.stderr)
        return 1
    out_dir: Path = args.out or root / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = (*METRICS, *AUDIT_METRICS) if args.audit else METRICS
    markdown = to_markdown(report, args.title or f"Sweep {root}", root, metrics)
    (out_dir / "table.md").write_text(markdown)
    write_csv(report, out_dir, root, metrics)
    write_rounds_csv(report, out_dir, root)
    try:
        plots = write_plots(report, out_dir)
    except ImportError as exc:
        print(f"warning: plots skipped ({exc}); install matplotlib", file=sys.stderr)
        plots = []
    print(markdown, end="")
    print(f"wrote table.md, table.csv, runs.csv, rounds.csv and {len(plots)} plot(s) to {out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
