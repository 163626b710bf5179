"""A real (non-simulation) Flower deployment on 127.0.0.1 for integration tests.

One `flower-superlink` (insecure or TLS with certificates from scripts/make_certs.sh), N `flower-supernode` processes
(SuperNode i owns partition i of N through its node config) and a Flower home whose config.toml holds the connection
"deploy" for the `flwr` CLI. Every process runs in its own session (process group) with its own Flower home and log
file, and every group is stopped when the context exits, also on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.processes import BIN, ROOT, run_env, stop_process_group, wait_for_port
from tests.integration.app_dir import app_dir

CONNECTION = "deploy"
MAKE_CERTS = ROOT / "scripts" / "make_certs.sh"


@dataclass
class Deployment:
    """What :func:`deployment` started. Unpacks as ``(connection, env)``."""

    connection: str
    env: dict[str, str]  # for the `flwr` CLI: FLWR_HOME holds config.toml with `connection`
    tmp: Path
    certs: Path | None = None  # ca.crt, server.pem, server.key when TLS is on
    superlink: subprocess.Popen[bytes] | None = None
    supernodes: list[subprocess.Popen[bytes]] = field(default_factory=list)  # SuperNode i owns partition i
    logs: dict[str, Path] = field(default_factory=dict)
    # everything the started processes had spawned when the deployment stopped (pid, start time)
    spawned: set[tuple[int, int]] = field(default_factory=set)

    def __iter__(self) -> Iterator[object]:
        return iter((self.connection, self.env))

    @property
    def processes(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in (self.superlink, *self.supernodes) if p is not None]

    def leftovers(self) -> list[int]:
        """Processes of this deployment still alive: those it started, their groups, and what they had spawned."""
        return sorted(pid for pid, _ in _alive(process_tree([p.pid for p in self.processes]) | self.spawned))

    def kill_supernode(self, index: int) -> None:
        """SIGKILL SuperNode ``index`` and everything it started (its ClientApp processes), as a crash would."""
        proc = self.supernodes[index]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def tails(self, chars: int = 2500) -> str:
        """The end of every process log, for assertion messages."""
        parts = []
        for name, path in self.logs.items():
            text = path.read_text(errors="replace") if path.exists() else "<no log>"
            parts.append(f"----- {name} ({path}) -----\n{text[-chars:]}")
        return "\n".join(parts)


def _proc_table() -> dict[int, tuple[int, int, str, int]]:
    """pid -> (ppid, pgid, state, start time) of every process, from /proc (Linux only)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
        #  priority nice num_threads itrealvalue starttime ..." (comm may hold spaces and parentheses)
        f = stat[stat.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(f[1]), int(f[2]), f[0], int(f[19]))
    return table


