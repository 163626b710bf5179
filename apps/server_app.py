"""Flower ServerApp: build the strategy and the accountant from the validated config and run the rounds.

Two front doors share :class:`ServerRun`: ``flwr run`` (config from the run-config, composed through Hydra in
:func:`main`, prepared and run there: :func:`run_federated`) and the Hydra entry point :mod:`apps.main` (config
composed on the command line, the run prepared before Ray starts and handed to :func:`make_server_app`).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import time
from dataclasses import dataclass
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result

from apps.engine_watch import watching_the_engine
from fl_app.allocator import limit_malloc_arenas
from fl_app.central_evaluation import central_evaluate_fn
from fl_app.checkpoint import Checkpoint, load_checkpoint, refuse_held_run, resolve_start
from fl_app.config import AppConfig, ConfigError, compose_config, overrides_from_run_config
from fl_app.core.atomic import atomic_write
from fl_app.metrics import MetricsWriter, write_json_atomic
from fl_app.models import build_model_for_dataset, get_weights, weight_names
from fl_app.threads import limit_library_threads
from strategies.auditing import audit_report
from strategies.registry import NamedStrategy, build_strategy
from strategies.settings import is_simulation

RUNS_DIR_ENV = "DPFEDSAM_RUNS_DIR"


def default_output_dir(config: AppConfig) -> Path:
    base = Path(os.environ.get(RUNS_DIR_ENV, "runs"))
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return (base / f"{stamp}-{config.strategy.name}").resolve()


def _save_model_atomic(path: Path, names: list[str], weights: list[np.ndarray]) -> None:
    with atomic_write(path, "wb") as fh:
        np.savez(fh, **dict(zip(names, weights, strict=True)))


class RunFile:
    """``<output_dir>/run.json``, true at every moment: rewritten atomically whenever what the run claims changes —
    at start (settings resolved), after a resume's accounting, after every round's accounting (before that round's
    model can leave the server), and at the end or on a failure. A run killed at any point leaves the ε of every
    model that left the server, with ``status: running`` and the time of the last update."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self.meta = meta

    def update(self, **fields: Any) -> None:
        self.meta.update(fields, updated=dt.datetime.now().isoformat(timespec="seconds"))
        write_json_atomic(self.path, self.meta)


