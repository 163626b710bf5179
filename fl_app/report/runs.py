"""A sweep's runs and the jobs it expected: ``run.json``, ``metrics.jsonl`` and Hydra's overrides of every job
directory, and the cartesian product ``multirun.yaml`` says the sweep should have run."""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fl_app.metrics import read_metrics

COMPLETED_STATUSES = ("completed", "stopped")
_MISSING: Any = object()


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


def as_number(text: str) -> float | None:
    try:
        f = float(text)
    except ValueError:
        return None
    return f if math.isfinite(f) else None


def lookup(config: Mapping[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def natural(text: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


def parse_overrides(lines: Sequence[str]) -> dict[str, Any]:
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
        return [float(r[key]) for r in self.records if is_finite_number(r.get(key))]

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
        return float(value) if is_finite_number(value) else None

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
        return float(value) if is_finite_number(value) else None

    def metric(self, name: str) -> float | None:
        if name.startswith("audit_"):
            value = (self.meta.get("audit") or {}).get(name.removeprefix("audit_"))
            return float(value) if is_finite_number(value) else None
        return getattr(self, name)


def is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_records(path: Path) -> list[dict[str, Any]]:
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
    for d in sorted(dirs, key=lambda p: natural(str(p))):
        overrides_path = d / ".hydra" / "overrides.yaml"
        overrides: dict[str, Any] = {}
        if overrides_path.exists():
            lines = yaml.safe_load(overrides_path.read_text()) or []
            overrides = parse_overrides([str(x) for x in lines])
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
                records=read_records(d / "metrics.jsonl"),
                error=meta.get("error"),
                meta=meta,
            )
        )
    return runs


def run_value(run: RunRecord, key: str) -> Any:
    """Value of ``key`` for a run: ``run.json`` config first (a config group gives its ``name``), then overrides."""
    value = lookup(run.config, key)
    if isinstance(value, Mapping):
        value = value.get("name", _MISSING)
    if value is _MISSING:
        value = run.overrides.get(key, _MISSING)
    return "?" if value is _MISSING else value


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


def is_under(path: Path, parent: Path) -> bool:
    try:
        path.relative_to(parent)
    except ValueError:
        return False
    return True


def job_value(run: RunRecord, key: str) -> Any:
    # Matching uses what Hydra actually applied (overrides.yaml) before the validated config, which may differ
    # from the override text (e.g. privacy.delta=null becomes 1/M).
    return run.overrides[key] if key in run.overrides else run_value(run, key)


def missing_jobs(expected: Sequence[ExpectedJob], runs: Sequence[RunRecord]) -> list[ExpectedJob]:
    """Expected jobs that no job directory of their sweep matches (by override values)."""
    missing = []
    for job in expected:
        candidates = [r for r in runs if is_under(r.path, job.sweep_dir)]
        if not any(all(canon(job_value(r, k)) == canon(v) for k, v in job.overrides.items()) for r in candidates):
            missing.append(job)
    return missing