def _alive(procs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """The (pid, start time) pairs that still name a live, non-zombie process."""
    table = _proc_table()
    return {(pid, start) for pid, start in procs if pid in table and table[pid][3] == start and table[pid][2] != "Z"}


def process_tree(roots: list[int]) -> set[tuple[int, int]]:
    """(pid, start time) of ``roots``, their descendants (also those that left for a session of their own, as
    Flower's SuperExec and ServerApp processes do) and every member of the roots' process groups."""
    table = _proc_table()
    found = {pid for pid in roots if pid in table} | {pid for pid, t in table.items() if t[1] in roots}
    grew = True
    while grew:
        children = {pid for pid, t in table.items() if t[0] in found} - found
        found |= children
        grew = bool(children)
    return {(pid, table[pid][3]) for pid in found}


def _stop(procs: set[tuple[int, int]], grace: float) -> None:
    """SIGTERM, wait, then SIGKILL each listed process (by pid, checked against its start time) that is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + grace
        while (left := _alive(procs)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid, _ in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1. conftest.free_port called repeatedly can hand out the same port
    twice when the first process has not bound it yet (seen: two SuperNodes on one --port, `[Errno 98] ... address
    already in use`), so every socket stays bound until all ports are chosen."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def make_certs(outdir: Path) -> Path:
    subprocess.run(["bash", str(MAKE_CERTS), str(outdir)], check=True, capture_output=True, text=True, timeout=60)
    return outdir


def write_connection(home: Path, address: str, certs: Path | None, name: str = CONNECTION) -> Path:
    """$FLWR_HOME/config.toml with one SuperLink connection ``name`` (the default one)."""
    home.mkdir(parents=True, exist_ok=True)
    security = f'root-certificates = "{certs / "ca.crt"}"' if certs is not None else "insecure = true"
    path = home / "config.toml"
    path.write_text(f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{address}"\n{security}\n')
    return path


def online_nodes(env: dict[str, str], connection: str = CONNECTION) -> int:
    """Number of SuperNodes the SuperLink lists as online (`flwr supernode list --format json`); -1 if unknown."""
    try:
        proc = subprocess.run(
            [str(BIN / "flwr"), "supernode", "list", connection, "--format", "json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        nodes = json.loads(proc.stdout)["nodes"]
    except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return -1
    return sum(1 for n in nodes if n.get("status") == "online")


def _start(cmd: list[str], env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


@contextlib.contextmanager
def deployment(
    tmp: Path,
    num_nodes: int,
    tls: bool,
    threads_per_node: int | None = None,
    ready_timeout: float = 90.0,
) -> Iterator[Deployment]:
    """Start a SuperLink and ``num_nodes`` SuperNodes on 127.0.0.1, wait until all nodes are online, yield the
    :class:`Deployment`, and stop every process group at exit.

    ``threads_per_node`` sets OMP_NUM_THREADS for each SuperNode (and so for its ClientApp processes); by default the
    machine's cores are split between the nodes, since all of them share one machine here.
    """
    env = run_env(tmp)  # the CLI's env: FLWR_HOME = tmp/flwr_home, no runtime dependency installation
    certs = make_certs(tmp / "certs") if tls else None
    port, *node_ports = free_ports(1 + num_nodes)
    address = f"127.0.0.1:{port}"
    write_connection(Path(env["FLWR_HOME"]), address, certs)
    if threads_per_node is None:
        threads_per_node = max(1, (os.cpu_count() or 1) // max(1, num_nodes))

    dep = Deployment(CONNECTION, env, tmp=tmp, certs=certs)
    try:
        tls_link = (
            [
                "--ssl-ca-certfile",
                str(certs / "ca.crt"),
                "--ssl-certfile",
                str(certs / "server.pem"),
                "--ssl-keyfile",
                str(certs / "server.key"),
            ]
            if certs is not None
            else ["--insecure"]
        )
        link_env = {**env, "FLWR_HOME": str(tmp / "superlink_home")}
        dep.logs["superlink"] = tmp / "superlink.log"
        dep.superlink = _start(
            [
                str(BIN / "flower-superlink"),
                *tls_link,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--disable-runtime-dependency-installation",
            ],
            link_env,
            dep.logs["superlink"],
            tmp,
        )
        wait_for_port(port, dep.superlink)

        tls_node = ["--root-certificates", str(certs / "ca.crt")] if certs is not None else ["--insecure"]
        for i in range(num_nodes):
            node_env = {**env, "FLWR_HOME": str(tmp / f"supernode{i}_home"), "OMP_NUM_THREADS": str(threads_per_node)}
            dep.logs[f"supernode{i}"] = tmp / f"supernode{i}.log"
            dep.supernodes.append(
                _start(
                    [
                        str(BIN / "flower-supernode"),
                        *tls_node,
                        "--superlink",
                        address,
                        "--node-config",
                        f"partition-id={i} num-partitions={num_nodes}",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(node_ports[i]),
                    ],
                    node_env,
                    dep.logs[f"supernode{i}"],
                    tmp,
                )
            )

        deadline = time.monotonic() + ready_timeout
        online = -1
        while (online := online_nodes(env)) < num_nodes:
            exited = [p.args for p in dep.processes if p.poll() is not None]
            if exited or time.monotonic() > deadline:
                raise RuntimeError(
                    f"deployment not ready: {online} of {num_nodes} SuperNodes online, exited: {exited}\n{dep.tails()}"
                )
            time.sleep(0.5)
        yield dep
    finally:
        dep.spawned = process_tree([p.pid for p in dep.processes])
        for proc in reversed(dep.supernodes):
            stop_process_group(proc)
        if dep.superlink is not None:
            stop_process_group(dep.superlink)
        _stop(dep.spawned, grace=10.0)  # what left the groups (SuperExec, ServerApp) or outlived its leader
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)  # made by run_env, unused here


def flwr_command(connection: str, run_config: str) -> list[str]:
    """``flwr run`` of the checkout's app (tests/integration/app_dir.py) against ``connection``, streamed."""
    return [str(BIN / "flwr"), "run", str(app_dir()), connection, "--run-config", run_config, "--stream"]


def start_flwr_run(env: dict[str, str], connection: str, run_config: str, log: Path) -> subprocess.Popen[bytes]:
    """`flwr run <app> <connection> --run-config ... --stream` in the background (own session), output to ``log``."""
    return _start(flwr_command(connection, run_config), env, log, ROOT)


def flwr_run(
    env: dict[str, str], connection: str, run_config: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`flwr run <app> <connection> --run-config ... --stream` from the project root; waits for the run to finish."""
    return subprocess.run(
        flwr_command(connection, run_config), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def deploy_run_config(out: Path, num_nodes: int, num_rounds: int, extra: str = "", overrides: str = "") -> str:
    """The run-config of a small `population=nodes` run: every node is one client and trains every round."""
    hydra = (
        f"dataset.num_clients={num_nodes} dataset.max_train_samples=600 dataset.max_test_samples=500 "
        f"privacy.sample_rate=1.0 {overrides}"
    ).strip()
    return f"num_rounds={num_rounds} population='nodes' output_dir='{out}' overrides='{hydra}' {extra}".strip()
