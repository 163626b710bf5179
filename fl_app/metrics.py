"""Per-round metrics: one JSON line per round (``metrics.jsonl``), run metadata (``run.json``), and a progress line.

The record's fields are listed in :data:`ROUND_FIELDS` (and in docs/running.md, "Metrics"); the norm statistics
(pre-clip ‖Δ‖ mean, median, max, ᾱ and α̃ of journal Eq. 18, fraction clipped) feed the norm histogram of journal
Fig. 4.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Mapping
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.common.logger import log

from fl_app.core.atomic import atomic_write
from fl_app.privacy.mechanisms import CLIPPING_STATS_KEYS

#: The operator's own per-round record of client counts (sampled, answered, rejected) when the run publishes no
#: raw client statistics: outside ε, kept beside the published files but never to be published (docs/PRIVACY.md).
OPERATOR_FILE = "operator_counts.jsonl"

#: Counts of clients per round (outside ε: under Poisson sampling the number of participants is part of what
#: amplification assumes secret). Published only with ``privacy.client_statistics=raw``; otherwise they go to the
#: operator's own record, :data:`OPERATOR_FILE`.
CLIENT_COUNTS = (
    "sampled",
    "received",
    "aggregated",
    "failed",
    "rejected_malformed",
    "rejected_nonfinite",
    "rejected_shape",
    "reclipped",
)

ROUND_FIELDS = (
    "round",
    *CLIENT_COUNTS,
    "train_loss",
    "train_accuracy",
    "test_loss",
    "test_accuracy",
    "epsilon",
    "delta",
    "noise_multiplier",
    "gdp_mu",
    *CLIPPING_STATS_KEYS,
    "client_norms",
    "wall_time_s",
    "clients_phase_s",
    "aggregate_s",
    # Wall-clock stamps (seconds since the epoch): the earliest client fit entry and first local step of the
    # round, and when the round's record was written. They profile startup and steady state (bench/).
    "first_fit_started_unix",
    "first_train_started_unix",
    "finished_unix",
)


def _jsonable(value: Any) -> Any:
    """NaN/Inf are not JSON; write them as null so every line parses with any JSON reader."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    """Write JSON through a temp file + rename so a crash never leaves a half-written file."""
    with atomic_write(path) as fh:
        json.dump(_jsonable(dict(payload)), fh, indent=2, sort_keys=True)


class MetricsWriter:
    """Appends one JSON line per round to ``<output_dir>/metrics.jsonl`` and shows progress.

    On a terminal a rich progress bar shows the round, test accuracy and ε, with one printed line per round above
    it; Flower's INFO console logging is held back meanwhile (warnings still show) so the bar stays readable.
    Elsewhere (files, CI, ``flwr run --stream``) each round is one INFO log line.
    """

    def __init__(self, output_dir: Path, num_rounds: int, progress: bool | None = None) -> None:
        self.output_dir = output_dir
        self.path = output_dir / "metrics.jsonl"
        self.operator_path = output_dir / OPERATOR_FILE
        self.num_rounds = num_rounds
        output_dir.mkdir(parents=True, exist_ok=True)
        self._progress = None
        self._quieted: list[tuple[logging.Handler, int]] = []
        self._show_bar = sys.stderr.isatty() if progress is None else progress
        self._started = False

    def start(self) -> None:
        """Show the progress bar (on a terminal) and hold Flower's INFO console lines back, from now until
        :meth:`close`: the run calls it once its rounds begin, so that whatever starts before them (Ray, the
        engine) logs as usual. The first :meth:`write` starts it otherwise; later calls do nothing."""
        if self._started:
            return
        self._started = True
        if self._show_bar:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("round {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("{task.fields[status]}"),
                TimeElapsedColumn(),
            )
            self._task = self._progress.add_task("rounds", total=self.num_rounds, status="")
            for handler in logging.getLogger("flwr").handlers:
                if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                    self._quieted.append((handler, handler.level))
                    handler.setLevel(max(handler.level, logging.WARNING))
            self._progress.start()

    def truncate_after(self, last_round: int) -> None:
        """Drop the lines of rounds after ``last_round`` (a resumed run redoes them), atomically."""
        for path in (self.path, self.operator_path):
            if not path.exists():
                continue
            lines = path.read_text().splitlines(keepends=True)
            # A torn last line (killed mid-write) belongs to a round that is redone.
            kept = [line for line in lines if line.endswith("\n") and json.loads(line)["round"] <= last_round]
            with atomic_write(path) as fh:
                fh.write("".join(kept))

    def write_operator(self, record: Mapping[str, Any]) -> None:
        """Append the round's client counts to the operator's own record (:data:`OPERATOR_FILE`)."""
        with self.operator_path.open("a") as fh:
            fh.write(json.dumps(_jsonable(dict(record))) + "\n")

    def write(self, record: Mapping[str, Any]) -> None:
        self.start()
        line = json.dumps(_jsonable(dict(record)), sort_keys=False)
        with self.path.open("a") as fh:
            fh.write(line + "\n")
        status = format_status(record)
        if self._progress is not None:
            self._progress.console.print(
                f"[round {record['round']}/{self.num_rounds}] {status}", highlight=False, markup=False
            )
            self._progress.update(self._task, completed=record["round"], status=_short_status(record))
        else:
            log(INFO, "[round %d/%d] %s", record["round"], self.num_rounds, status)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        for handler, level in self._quieted:
            handler.setLevel(level)
        self._quieted = []


def _short_status(record: Mapping[str, Any]) -> str:
    acc, eps = record.get("test_accuracy"), record.get("epsilon")
    acc_s = "-" if acc is None or (isinstance(acc, float) and math.isnan(acc)) else f"{acc:.4f}"
    return f"acc {acc_s} | eps {'-' if eps is None else f'{eps:.3f}'}"


def format_status(record: Mapping[str, Any]) -> str:
    def fmt(key: str, spec: str) -> str:
        value = record.get(key)
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)

    # Client counts are in the record only when the run publishes raw client statistics.
    clients = f"clients {record['aggregated']}/{record['sampled']} | " if "sampled" in record else ""
    return (
        f"test acc {fmt('test_accuracy', '.4f')} | test loss {fmt('test_loss', '.4f')} | "
        f"train acc {fmt('train_accuracy', '.4f')} | eps {fmt('epsilon', '.3f')} | "
        f"{clients}{fmt('wall_time_s', '.1f')}s"
    )


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` file back (one dict per round)."""
    with path.open() as fh:
        return [json.loads(line) for line in fh if line.strip()]
