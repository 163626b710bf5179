"""Atomic checkpoints of a run, and resuming from them.

One file, ``<output_dir>/checkpoint.npz``, written through a temp file + ``os.replace`` so a crash (even SIGKILL)
leaves either the previous checkpoint or the new one, never a torn file. It holds the global model after the
checkpointed round, the strategy's state (accountant history, or the rounds of a GDP bound, and the previous global
model where a strategy needs it) and the config the run was started with.

Random state: no generator state is saved. Under seeded randomness every draw is a pure function of
(seed, round, purpose[, client]) (``fl_app.instructions`` streams), so a resumed round draws exactly what the
interrupted one did. Under secure randomness draws come from the OS CSPRNG and cannot be replayed, so the strategy's
state keeps what a resume needs instead: the keys drawn once at the start (the canary audit's ``audit_key``,
DP-FTRL's ``participation_key``), DP-FTRL's participation record and noise buffers, and the randomness the checkpoint
was made with (``randomness``); rounds re-run after it are new releases (docs/running.md, "Checkpoints";
docs/PRIVACY.md, 2). The ``"rng"`` note written into the file describes the seeded case only.
"""

from __future__ import annotations

import difflib
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fl_app.config import AppConfig, config_differences, upgrade_stored_config, validate
from fl_app.core.atomic import atomic_write
from fl_app.releases import RELEASES_FILE

CHECKPOINT_FILE = "checkpoint.npz"
FORMAT_VERSION = 1


@dataclass
class Checkpoint:
    round: int
    weights: list[np.ndarray]
    strategy_state: dict[str, Any]
    config: dict[str, Any]
    strategy_arrays: dict[str, list[np.ndarray]] = field(default_factory=dict)


def save_checkpoint(output_dir: Path, ckpt: Checkpoint) -> Path:
    path = output_dir / CHECKPOINT_FILE
    meta = {
        "format": FORMAT_VERSION,
        "round": ckpt.round,
        "strategy_state": ckpt.strategy_state,
        "config": ckpt.config,
        "num_weights": len(ckpt.weights),
        "strategy_arrays": {name: len(arrays) for name, arrays in ckpt.strategy_arrays.items()},
        "rng": "stateless streams of (seed, round, purpose[, client]); nothing to save",
    }
    arrays = {f"w{i:04d}": w for i, w in enumerate(ckpt.weights)}
    for name, values in ckpt.strategy_arrays.items():
        arrays.update({f"s_{name}_{i:04d}": v for i, v in enumerate(values)})
    with atomic_write(path, "wb") as fh:
        np.savez(fh, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    return path


def load_checkpoint(run_dir: Path) -> Checkpoint:
    path = run_dir / CHECKPOINT_FILE
    if not path.exists():
        raise FileNotFoundError(f"no {CHECKPOINT_FILE} in {run_dir}: nothing to resume")
    with np.load(path) as data:
        meta = json.loads(bytes(data["__meta__"]).decode())
        if meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"{path} has checkpoint format {meta.get('format')}, expected {FORMAT_VERSION}")
        weights = [data[f"w{i:04d}"] for i in range(meta["num_weights"])]
        strategy_arrays = {
            name: [data[f"s_{name}_{i:04d}"] for i in range(count)] for name, count in meta["strategy_arrays"].items()
        }
    return Checkpoint(
        round=int(meta["round"]),
        weights=weights,
        strategy_state=meta["strategy_state"],
        config=meta["config"],
        strategy_arrays=strategy_arrays,
    )


def resolve_resume(config: AppConfig) -> AppConfig:
    """With ``resume=<run dir>``: the config the checkpointed run was started with, writing into that directory.

    Other values given alongside ``resume`` are ignored (the run continues exactly as it began); a warning names
    the keys where they differ.
    """
    if config.resume is None:
        return config
    run_dir = Path(config.resume).resolve()
    if not run_dir.exists() and difflib.get_close_matches(config.resume.lower(), ["auto"], cutoff=0.7):
        raise FileNotFoundError(f"resume={config.resume}: no such run directory; did you mean resume=auto?")
    stored = validate(upgrade_stored_config(load_checkpoint(run_dir).config))
    resumed = replace(stored, resume=str(run_dir), output_dir=str(run_dir))
    ignored = config_differences(config, resumed)
    if ignored:
        logging.getLogger(__name__).warning(
            "resume: using the checkpoint's config; ignoring the given values of %s", ", ".join(ignored)
        )
    return resumed


