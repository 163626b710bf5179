"""One markdown row per run of a sweep: ``python -m fl_app.report.summary <sweep or runs dir>``.

Every job directory :func:`~fl_app.report.runs.collect_runs` finds (``run.json`` with its ``metrics.jsonl``, or a
Hydra job that never wrote one): strategy, status, rounds, the last round's test accuracy and ε, and the run's
stated DP guarantee. Runs that failed or never finished are listed as such.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from fl_app.report.runs import collect_runs


def summarize(root: Path) -> list[dict[str, Any]]:
    rows = []
    for run in collect_runs(root):
        last = run.records[-1] if run.records else {}
        rows.append(
            {
                "run": str(run.path.relative_to(root)),
                "strategy": run.config.get("strategy", {}).get("name", "?"),
                "status": run.status,
                "rounds": len(run.records),
                "test_accuracy": last.get("test_accuracy"),
                "epsilon": last.get("epsilon"),
                "dp_guarantee": run.meta.get("dp_guarantee", "?"),
            }
        )
    return rows


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def to_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| strategy | status | rounds | test accuracy | ε | DP guarantee |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['strategy']} | {r['status']} | {r['rounds']} | {_fmt(r['test_accuracy'], '.4f')} | "
            f"{_fmt(r['epsilon'], '.3f')} | {r['dp_guarantee']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fl_app.report.summary", description=__doc__)
    parser.add_argument("root", type=Path, help="a sweep directory (multirun/...) or a directory of runs")
    args = parser.parse_args(argv)
    rows = summarize(args.root)
    if not rows:
        print(f"no run.json below {args.root}", file=sys.stderr)
        return 1
    print(to_markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
