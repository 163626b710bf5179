"""Local Flower/Ray processes for benchmarks and integration tests: isolated environments, a real
``flower-superlink --simulation`` on a free 127.0.0.1 port, clean shutdown, and the peak memory of a run's
whole process tree (driver, Ray's GCS/raylet, every worker).

Every run gets its own ``RAY_TMPDIR`` and ``FLWR_HOME``, and runtime dependency installation is off, so nothing
is shared with (or leaked into) other runs on the machine.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
#: Every benchmarked process runs its BLAS and OpenMP on one thread (torch's own threads are set per process).
THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_env(tmp: Path) -> dict[str, str]:
    """The environment of one isolated run below ``tmp``."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    # Ray's socket paths must stay short, so not under a long tmp path.
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    env["FLWR_HOME"] = str(tmp / "flwr_home")
    env["DPFEDSAM_RUNS_DIR"] = str(tmp / "runs")
    env["PYTHONUNBUFFERED"] = "1"
    return env


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


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Every process (but this one) whose command line or environment names ``text``, e.g. a run's RAY_TMPDIR:
    Ray daemonises some of its processes, so the parent-child tree alone can miss them."""
    found = []
    needle = text.encode()
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit() or int(proc_dir.name) == os.getpid():
            continue
        try:
            blob = (proc_dir / "cmdline").read_bytes() + (proc_dir / "environ").read_bytes()
            if needle in blob:
                found.append(psutil.Process(int(proc_dir.name)))
        except (OSError, psutil.Error):
            continue
    return found


def kill_processes_mentioning(text: str) -> int:
    """SIGKILL every process whose command line or environment names ``text``; returns how many."""
    killed = 0
    for proc in processes_mentioning(text):
        with contextlib.suppress(psutil.Error):
            proc.kill()
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
def simulation_superlink(tmp: Path, env: dict[str, str] | None = None) -> Iterator[tuple[str, dict[str, str]]]:
    """A real ``flower-superlink --simulation`` on a free port with its own FLWR_HOME; yields (connection, env)
    for ``flwr run . <connection>``. Stopped (process group) on exit."""
    env = run_env(tmp) if env is None else env
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


def tree_rss(root_pid: int, marker: str | None = None) -> int:
    """Resident memory (bytes) summed over ``root_pid``, its descendants and every process naming ``marker``."""
    procs: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(root_pid)
        procs[root.pid] = root
        procs.update({p.pid: p for p in root.children(recursive=True)})
    if marker:
        procs.update({p.pid: p for p in processes_mentioning(marker)})
    total = 0
    for proc in procs.values():
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total


def cpu_seconds(procs: Iterable[psutil.Process]) -> float:
    """CPU seconds (user + system) ``procs`` have used, with their children that exited and were reaped."""
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


class PeakRSSMonitor:
    """Samples :func:`tree_rss` in a background thread; ``peak`` is the largest sum seen (bytes).

    Summed RSS counts shared pages (e.g. torch's libraries) once per process: it is the "all processes of the
    run" figure, an upper bound on the physical memory the run needs. Each sample also records the CPU seconds the
    same processes have used so far (:meth:`cpu_seconds_at`): on a machine of n cores, a run that has used X CPU
    seconds by some point cannot have got there in less than X / n seconds.
    """

    def __init__(self, root_pid: int, marker: str | None = None, interval: float = 0.25) -> None:
        self.root_pid = root_pid
        self.marker = marker
        self.interval = interval
        self.peak = 0
        #: At the peak: MiB per process kind (:func:`rss_by_process_kind`), which add up to ``peak``.
        self.peak_by_kind: dict[str, float] = {}
        #: (Unix time, CPU seconds used so far by every process of the run), one per sample, non-decreasing.
        self.cpu: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            by_kind = processes_by_kind(self.root_pid, self.marker)
            kinds = _rss_mib_by_kind(by_kind)
            total = int(sum(kinds.values()) * 2**20)
            if total > self.peak:
                self.peak, self.peak_by_kind = total, kinds
            # A process that exits between samples takes its last CPU seconds along: keep the sum non-decreasing.
            used = cpu_seconds(proc for procs in by_kind.values() for proc in procs)
            self.cpu.append((time.time(), max(used, self.cpu[-1][1] if self.cpu else 0.0)))
            self._stop.wait(self.interval)

    def cpu_seconds_at(self, when: float) -> float:
        """CPU seconds the run had used at Unix time ``when`` (the first sample at or after it; NaN if none)."""
        return next((used for at, used in self.cpu if at >= when), math.nan)

    def __enter__(self) -> PeakRSSMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


#: (process kind, substrings of the command line that identify it), first match wins. Ray retitles its worker
#: processes ``ray::<actor or task>`` (``ray::IDLE`` while none is assigned), and its two per-node agents
#: ``ray::DashboardAgent`` / ``ray::RuntimeEnvAgent``, so those must be matched before the workers.
_PROCESS_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gcs_server", ("gcs_server",)),
    ("raylet", ("/raylet", "raylet ")),
    ("dashboard", ("dashboard/dashboard.py",)),
    ("dashboard_agent", ("ray::DashboardAgent", "dashboard/agent.py")),
    ("runtime_env_agent", ("ray::RuntimeEnvAgent", "runtime_env/agent/main.py")),
    ("log_monitor", ("log_monitor.py",)),
    ("autoscaler_monitor", ("autoscaler/_private/monitor.py",)),
    ("reaper", ("ray_process_reaper.py",)),
    ("ray_client_server", ("ray.util.client.server",)),
    ("workers", ("ray::", "default_worker.py")),
)


def process_kind(proc: psutil.Process, root_pid: int | None = None) -> str:
    """What ``proc`` is in a simulation: ``driver`` (``root_pid``), one of Ray's daemons, ``workers`` or ``other``."""
    if proc.pid == root_pid:
        return "driver"
    try:
        cmdline = " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return "other"
    for kind, needles in _PROCESS_KINDS:
        if any(needle in cmdline for needle in needles):
            return kind
    return "other"


def processes_by_kind(root_pid: int, marker: str | None = None) -> dict[str, list[psutil.Process]]:
    """The processes :func:`tree_rss` sums (``root_pid``, its descendants, every process naming ``marker``),
    grouped by :func:`process_kind`."""
    procs: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(root_pid)
        procs[root.pid] = root
        procs.update({p.pid: p for p in root.children(recursive=True)})
    if marker:
        procs.update({p.pid: p for p in processes_mentioning(marker)})
    grouped: dict[str, list[psutil.Process]] = {}
    for proc in procs.values():
        grouped.setdefault(process_kind(proc, root_pid), []).append(proc)
    return grouped


def rss_by_process_kind(root_pid: int, marker: str | None = None) -> dict[str, float]:
    """Resident memory (MiB) summed per process kind (driver, gcs_server, raylet, dashboard_agent, workers, ...):
    what each part of the engine costs. The values add up to :func:`tree_rss` (in MiB) of the same moment."""
    return _rss_mib_by_kind(processes_by_kind(root_pid, marker))


def _rss_mib_by_kind(by_kind: dict[str, list[psutil.Process]]) -> dict[str, float]:
    grouped: dict[str, float] = {}
    for kind, procs in by_kind.items():
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                grouped[kind] = grouped.get(kind, 0.0) + proc.memory_info().rss / 2**20
    return grouped


def run_monitored(
    cmd: list[str], env: dict[str, str], log: Path, marker: str, timeout: float
) -> tuple[float, PeakRSSMonitor]:
    """Run ``cmd``; returns (command start Unix time, the monitor of every process it started: peak RSS summed over
    them, at that peak the MiB of each kind of process — driver, each Ray daemon, workers — and their CPU seconds
    over time)."""
    start = time.time()
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            with PeakRSSMonitor(proc.pid, marker=marker) as monitor:
                proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
            kill_processes_mentioning(marker)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}); see {log}")
    return start, monitor