#: Files a run writes into its output directory: any of them there means the directory holds a run.
RUN_FILES = ("run.json", "metrics.jsonl", RELEASES_FILE, CHECKPOINT_FILE)


def held_run(output_dir: Path) -> dict[str, Any] | None:
    """What ``output_dir`` holds of a run (its ``run.json``, or ``{}`` when only other run files are there), or None
    when it holds none."""
    if not any((output_dir / name).exists() for name in RUN_FILES):
        return None
    try:
        return dict(json.loads((output_dir / "run.json").read_text()))
    except (OSError, ValueError):
        return {}


def refuse_held_run(output_dir: Path) -> None:
    """A new run must not write into a directory that holds another: its metrics would follow the other's lines and
    its releases the other's log. Raises ValueError saying how to continue that run instead."""
    held = held_run(output_dir)
    if held is None:
        return
    status = held.get("status", "unknown")
    if status == "completed":
        how = "write elsewhere (in a sweep, resume=auto skips a completed job)"
    else:
        how = f"continue it with resume={output_dir} (resume=auto in a sweep), or write elsewhere"
    raise ValueError(f"output_dir {output_dir} already holds a run (status {status}): {how}")


@dataclass(frozen=True)
class RunStart:
    """How a run begins: its config (``resume`` set to the run directory when it continues a checkpointed run) and
    directory, or ``completed``: ``resume=auto`` found the run there already completed, and nothing is to run."""

    config: AppConfig
    output_dir: Path
    completed: bool = False


def resolve_start(config: AppConfig, default_output_dir: Path) -> RunStart:
    """The run ``config`` asks for, in ``config.output_dir`` (else ``default_output_dir``).

    ``resume=<run dir>``: :func:`resolve_resume`. ``resume=auto`` (a sweep that continues where it stopped, on this
    machine or another): a directory that holds no run starts one; one that holds a completed run is done, and one
    that holds a checkpointed run continues it, provided it was started with this very config (a job of the same
    sweep; its run.json says which), else ValueError naming the keys that differ; a stopped run without a
    checkpoint cannot be continued (ValueError: its releases are logged, and restarting it would hide them).
    """
    if config.resume is not None and config.resume != "auto":
        resumed = resolve_resume(config)
        return RunStart(resumed, Path(str(resumed.output_dir)))
    output_dir = Path(config.output_dir) if config.output_dir else default_output_dir
    if config.resume is None:
        return RunStart(config, output_dir)
    fresh = replace(config, resume=None)
    held = held_run(output_dir)
    if held is None:
        return RunStart(fresh, output_dir)
    status = held.get("status", "unknown")
    has_checkpoint = (output_dir / CHECKPOINT_FILE).exists()
    if status != "completed" and not has_checkpoint:
        raise ValueError(
            f"resume=auto: {output_dir} holds a run (status {status}) without a {CHECKPOINT_FILE}: it cannot be "
            "continued, and the models it released are in its releases.jsonl; move it away to start again"
        )
    raw = held.get("config") or load_checkpoint(output_dir).config
    stored = validate(upgrade_stored_config(raw))
    differ = config_differences(fresh, stored)
    if differ:
        how = (
            "write elsewhere" if status == "completed" else f"continue it with resume={output_dir}, or write elsewhere"
        )
        what = "a completed run" if status == "completed" else "a run"
        raise ValueError(
            f"resume=auto: {output_dir} holds {what} of another config (it differs in {', '.join(differ)}); {how}"
        )
    if status == "completed":
        return RunStart(fresh, output_dir, completed=True)
    return RunStart(resolve_resume(replace(fresh, resume=str(output_dir))), output_dir)
