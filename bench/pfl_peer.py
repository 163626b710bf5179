"""The peer in the benchmark: the app's run replayed in pfl-research (Apple; PyPI ``pfl``).

``python -m bench.pfl_peer [hydra overrides] --rounds T --out DIR [--procs P] [--check]``

1. **pfl's own environment.** pfl pins its own torch and NumPy, so it runs from a virtualenv of its own:
   ``.bench-peer/pfl-venv`` with ``pfl[pytorch]==0.6.0`` (made on first use; ``--pfl-python`` names another
   interpreter that has pfl, e.g. on a machine without a registry).
2. **A replay written by the app's code** (:func:`write_replay`): for each round the app's sampled clients
   (:func:`bench.baseline.sampled_partitions`), each client's rows (the app's partition) and one permutation per
   local epoch from the app's shuffle stream (:func:`bench.baseline.shuffle_generator`, drawn exactly as
   :func:`bench.baseline.local_train` draws them), the initial weights, and the hyperparameters.
3. **pfl's side** (bench/pfl_worker.py) trains it under ``torchrun`` with P processes of one torch thread each —
   pfl's recommended CPU set-up — with its balanced cohort sampler, its Gaussian mechanism and its FedAvg.
4. **The same local step** (``step="app"``, :data:`STEPS`): the replay trains with what the app's workers train
   with — the model in the app's compute layout (:func:`fl_app.models.to_compute_layout`: channels-last on a CPU,
   ~1.3× faster a step there), glibc keeping freed memory (:func:`fl_app.allocator.keep_freed_memory`: no page
   faults a step) and the app's SGD kernels (:func:`clients.training.sgd_kernels`) — so that a timing compares the
   frameworks around the step, not two steps. ``step="torch_defaults"`` is pfl as a user would write it without
   them (NCHW, glibc's defaults, ``torch.optim.SGD``'s default kernels): what those choices are worth.

``--check`` (σ forced to 0, 2 rounds) compares pfl's final model with bench/baseline.py's (the app's plain-loop
reference, equal to the app bit for bit by
``tests/integration/test_simulation.py::test_app_equals_the_plain_pytorch_loop``): both sides must agree to float
tolerance, so the timing compares the same computation. Fixed-size sampling only (pfl's cohort size is
a constant), server-side noise, fixed clipping, dense updates: the DP-FedAvg / DP-FedSAM configurations.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.baseline import (
    check_supported,
    denominator,
    local_steps,
    partition_indices,
    sampled_partitions,
    shuffle_generator,
)
from bench.processes import ROOT, THREAD_ENV
from clients.training import sgd_kernels
from fl_app.config import AppConfig, compose_config
from fl_app.data.datasets import DATASETS, load_dataset
from fl_app.models import build_model_for_dataset, get_weights

PFL_REQUIREMENT = "pfl[pytorch]==0.6.0"
PEER_DIR = ROOT / ".bench-peer"
#: Max |Δw| between pfl's and the reference's final models after 2 noiseless rounds: the two sum the cohort in
#: different orders and precisions (pfl float32 per worker, the reference float64), so agreement is to float
#: tolerance, not bit for bit.
EQUIVALENCE_ATOL = 1e-5
#: The local steps a replay can train with (module docstring, item 4).
STEPS = ("app", "torch_defaults")


def ensure_pfl_python(venv: Path = PEER_DIR / "pfl-venv") -> Path:
    """The Python of pfl's own virtualenv, made (``pip install pfl[pytorch]==0.6.0``) if missing."""
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    if not stamp.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", PFL_REQUIREMENT], check=True)
        stamp.touch()
    return python


def check_peer_supported(config: AppConfig) -> bool:
    """Whether the run uses SAM; ValueError for what the replay does not cover."""
    use_sam, private = check_supported(config)
    if config.privacy.sampling != "fixed":
        raise ValueError("the pfl replay needs privacy.sampling=fixed (pfl's cohort size is a constant)")
    if private and config.privacy.clipping != "fixed":
        raise ValueError("the pfl replay covers privacy.clipping=fixed")
    return use_sam


def replay_step(step: str) -> dict[str, Any]:
    """What the pfl worker trains with under ``step`` (:data:`STEPS`): the compute layout, the allocator setting
    and the SGD kernels' keyword per device type."""
    if step not in STEPS:
        raise ValueError(f"step must be one of {STEPS}, got {step!r}")
    app = step == "app"
    kernels = {kind: sgd_kernels(kind) if app else {} for kind in ("cpu", "cuda")}
    return {"name": step, "compute_layout": app, "keep_freed_memory": app, "sgd_kernels": kernels}


