"""apps/local_ray.py: the Hydra entry point's own Ray hands the workers the driver's import path through the
inherited environment, with no job runtime_env (so Flower's actors take the workers Ray prestarts)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from apps.local_ray import driver_pythonpath
from bench.processes import ROOT, run_env


def test_the_workers_path_is_sys_path_then_pythonpath_each_entry_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", ["/a", "/b", "/a"])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/c", "/b", ""]))
    assert driver_pythonpath() == os.pathsep.join(["/a", "/b", "/c"])
    # Idempotent: a second run in the same process (a Hydra sweep) hands the workers the same path.
    monkeypatch.setenv("PYTHONPATH", driver_pythonpath())
    assert driver_pythonpath() == os.pathsep.join(["/a", "/b", "/c"])


_PROBE = r"""
import json, os, sys
import ray
from apps.local_ray import driver_pythonpath, start_local_ray
from apps.main import backend_config
import strategies  # registers the strategy names a config is validated by
from fl_app.config import compose_config
sys.path.append("/nonexistent/probe-entry")
start_local_ray(backend_config(compose_config(["simulation.total_cpus=1"]))["init_args"])

@ray.remote(num_cpus=1)
class Probe:
    def where(self):
        import fl_app
        return {"pythonpath": os.environ.get("PYTHONPATH", ""), "fl_app": fl_app.__file__,
                "runtime_env": ray.get_runtime_context().get_runtime_env_string()}

seen = ray.get(Probe.remote().where.remote())
job_env = ray.get_runtime_context().get_runtime_env_string()
print(json.dumps({**seen, "driver": driver_pythonpath(), "job_runtime_env": job_env}))
ray.shutdown()
"""


def test_a_local_ray_s_workers_inherit_the_driver_s_path_without_a_runtime_env(tmp_path: Path) -> None:
    env = {**run_env(tmp_path), "PYTHONPATH": str(ROOT)}  # a short RAY_TMPDIR: Ray's socket paths are bounded
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["pythonpath"] == seen["driver"]
    assert "/nonexistent/probe-entry" in seen["pythonpath"].split(os.pathsep)  # the driver's sys.path, as it was
    assert Path(seen["fl_app"]).resolve().parent == (ROOT / "fl_app").resolve()
    assert json.loads(seen["runtime_env"]) == {} and json.loads(seen["job_runtime_env"]) == {}
