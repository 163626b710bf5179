"""One prepared call on a lent GPU: the captured engine's measurements (docs/performance.md, "The captured engine on
one GPU"), each step's result under one output folder of at most eight files.

``python -m bench.gpu_session --out DIR [--data-dir DIR] [--rounds 8] [--tiny]`` runs, in order:

1. the CUDA tests (``pytest -q -k cuda tests/clients tests/bench``; skipped without CUDA) → ``cuda_tests.log``;
2. the worker's round on the app's own cohorts, its limit summed over the round's step shapes, the step's other
   formulations and its top kernels (``bench.captured_step --cohorts app --variants --profile``) → ``step_app.json``;
3. the full-width step's limit on 50 equal clients of 125 images, with its variants (``--cohorts equal
   --variants``) → ``step_equal.json``;
4. the app itself at bench.run's GPU overrides (``simulation.cohort_engine=auto``: the captured engine on a GPU)
   for ``--rounds`` rounds → ``app_metrics.jsonl``;
5. ``summary.json``: the app's round (median of its rounds after the first two) beside the worker's round on the
   app's cohorts and that round's limit, and the ratios the issue asks about (app / worker, worker / limit).

A step that fails is recorded in ``summary.json`` with its error and the session goes on. ``--tiny`` (CI's smoke run,
on the CPU where there is no GPU) runs every step at a tiny size. Sized for one lent-GPU call of under 8 minutes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench import captured_step
from bench.processes import ROOT, THREAD_ENV
from bench.run import GPU_OVERRIDES, _app_run, with_overrides

#: Shrinks every step to a smoke run (``--tiny``): a dozen clients, one local epoch.
TINY_OVERRIDES = ["dataset.max_train_samples=400", "dataset.max_test_samples=100", "dataset.num_clients=12",
                  "privacy.sample_rate=0.6", "client.local_epochs=1", "client.batch_size=8"]  # fmt: skip
TINY_EQUAL = ["--clients", "3", "--samples", "8", "--epochs", "1", "--batch-size", "4"]


def summarize(step_app: dict[str, Any] | None, app: dict[str, Any] | None) -> dict[str, Any]:
    """The app's round against the worker's round on the app's cohorts and against that round's limit."""
    out: dict[str, Any] = {
        "app_round_s": app["round_s"] if app else None,
        "worker_round_s": step_app["worker_round_s"] if step_app else None,
        "round_limit_s": step_app["round_limit_s"] if step_app else None,
    }
    if step_app:
        out["captures_each_round"] = [r["captures"] for r in step_app["captured_rounds"]]
        out["eager_steps_each_round"] = [r["eager_steps"] for r in step_app["captured_rounds"]]
    if app and step_app:
        out["app_over_worker_round"] = app["round_s"] / step_app["worker_round_s"]
    if step_app:
        out["worker_over_limit"] = step_app["worker_round_s"] / step_app["round_limit_s"]
    return out


def _attempt(errors: dict[str, str], name: str, step: Callable[[], Any]) -> Any:
    try:
        return step()
    except Exception as exc:  # one failed measurement must not cost the session's others
        errors[name] = f"{type(exc).__name__}: {exc}"[-2000:]
        return None


def _cuda_tests(out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "cuda", "tests/clients", "tests/bench"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    (out / "cuda_tests.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"the CUDA tests failed ({proc.returncode}); see cuda_tests.log")
    return {"last_line": proc.stdout.strip().splitlines()[-1]}


def _captured_step(out: Path, name: str, args: list[str]) -> dict[str, Any]:
    if captured_step.main([*args, "--out", str(out / name)]) != 0:
        raise RuntimeError(f"bench.captured_step {' '.join(args)} failed")
    return dict(json.loads((out / name).read_text()))


def _app(out: Path, overrides: list[str], rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpu_session_") as tmp:
        result = _app_run(overrides, rounds, Path(tmp), "captured", THREAD_ENV)
        shutil.copy(Path(tmp) / "app_captured" / "metrics.jsonl", out / "app_metrics.jsonl")
    return {k: v for k, v in result.items() if k not in ("model_file", "finished_unix")}


def _arguments(cuda: bool, data_dir: str | None, tiny: bool) -> dict[str, list[str]]:
    """Each step's command line: bench.captured_step's two, and the app's Hydra overrides."""
    common = ["--device", "cuda" if cuda else "cpu", *(["--data-dir", data_dir] if data_dir else [])]
    common += ["--threads", "1"] if tiny else []
    app_cohorts = ["--override", *TINY_OVERRIDES, "--rounds", "3", "--steps", "1"] if tiny else []
    equal = [*TINY_EQUAL, "--rounds", "2", "--steps", "1"] if tiny else []
    extra = [f"simulation.device={'cuda' if cuda else 'cpu'}", *(TINY_OVERRIDES if tiny else [])]
    extra += [f"dataset.data_dir={data_dir}"] if data_dir else []
    extra += ["simulation.client_gpus=1"] if cuda else []
    return {
        "step_app": [*common, "--cohorts", "app", "--variants", "--profile", *app_cohorts],
        "step_equal": [*common, "--cohorts", "equal", "--variants", *equal],
        "app": with_overrides(GPU_OVERRIDES, *extra),
    }


def session(out: Path, data_dir: str | None, rounds: int, tiny: bool) -> dict[str, Any]:
    """Every step above into ``out``; the summary (also written as ``summary.json``)."""
    cuda = torch.cuda.is_available()
    args = _arguments(cuda, data_dir, tiny)
    out.mkdir(parents=True, exist_ok=True)
    errors: dict[str, str] = {}
    tests = _attempt(errors, "cuda_tests", lambda: _cuda_tests(out)) if cuda else None
    step_app = _attempt(errors, "step_app", lambda: _captured_step(out, "step_app.json", args["step_app"]))
    _attempt(errors, "step_equal", lambda: _captured_step(out, "step_equal.json", args["step_equal"]))
    app = _attempt(errors, "app", lambda: _app(out, args["app"], rounds))
    summary = {"gpu": torch.cuda.get_device_name(0) if cuda else None, "overrides": args["app"], "cuda_tests": tests,
               "app": app, **summarize(step_app, app), "errors": errors}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tiny", action="store_true", help="every step at a tiny size (CI's smoke run)")
    args = parser.parse_args(argv)
    summary = session(args.out, args.data_dir, args.rounds, args.tiny)
    print(json.dumps({k: v for k, v in summary.items() if k != "overrides"}, indent=2, default=str))
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
