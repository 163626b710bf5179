"""One markdown row per run of a sweep: ``python -m fl_app.summary <sweep or runs dir>``.

Reads every ``run.json`` below the directory (with its ``metrics.jsonl``) and prints strategy, status, rounds, the
final test accuracy, ε and the run's stated DP guarantee. Runs that failed or never finished are listed as such.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from fl_app.metrics import read_metrics


def summarize(root: Path) -> list[dict[str, Any]]:
    rows = []
    for meta_path in sorted(root.rglob("run.json")):
        meta = json.loads(meta_path.read_text())
        metrics_path = meta_path.parent / "metrics.jsonl"
        records = read_metrics(metrics_path) if metrics_path.exists() else []
        last = records[-1] if records else {}
        rows.append(
            {
                "run": str(meta_path.parent.relative_to(root)),
                "strategy": meta.get("config", {}).get("strategy", {}).get("name", "?"),
                "status": meta.get("status", "?"),
                "rounds": len(records),
                "test_accuracy": last.get("test_accuracy"),
                "epsilon": last.get("epsilon"),
                "dp_guarantee": meta.get("dp_guarantee", "?"),
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
    parser = argparse.ArgumentParser(description=__doc__)
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
