"""The Hydra front door joins a running Ray cluster (``simulation.ray_address``) instead of starting its own.

A real ``ray start --head`` on 127.0.0.1 with a temp dir of its own; the run is a subprocess with another temp
dir, so any Ray it started itself would name that one. Cleanup stops exactly the processes of this cluster and
this run (by the temp dirs they name), never ``ray stop``: that kills every Ray process on the machine, including
other people's simulations.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from bench.processes import ROOT, kill_processes_mentioning, processes_mentioning, run_env
from fl_app.metrics import read_metrics
from tests.integration.conftest import ray_cluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SMALL = ["dataset.num_clients=10", "dataset.max_train_samples=600", "dataset.max_test_samples=200"]


class _RayDaemonWatch:
    """Records which of Ray's daemons (gcs_server, raylet) name each marker (a temp dir) while the block runs."""

    def __init__(self, **markers: str) -> None:
        self.markers = markers
        self.seen: dict[str, set[str]] = {label: set() for label in markers}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for label, marker in self.markers.items():
                for proc in processes_mentioning(marker):
                    with contextlib.suppress(psutil.Error):
                        if proc.name() in ("gcs_server", "raylet"):
                            self.seen[label].add(proc.name())
            self._stop.wait(0.5)

    def __enter__(self) -> _RayDaemonWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_hydra_run_joins_a_running_cluster_and_starts_no_ray_of_its_own(short_tmp: Path) -> None:
    env = run_env(short_tmp)
    out = short_tmp / "out"
    try:
        with ray_cluster() as (address, cluster_tmp):
            gcs = [p.pid for p in processes_mentioning(cluster_tmp) if p.name() == "gcs_server"]
            assert len(gcs) == 1
            cmd = [
                sys.executable,
                "-m",
                "apps.main",
                f"simulation.ray_address={address}",
                "num_rounds=2",
                *SMALL,
                f"output_dir={out}",
                f"hydra.run.dir={short_tmp / 'hydra'}",
            ]
            # A Ray of the run's own would name the run's RAY_TMPDIR; the cluster's daemons name the cluster's.
            with _RayDaemonWatch(run=env["RAY_TMPDIR"], cluster=cluster_tmp) as watch:
                proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
            log = proc.stdout + proc.stderr
            assert proc.returncode == 0, log[-3000:]
            assert [p.pid for p in processes_mentioning(cluster_tmp) if p.name() == "gcs_server"] == gcs
    finally:
        kill_processes_mentioning(env["RAY_TMPDIR"])
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert watch.seen == {"run": set(), "cluster": {"gcs_server", "raylet"}}
    assert f"Joined the Ray cluster at {address}" in log, log[-3000:]
    assert "10 clients on 2 SuperNodes" in log, log[-3000:]  # 2 CPUs, 1 a client: sized from the cluster
    assert json.loads((out / "run.json").read_text())["status"] == "completed"
    assert [r["round"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]
