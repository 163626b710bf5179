"""Helpers for integration tests: real Flower simulations (Hydra front door and `flwr run` against a real
SuperLink process on 127.0.0.1), each with its own Ray temp dir and Flower home, and every process stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# A small Fashion-MNIST setting: 50 clients over the first 6000 training images (120 each), 2000 test images,
# q = 0.2 (about 10 clients a round).
SMALL = [
    "dataset.num_clients=50",
    "dataset.max_train_samples=6000",
    "dataset.max_test_samples=2000",
    "privacy.sample_rate=0.2",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    # Ray's socket paths must stay short, so not under pytest's long tmp_path.
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["FLWR_HOME"] = str(tmp / "flwr_home")
    env["DPFEDSAM_RUNS_DIR"] = str(tmp / "runs")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_hydra(tmp: Path, overrides: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m fl_app.main <overrides>` writing into tmp/out."""
    cmd = [
        sys.executable,
        "-m",
        "fl_app.main",
        *overrides,
        f"output_dir={tmp / 'out'}",
        f"hydra.run.dir={tmp / 'hydra'}",
    ]
    return subprocess.run(cmd, cwd=ROOT, env=run_env(tmp), capture_output=True, text=True, timeout=timeout)


def stop_process_group(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the process group started with start_new_session=True, then SIGKILL what is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace)


def kill_processes_mentioning(text: str) -> int:
    """SIGKILL every process whose command line or environment names ``text`` (e.g. a run's RAY_TMPDIR)."""
    killed = 0
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit() or int(proc_dir.name) == os.getpid():
            continue
        try:
            blob = (proc_dir / "cmdline").read_bytes() + (proc_dir / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in blob:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(proc_dir.name), signal.SIGKILL)
                killed += 1
    return killed


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before listening on {port}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


@contextlib.contextmanager
def simulation_superlink(tmp: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A real `flower-superlink --simulation` on a free port with its own FLWR_HOME; yields (connection, env)."""
    env = run_env(tmp)
    port = free_port()
    home = Path(env["FLWR_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "test"\n\n[superlink.test]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    log = (tmp / "superlink.log").open("wb")
    proc = subprocess.Popen(
        [
            str(BIN / "flower-superlink"),
            "--insecure",
            "--simulation",
            "--isolation",
            "subprocess",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--disable-runtime-dependency-installation",
        ],
        cwd=tmp,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for_port(port, proc)
        yield "test", env
    finally:
        stop_process_group(proc)
        log.close()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dpfs", dir="/tmp") as d:
        yield Path(d)
