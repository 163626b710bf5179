"""Runs grouped into the table's cells: one row per value of the row key, one column group per combination of
the column keys, the seeds of a cell together (:class:`Report`)."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_app.config import flat_settings
from fl_app.report.runs import (
    ExpectedJob,
    RunRecord,
    as_number,
    canon,
    collect_runs,
    expected_jobs,
    is_under,
    job_value,
    missing_jobs,
    run_value,
)

# Overrides that differ between jobs without being an experimental factor.
NOT_FACTORS = frozenset({"seed", "output_dir", "resume"})


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
        candidates = [k for k in keys if k != row_key and k not in NOT_FACTORS and not k.startswith("hydra")]
        result = []
        for key in candidates:
            values = {canon(job_value(r, key)) for r in runs} | {
                canon(j.overrides[key]) for j in expected if key in j.overrides
            }
            if len(values) > 1:
                result.append(key)
        return result
    flat = [flat_settings(r.config) for r in runs if r.config]
    all_keys = dict.fromkeys(k for f in flat for k in f)
    result = []
    for key in all_keys:
        if key in NOT_FACTORS or key in ("strategy.name", "strategy.target") or key == row_key:
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


def mean_std(values: Sequence[float]) -> Stat:
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
        return mean_std(self.values(metric))


def _short_keys(keys: Sequence[str]) -> list[str]:
    short = [k.rsplit(".", 1)[-1] for k in keys]
    return short if len(set(short)) == len(short) else list(keys)


def combo_labels(keys: Sequence[str], combo: Sequence[str]) -> list[str]:
    return [f"{k}={v}" for k, v in zip(_short_keys(keys), combo, strict=True)]


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
        return " | ".join([cell.row, *combo_labels(self.col_keys, cell.cols)])


def sweep_value(job: ExpectedJob, key: str, runs: Sequence[RunRecord]) -> Any:
    """A missing job's value of ``key``: its override, else the value all runs of its sweep share."""
    if key in job.overrides:
        return job.overrides[key]
    if key == "strategy" or key.endswith(".name"):
        group = key.removesuffix(".name")
        if group in job.overrides:
            return job.overrides[group]
    values = {canon(run_value(r, key)) for r in runs if is_under(r.path, job.sweep_dir)}
    return values.pop() if len(values) == 1 else "?"


def ordered(values: Iterable[str]) -> list[str]:
    unique = list(dict.fromkeys(values))
    numbers = [as_number(v) for v in unique]
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
        key_of([canon(sweep_value(job, k, runs)) for k in (row_key, *col_keys)])
    for run in runs:
        k = key_of([canon(run_value(run, key)) for key in (row_key, *col_keys)])
        cells.setdefault(k, Cell(k[0], k[1])).runs.append(run)
    for job in missing:
        k = key_of([canon(sweep_value(job, key, runs)) for key in (row_key, *col_keys)])
        cells.setdefault(k, Cell(k[0], k[1])).missing.append(job)
    rows = ordered(order_rows)
    col_orders = [ordered(o) for o in order_cols]
    present = {combo for _, combo in cells}
    combos = [c for c in itertools.product(*col_orders) if c in present]
    rows = [r for r in rows if any((r, c) in cells for c in combos)]
    return Report(row_key, list(col_keys), rows, combos, cells, list(runs), list(missing))


def build_report(root: Path, row_key: str = "strategy", col_keys: Sequence[str] | None = None) -> Report:
    """Collect, match against the sweep's expected jobs, and group."""
    runs = collect_runs(root)
    expected = expected_jobs(root)
    missing = missing_jobs(expected, runs)
    cols = detect_column_keys(runs, expected, row_key) if col_keys is None else list(col_keys)
    return group_runs(runs, missing, row_key, cols, expected)
