"""The sweep summary lists every run, finished or not."""

from __future__ import annotations

import json
from pathlib import Path

from fl_app.report.summary import main, summarize


def _run(root: Path, name: str, status: str, records: list[dict], guarantee: str) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(
        json.dumps({"status": status, "dp_guarantee": guarantee, "config": {"strategy": {"name": name}}})
    )
    if records:
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_summary_lists_completed_and_failed_runs(tmp_path: Path, capsys) -> None:
    _run(tmp_path, "dp_fedsam", "completed", [{"round": 1, "test_accuracy": 0.5, "epsilon": 1.2}], "client-level")
    _run(tmp_path, "fedavg", "failed", [], "none: non-private reference")
    rows = {r["strategy"]: r for r in summarize(tmp_path)}
    assert rows["dp_fedsam"]["test_accuracy"] == 0.5 and rows["dp_fedsam"]["rounds"] == 1
    assert rows["fedavg"]["status"] == "failed" and rows["fedavg"]["rounds"] == 0
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| dp_fedsam | completed | 1 | 0.5000 | 1.200 | client-level |" in out
    assert "| fedavg | failed | 0 | - | - | none: non-private reference |" in out
    assert main([str(tmp_path / "empty")]) == 1
