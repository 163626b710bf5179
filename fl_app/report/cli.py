"""``python -m fl_app.report <sweep dir> [--rows KEY] [--cols KEY ...] [--audit]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fl_app.report.grouping import build_report
from fl_app.report.plots import write_plots
from fl_app.report.tables import AUDIT_METRICS, METRICS, to_markdown, write_csv, write_rounds_csv


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