@dataclass
class ServerRun:
    """One run of the ServerApp, set up before it meets a grid: where it writes, the initial model, the checkpoint
    it resumes, the metrics writer, run.json and the strategy — built once, here, so that a config the strategy
    refuses (an unreachable target epsilon, an accountant that does not admit the sampler) fails before Ray starts
    on the Hydra front door (apps/main.py) and before the first message on ``flwr run``'s."""

    config: AppConfig
    output_dir: Path
    started_unix: float
    weight_names: list[str]
    initial: list[np.ndarray]
    checkpoint: Checkpoint | None
    metrics: MetricsWriter
    run_file: RunFile
    strategy: NamedStrategy

    @classmethod
    def prepare(cls, config: AppConfig, output_dir: Path, progress: bool | None = None) -> ServerRun:
        """The run of the validated ``config`` writing into ``output_dir`` (``progress``: a progress bar, default
        on a terminal), its strategy built with the metrics writer, the checkpoint and run.json it keeps true."""
        started_unix = time.time()
        # A no-op where the Hydra entry point did it already; early enough for the threads this run starts.
        limit_malloc_arenas()
        if config.resume is None:
            refuse_held_run(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        model = build_model_for_dataset(config.model.name, config.dataset.name, seed=config.seed)
        initial = get_weights(model)
        checkpoint = load_checkpoint(output_dir) if config.resume else None
        metrics = MetricsWriter(output_dir, config.num_rounds, progress=progress)
        if checkpoint is not None:
            metrics.truncate_after(checkpoint.round)
        run_file = _new_run_file(output_dir, config, started_unix, initial, checkpoint)
        strategy = build_strategy(
            config,
            metrics=metrics,
            checkpoint_dir=output_dir,
            resume_from=checkpoint,
            on_accounted=lambda s: run_file.update(status="running", **s.dp_guarantee()),
        )
        run_file.meta["strategy"] = type(strategy).__name__
        return cls(config, output_dir, started_unix, weight_names(model), initial, checkpoint, metrics, run_file,
                   strategy)  # fmt: skip

    def run(self, grid: Grid) -> Result:
        """Run the rounds on ``grid``; write metrics, run metadata and the final model."""
        strategy, run_file, metrics = self.strategy, self.run_file, self.metrics
        # The server aggregates with NumPy while the workers train: its BLAS threads must not spin on their cores.
        limit_library_threads(torch.get_num_threads())
        log(INFO, "Run output directory: %s", self.output_dir)
        try:
            # Every "auto" setting (noise and sampling source, client statistics) before anything is written.
            strategy.resolve_settings(is_simulation(grid))
        except ConfigError as exc:
            # A refused resume has accounted the releases logged after its checkpoint: run.json keeps stating them.
            run_file.update(status="failed", error=f"{type(exc).__name__}: {exc}", **strategy.dp_guarantee())
            metrics.close()
            raise
        run_file.update(**strategy.dp_guarantee())
        metrics.start()
        try:
            with watching_the_engine():  # a crashed simulation engine fails the run now (apps/engine_watch.py)
                result = strategy.start(grid, ArrayRecord(self.initial), num_rounds=self.config.num_rounds,
                                        timeout=self.config.round_timeout,
                                        evaluate_fn=central_evaluate_fn(self.config))  # fmt: skip
        except BaseException as exc:
            # The ε of everything released before the failure, not the start's.
            run_file.update(status="failed", error=f"{type(exc).__name__}: {exc}", **strategy.dp_guarantee())
            raise
        finally:
            metrics.close()
        final = result.arrays.to_numpy_ndarrays() if len(result.arrays) else self.initial
        _save_model_atomic(self.output_dir / "final_model.npz", self.weight_names, final)
        _finish_run_file(run_file, strategy, result)
        return result


def run_federated(grid: Grid, config: AppConfig, output_dir: Path, progress: bool | None = None) -> Result:
    """Run one federated training with ``config`` on ``grid`` (:class:`ServerRun`, prepared and run)."""
    return ServerRun.prepare(config, output_dir, progress=progress).run(grid)


def _new_run_file(
    output_dir: Path,
    config: AppConfig,
    started_unix: float,
    initial: list[np.ndarray],
    checkpoint: Checkpoint | None,
) -> RunFile:
    """run.json as the run starts: the config, when and where, the model's size, the resume (the strategy's name
    is added once it is built)."""
    run_file = RunFile(
        output_dir / "run.json",
        {
            "config": config.to_dict(),
            "status": "starting",
            "started": dt.datetime.now().isoformat(timespec="seconds"),
            # When the ServerApp began (seconds since the epoch; startup profiling in bench/).
            "started_unix": started_unix,
            "host": platform.node(),
            "num_parameters": int(sum(w.size for w in initial)),
        },
    )
    if checkpoint is not None:
        run_file.meta["resumed_after_round"] = checkpoint.round
    return run_file


def _finish_run_file(run_file: RunFile, strategy: NamedStrategy, result: Result) -> None:
    """run.json as the run ends: stopped (by the budget guard) or completed, the last evaluation, the audit's
    report and the guarantee of everything released."""
    evaluated = result.evaluate_metrics_serverapp
    final_metrics = dict(evaluated[max(evaluated)]) if evaluated else {}
    if (audit := audit_report(strategy.config, strategy.auditor)) is not None:
        run_file.meta["audit"] = audit
    run_file.update(
        status="stopped" if strategy.stop_reason else "completed",
        stop_reason=strategy.stop_reason,
        finished=dt.datetime.now().isoformat(timespec="seconds"),
        rounds_completed=strategy.rounds_completed,
        final=final_metrics,
        **strategy.dp_guarantee(),
    )
    log(INFO, "Final: %s; %s", final_metrics, run_file.meta["dp_guarantee"])


def make_server_app(server_run: ServerRun) -> ServerApp:
    """A ServerApp that runs an already prepared run (the Hydra front door)."""
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        server_run.run(grid)

    return server_app


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """``flwr run`` front door: compose conf/ with the run-config, validate, run."""
    config = compose_config(overrides_from_run_config(context.run_config))
    start = resolve_start(config, Path(config.output_dir) if config.output_dir else default_output_dir(config))
    if start.completed:
        log(INFO, "%s: this run has completed already (resume=auto); nothing to run", start.output_dir)
        return
    run_federated(grid, start.config, start.output_dir)