def write_replay(config: AppConfig, num_rounds: int, out: Path, step: str = "app") -> dict[str, Any]:
    """Write ``replay.json`` and ``replay.npz`` into ``out`` (see the module docstring); returns the JSON spec."""
    step_spec = replay_step(step)
    use_sam = check_peer_supported(config)
    _, private = check_supported(config)
    d, c, p = config.dataset, config.client, config.privacy
    train, _ = load_dataset(d.name, d.data_dir, download=d.download)
    model = build_model_for_dataset(config.model.name, d.name, seed=config.seed)
    weights = get_weights(model)
    if [tuple(w.shape) for w in weights] != [tuple(q.shape) for q in model.parameters()]:
        raise ValueError("the replay exchanges parameters only; this model has buffers")
    info = DATASETS[d.name]
    users: list[dict[str, Any]] = []
    arrays: dict[str, np.ndarray] = {f"w{i}": w for i, w in enumerate(weights)}
    rows_used: dict[int, int] = {}
    for t in range(1, num_rounds + 1):
        for pid in sampled_partitions(config, t):
            indices = partition_indices(config, pid)
            for row in indices.tolist():
                rows_used.setdefault(int(row), len(rows_used))
            generator = shuffle_generator(config, t, pid)
            n = len(indices)
            perms = np.stack([torch.randperm(n, generator=generator).numpy() for _ in range(c.local_epochs)])
            uid = f"r{t}c{pid}"
            arrays[f"rows_{uid}"] = np.array([rows_used[int(r)] for r in indices.tolist()], dtype=np.int64)
            arrays[f"perms_{uid}"] = perms.astype(np.int64).reshape(c.local_epochs, n)
            users.append({"uid": uid, "round": t, "partition": pid, "samples": n, "steps": local_steps(n, config)})
    order = torch.tensor(sorted(rows_used, key=rows_used.__getitem__), dtype=torch.long)
    arrays["x"] = train.x[order].numpy()
    arrays["y"] = train.y[order].to(torch.int64).numpy()
    spec = {
        "model": {
            "name": config.model.name,
            "kwargs": {"num_classes": info.num_classes, "in_channels": info.in_channels, "image_size": info.image_size},
            "shapes": [list(w.shape) for w in weights],
        },
        "config": {
            "num_rounds": num_rounds,
            "cohort_size": int(denominator(config)),
            "lr": c.lr,
            "lr_decay": c.lr_decay,
            "momentum": c.momentum,
            "weight_decay": c.weight_decay,
            "batch_size": c.batch_size,
            "local_epochs": c.local_epochs,
            "use_sam": use_sam,
            "rho": c.rho,
            "adaptive": c.adaptive,
            "private": private,
            "clip_norm": p.clip_norm,
            "noise_multiplier": p.noise_multiplier,
            "server_lr": config.strategy.server_lr,
            "step": step_spec,
        },
        "users": users,
    }
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "replay.npz", **arrays)
    (out / "replay.json").write_text(json.dumps(spec) + "\n")
    return spec


def pfl_command(python: Path | str, procs: int, replay: Path, result: Path) -> list[str]:
    """``torchrun`` (as ``python -m torch.distributed.run``) of bench/pfl_worker.py on ``procs`` processes."""
    worker = str(ROOT / "bench" / "pfl_worker.py")
    return [
        str(python), "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
        worker, str(replay), str(result),
    ]  # fmt: skip


def pfl_env(threads: int, device: str) -> dict[str, str]:
    """The pfl workers' environment: the project on PYTHONPATH (for the model class), threads pinned."""
    env = dict(os.environ)
    env.update(THREAD_ENV)
    env["PEER_TORCH_THREADS"] = str(threads)
    env["PFL_PYTORCH_DEVICE"] = device
    # PFL_SITE: a folder with pfl and its pure-Python needs, for a machine where pfl is carried as wheels.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PFL_SITE", ""), str(ROOT), env.get("PYTHONPATH", "")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_pfl(
    python: Path | str, replay: Path, result: Path, procs: int = 2, threads: int = 1, device: str = "cpu"
) -> dict[str, Any]:
    """Run the replay in pfl; returns the worker's summary plus ``command_start_unix`` and its final weights."""
    log = result.with_suffix(".log")
    start = time.time()
    with log.open("wb") as fh:
        proc = subprocess.run(
            pfl_command(python, procs, replay, result),
            cwd=ROOT, env=pfl_env(threads, device), stdout=fh, stderr=subprocess.STDOUT, timeout=3600,
        )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"pfl run failed ({proc.returncode}); see {log}:\n{log.read_text(errors='replace')[-3000:]}")
    summary = dict(json.loads(result.read_text()))
    summary["command_start_unix"] = start
    with np.load(summary["weights_file"]) as saved:
        summary["weights"] = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    return summary


def check_equivalence(config: AppConfig, python: Path | str, work: Path, procs: int = 2) -> float:
    """Max |Δw| between pfl's model and the reference loop's after 2 rounds with σ = 0 (see the docstring)."""
    from dataclasses import replace

    from bench.baseline import run_baseline

    noiseless = replace(config, privacy=replace(config.privacy, noise_multiplier=0.0))
    write_replay(noiseless, 2, work / "replay_check")
    peer = run_pfl(python, work / "replay_check", work / "pfl_check.json", procs=procs)
    reference = run_baseline(noiseless, num_rounds=2)
    return max(float(np.max(np.abs(a - b))) for a, b in zip(peer["weights"], reference.weights, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of conf/config.yaml, as for apps.main")
    parser.add_argument("--rounds", type=int, default=None, help="rounds to replay (default: num_rounds)")
    parser.add_argument("--procs", type=int, default=2, help="pfl worker processes (torchrun)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per pfl worker")
    parser.add_argument("--device", default="cpu", help="pfl's device (PFL_PYTORCH_DEVICE)")
    parser.add_argument("--pfl-python", default=None, help="an interpreter with pfl (default: make the venv)")
    parser.add_argument("--check", action="store_true", help="σ = 0, 2 rounds: compare with bench.baseline")
    parser.add_argument("--out", type=Path, required=True, help="folder for the replay and the result")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    config = compose_config(args.overrides)
    python = args.pfl_python or ensure_pfl_python()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.check:
        gap = check_equivalence(config, python, args.out, procs=args.procs)
        ok = gap <= EQUIVALENCE_ATOL
        print(json.dumps({"max_abs_diff": gap, "atol": EQUIVALENCE_ATOL, "equivalent": ok}))
        return 0 if ok else 1
    rounds = args.rounds or config.num_rounds
    write_replay(config, rounds, args.out / "replay")
    summary = run_pfl(python, args.out / "replay", args.out / "pfl.json", args.procs, args.threads, args.device)
    summary.pop("weights")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
