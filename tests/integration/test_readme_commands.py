"""Every command of README.md, and the examples of docs/running.md and docs/architecture.md, runs as written.

The commands are read from the markdown at test time (``doc_commands``): each fenced ``bash`` block of the three
files, README.md's inline commands that start with ``.venv/bin/``, and the Python programs of docs/architecture.md
and README.md. An edited doc is tested as edited; a command no rule below knows fails, asking to be taught.

How a command runs "as written":

- **Where.** A shell command runs under ``bash -eo pipefail`` in the checkout's root (the docs name ``.venv/bin/``,
  ``scripts/`` and ``flwr run .`` relative to it), after the setup lines of its block that come before it
  (``export``, ``source``, ``NAME=value``). A Python program runs in a fresh temp dir and imports the installed
  project.
- **Environment.** A fresh shell's: the virtualenv is neither active nor on ``PATH``; ``VIRTUAL_ENV``,
  ``RAY_ADDRESS`` and ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION`` are unset (a command that needs one sets it).
  ``HOME``, ``FLWR_HOME``, ``TMPDIR`` (hence ``mktemp -d``), ``RAY_TMPDIR`` and the runs dir lie in the test's temp
  dir, and ``flwr run``'s local SuperLink gets two free ports (``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``,
  ``FLWR_LOCAL_CONTROL_API_PORT``) instead of 39091/39093.
- **Size.** The command's words are never edited: small Hydra overrides are appended (``TINY``, ``num_rounds=1``, and
  the output dirs in the temp dir; Hydra's last value of a key wins). Under ``flwr run`` they are appended to the
  ``--run-config``'s ``overrides`` (the output dir as its ``output_dir``). A sweep runs all its jobs at that size.
  A Python program runs unchanged, with the dataset sizes of ``TINY`` as defaults of every strategy it builds.
- **After.** Every process that names the temp dir is killed (no kill by name), ``flwr run``'s detached SuperLink
  first by the doc's own recipe (the PID listening on its port). Nothing may be written into the checkout.

**What the default run runs.** The suite's time is short, so a command that repeats a front door the README's own
commands already run, with other values, is marked ``slow`` (``pytest -m slow`` runs it): docs/running.md's Hydra
and ``flwr run`` examples, the README's sweep (six jobs) and docs/architecture.md's ServerApp program (20 rounds;
``tests/integration/test_user_server_app.py`` runs a user's ServerApp by default). In the default run every
command's config, each job of a sweep included, is still composed and validated (``test_documented_configs_are_valid``),
and a Hydra command whose config equals an earlier command's is that run (skipped, naming it).

Commands not run here, each with its reason checked: ``bash scripts/test.sh`` (what CI itself runs: ``.ci/run``);
the Ray cluster examples of docs/running.md (several machines; ``tests/integration/test_ray_cluster.py`` runs a
Hydra run joining a ``ray start`` cluster). docs/deployment.md is run by ``tests/integration/test_deployment*.py``.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import shlex
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.processes import BIN, ROOT, free_port, kill_processes_mentioning, run_env
from fl_app.config import compose_config, overrides_from_run_config
from tests.integration.doc_commands import Command, inline_commands, is_setup, python_blocks, shell_commands
from tests.integration.test_first_screen import first_screen_problems

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DOCS = ("README.md", "docs/running.md", "docs/architecture.md")
#: Ten clients over 600 training images and 200 test images: the smallest run that still trains and evaluates.
TINY = ["dataset.num_clients=10", "dataset.max_train_samples=600", "dataset.max_test_samples=200"]
ROUNDS = "num_rounds=1"
#: Directories a run writes by default, which must stay as they were.
DEFAULT_OUTPUTS = ("outputs", "multirun", "runs")


def documented_commands() -> list[Command]:
    """Every command of the three docs (setup lines excluded: they run before the commands after them), each
    once: a command written twice (same words, same setup) is one test, named by its first place."""
    found = [cmd for doc in DOCS for cmd in shell_commands(ROOT / doc, ROOT)]
    found += inline_commands((ROOT / "README.md").read_text(), "README.md", ".venv/bin/")
    unique: dict[tuple[str, tuple[str, ...]], Command] = {}
    for cmd in found:
        if not is_setup(cmd.text):
            unique.setdefault((cmd.text, cmd.preamble), cmd)
    return list(unique.values())


COMMANDS = documented_commands()


def is_slow(cmd: Command) -> bool:
    """Repeats a front door the README's commands run by default (see the module docstring)."""
    runs = re.search(r"(python -m apps\.main|flwr run \. )", cmd.text) is not None
    return runs and (cmd.where.startswith("docs/running.md") or "--multirun" in cmd.text.split())


PARAMS = [pytest.param(c, id=c.where, marks=[pytest.mark.slow] if is_slow(c) else []) for c in COMMANDS]


# --- the environment and the shell -----------------------------------------------------------------------------


def fresh_shell_env(tmp: Path) -> dict[str, str]:
    """A fresh shell's environment (no virtualenv on PATH) with every per-user location in ``tmp``."""
    env = run_env(tmp)
    os.rmdir(env["RAY_TMPDIR"])  # run_env's own, outside tmp; this one is inside it
    venv_bins = {str(BIN), str(ROOT / ".venv" / "bin")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p and p not in venv_bins)
    for key in ("VIRTUAL_ENV", "RAY_ADDRESS", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"):
        env.pop(key, None)
    (tmp / "home").mkdir()
    env.update(HOME=str(tmp / "home"), TMPDIR=str(tmp), RAY_TMPDIR=str(tmp / "ray"))
    env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(free_port())
    env["FLWR_LOCAL_CONTROL_API_PORT"] = str(free_port())
    return env


def run_in_shell(cmd: Command, line: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``line`` (the command, sized) after its block's setup lines, in a bash in the checkout's root."""
    script = "\n".join(["set -eo pipefail", f"cd {shlex.quote(str(ROOT))}", *cmd.preamble, line])
    return subprocess.run(["bash", "-c", script], env=env, cwd=env["TMPDIR"], capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)  # fmt: skip


def outputs_in_checkout() -> dict[str, list[str]]:
    return {name: sorted(p.name for p in (ROOT / name).glob("*")) for name in DEFAULT_OUTPUTS}


def log_of(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def assert_completed(runs: list[Path], expected: int, log: str) -> None:
    """``expected`` run dirs, each with a completed run.json."""
    assert len(runs) == expected, f"{len(runs)} runs, expected {expected}\n{log}"
    for run in runs:
        assert '"status": "completed"' in (run / "run.json").read_text(), f"{run}\n{log}"


# --- how each kind of command is sized, run and checked --------------------------------------------------------


def sweep_size(words: list[str]) -> int:
    """Jobs of a Hydra ``--multirun``: the product of the comma lists' lengths."""
    return math.prod(len(w.split("=", 1)[1].split(",")) for w in words if "=" in w and "," in w.split("=", 1)[1])


def hydra_overrides(text: str, tmp: Path) -> list[str]:
    if "--multirun" in text.split():
        return [*TINY, ROUNDS, f"hydra.sweep.dir={tmp / 'multirun'}"]
    return [*TINY, ROUNDS, f"output_dir={tmp / 'out'}", f"hydra.run.dir={tmp / 'hydra'}"]


def hydra_jobs(cmd: Command) -> list[list[str]]:
    """The overrides of each job a Hydra command runs, sized (for ``bash scripts/run_main.sh``: none of its own)."""
    words = shlex.split(cmd.text)
    script = words[:2] == ["bash", "scripts/run_main.sh"]
    words = words[2:] if script else words[words.index("apps.main") + 1 :]
    overrides = [w for w in words if not w.startswith("--")]
    if "--multirun" not in words:
        return [[*overrides, *TINY, ROUNDS]]
    choices = [[f"{w.split('=', 1)[0]}={v}" for v in w.split("=", 1)[1].split(",")] for w in overrides]
    return [[*job, *TINY, ROUNDS] for job in itertools.product(*choices)]


def same_run_as(cmd: Command) -> Command | None:
    """An earlier documented Hydra command that runs the same config, sized (output dirs aside)."""
    config = compose_config(hydra_jobs(cmd)[0] + ["output_dir=null"])
    for other in COMMANDS[: COMMANDS.index(cmd)]:
        hydra = rule_for(other) in (run_hydra_command, run_main_script) and "--multirun" not in other.text
        if hydra and compose_config(hydra_jobs(other)[0] + ["output_dir=null"]) == config:
            return other
    return None


def run_hydra_command(cmd: Command, tmp: Path, env: dict[str, str]) -> None:
    """``python -m apps.main ...`` (or ``bash scripts/run_main.sh ...``, which passes its arguments on)."""
    if "--multirun" not in cmd.text.split() and (earlier := same_run_as(cmd)) is not None:
        pytest.skip(f"the same run as {earlier.where} (`{earlier.text}`), sized")
    proc = run_in_shell(cmd, " ".join([cmd.text, *hydra_overrides(cmd.text, tmp)]), env, timeout=540)
    log = log_of(proc)
    assert proc.returncode == 0, log
    if "--multirun" in cmd.text.split():
        runs = sorted(p.parent for p in (tmp / "multirun").glob("*/run.json"))
        assert_completed(runs, sweep_size(shlex.split(cmd.text)), log)
    else:
        assert_completed([tmp / "out"], 1, log)


def run_main_script(cmd: Command, tmp: Path, env: dict[str, str]) -> None:
    """``bash scripts/run_main.sh``: scripts/setup.sh (nothing to do on a set-up checkout), then the main job."""
    stamp = ROOT / ".venv" / ".dpfedsam-installed"
    if not stamp.exists() or stamp.stat().st_mtime < (ROOT / "pyproject.toml").stat().st_mtime:
        pytest.fail("scripts/setup.sh would install packages here: run it once (bash scripts/setup.sh), then retest")
    run_hydra_command(cmd, tmp, env)


_RUN_CONFIG = re.compile(r"""(--run-config\s+")([^"]*?overrides='[^']*)('[^"]*)(")""")


def sized_flwr_run(text: str, tmp: Path) -> str:
    """The ``flwr run`` command with ``TINY`` and the round count appended to its run-config's ``overrides``, and
    the output dir in ``tmp``."""
    match = _RUN_CONFIG.search(text)
    if match is None:
        pytest.fail(f"teach test_readme_commands to size this flwr run (no --run-config \"... overrides='...'\"): "
                    f"{text}")  # fmt: skip
    extra = " ".join([*TINY, ROUNDS])
    run_config = f"{match.group(2)} {extra}{match.group(3)} output_dir='{tmp / 'out'}'"
    return text[: match.start()] + match.group(1) + run_config + match.group(4) + text[match.end() :]


def stop_superlink_command() -> Command:
    """docs/running.md's way to stop the SuperLink ``flwr run`` leaves running (the PID on its port)."""
    found = [c for c in shell_commands(ROOT / "docs/running.md", ROOT) if "-iTCP:39091" in " ".join(c.preamble)]
    assert found, "docs/running.md no longer says how to stop flwr run's local SuperLink (lsof -t -iTCP:39091)"
    return found[0]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def run_flwr_command(cmd: Command, tmp: Path, env: dict[str, str]) -> None:
    """``flwr run .`` with the default connection: a local SuperLink started on the moved port, the run streamed,
    and what it printed a clean first screen (tests/integration/test_first_screen.py); then the SuperLink stopped as
    docs/running.md says (its port moved the same way)."""
    proc = run_in_shell(cmd, sized_flwr_run(cmd.text, tmp), env, timeout=400)
    log = log_of(proc) + f"\n--- superlink log\n{read_tail(tmp / 'flwr_home' / 'local-superlink' / 'superlink.log')}"
    assert proc.returncode == 0, log
    assert_completed([tmp / "out"], 1, log)
    assert f"[round 1/{ROUNDS.split('=')[1]}]" in proc.stdout + proc.stderr, log  # the screen is the run's
    assert first_screen_problems(proc.stdout + proc.stderr) == [], proc.stdout + proc.stderr
    port = int(env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"])
    assert listening(port), "flwr run left no SuperLink running (docs/running.md says it does)\n" + log
    stop = stop_superlink_command()
    moved = Command(stop.where, stop.text, tuple(line.replace("39091", str(port)) for line in stop.preamble))
    stopped = run_in_shell(moved, moved.text, env, timeout=60)
    assert stopped.returncode == 0, log_of(stopped)
    deadline = time.monotonic() + 20
    while listening(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not listening(port), f"the SuperLink still listens on {port} after {stop.where}"


def read_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(none)"


def ci_runs_it(cmd: Command, tmp: Path, env: dict[str, str]) -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert cmd.text in ci, f".ci/run no longer calls `{cmd.text}`: run it here or teach this test"
    pytest.skip(f"`{cmd.text}` is what CI runs (.ci/run calls it): the suite cannot run itself")


def covered_by(test_file: str, marker: str, reason: str) -> Callable[[Command, Path, dict[str, str]], None]:
    """A command another test runs in its own way: the test must exist and still do it."""

    def check(cmd: Command, tmp: Path, env: dict[str, str]) -> None:
        assert marker in (ROOT / test_file).read_text(), f"{test_file} no longer runs `{marker}`"
        pytest.skip(f"{reason}; {test_file} covers it")

    return check


def not_run(reason: str) -> Callable[[Command, Path, dict[str, str]], None]:
    def skip(cmd: Command, tmp: Path, env: dict[str, str]) -> None:
        pytest.skip(reason)

    return skip


def stopped_after_flwr_run(cmd: Command, tmp: Path, env: dict[str, str]) -> None:
    assert cmd == stop_superlink_command()
    pytest.skip("stops flwr run's SuperLink: run after every flwr run command (test_command[...flwr run...])")


CLUSTER = "a Ray cluster of several machines (`<head-ip>`, `ray start` on each)"
#: (what the command looks like, how it is handled); the first match wins. Teach a new command here.
RULES: list[tuple[re.Pattern[str], Callable[[Command, Path, dict[str, str]], None]]] = [
    (re.compile(r"^bash scripts/test\.sh$"), ci_runs_it),
    (re.compile(r"^bash scripts/run_main\.sh$"), run_main_script),
    (re.compile(r"^kill \$PID$"), stopped_after_flwr_run),
    (re.compile(r"^ray start "), covered_by("tests/integration/conftest.py", '"--head"', CLUSTER)),
    (re.compile(r"^(RAY_ADDRESS=\S+ flower-superlink|flwr run \. <connection>)"),
     not_run(CLUSTER + " and a SuperLink started in it; no test runs it")),
    (re.compile(r"^python -m apps\.main .*simulation\.ray_address="),
     covered_by("tests/integration/test_ray_cluster.py", "simulation.ray_address=", CLUSTER)),
    (re.compile(r"^(\.venv/bin/)?python -m apps\.main( [^<>]*)?$"), run_hydra_command),
    (re.compile(r"^(\.venv/bin/)?flwr run \. [^<>]*$"), run_flwr_command),
]  # fmt: skip


def rule_for(cmd: Command) -> Callable[[Command, Path, dict[str, str]], None]:
    for pattern, handler in RULES:
        if pattern.search(cmd.text):
            return handler
    pytest.fail(f"{cmd.where}: no rule runs `{cmd.text}`: teach tests/integration/test_readme_commands.py (RULES) "
                "how to run it at a small size")  # fmt: skip


@pytest.mark.parametrize("cmd", PARAMS)
def test_command(cmd: Command, short_tmp: Path) -> None:
    """The documented command runs at a small size and leaves its outputs where the overrides put them."""
    handler = rule_for(cmd)
    env = fresh_shell_env(short_tmp)
    before = outputs_in_checkout()
    try:
        handler(cmd, short_tmp, env)
    finally:
        kill_processes_mentioning(str(short_tmp))
    assert outputs_in_checkout() == before, "the command wrote into the checkout's default output dirs"


# --- the Python examples ---------------------------------------------------------------------------------------

#: Runs each given example file in this process: the dataset sizes of TINY become defaults of every strategy built
#: (a keyword the example sets wins), a ServerApp program (``app = ServerApp()``) is called on Flower's message
#: path without Ray (tests/helpers.InProcessGrid: every message through Flower's serde to the real ClientApp).
RUNNER = """
import sys
from flwr.app import Context, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from strategies.base import FederatedStrategy
from strategies.client_level_dp import RegisteredDP
from tests.helpers import InProcessGrid

def _tiny(cls):
    init = cls.__init__
    def tiny_init(self, config=None, /, **kwargs):
        if config is None:
            kwargs = {"max_train_samples": 1000, "max_test_samples": 200, **kwargs}
        init(self, config, **kwargs)
    cls.__init__ = tiny_init
_tiny(FederatedStrategy)
_tiny(RegisteredDP)  # a named DP strategy composes its config before its algorithm is built
TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # what Flower sets in a ServerApp process

for path in sys.argv[1:]:
    print(f"=== {path}", flush=True)
    grid = InProcessGrid(nodes=2)
    namespace = {"__name__": "example"}
    exec(compile(open(path).read(), path, "exec"), namespace)
    if "app" in namespace:
        namespace["app"](grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))
    print(f"=== done {path}", flush=True)
"""


def python_examples() -> list[tuple[str, str]]:
    """(where, source) of every Python program of docs/architecture.md (a ServerApp: ``app = ServerApp()``). The
    other Python blocks, README.md's excerpt of this program included, are checked against the code and tests
    they come from in tests/test_doc_commands.py."""
    blocks = python_blocks(ROOT / "docs/architecture.md", ROOT)
    return [(f"{b.path}:{b.line}", b.text) for b in blocks if "ServerApp()" in b.text]


@pytest.mark.slow
def test_python_examples(short_tmp: Path) -> None:
    """docs/architecture.md's own ServerApp runs as written (its 20 rounds), in a fresh temp dir;
    tests/integration/test_user_server_app.py runs such a ServerApp on Flower's Ray engine."""
    examples = python_examples()
    assert examples, "docs/architecture.md has no ServerApp program any more: update this test"
    files = []
    for i, (where, source) in enumerate(examples):
        path = short_tmp / f"example{i}.py"
        path.write_text(f"# {where}\n{source}")
        files.append(str(path))
    (short_tmp / "runner.py").write_text(RUNNER)
    env = fresh_shell_env(short_tmp)
    env["PYTHONPATH"] = str(ROOT)  # the runner's tests.helpers; the examples import the installed project
    try:
        proc = subprocess.run([str(BIN / "python"), "runner.py", *files], cwd=short_tmp, env=env,
                              capture_output=True, text=True, timeout=400)  # fmt: skip
    finally:
        kill_processes_mentioning(str(short_tmp))
    assert proc.returncode == 0, f"{examples}\n{log_of(proc)}"
    for path in files:
        assert f"=== done {path}" in proc.stdout, log_of(proc)
    assert "client-level (" in proc.stdout, log_of(proc)  # the ServerApp's own print of its guarantee


def flwr_run_overrides(cmd: Command) -> list[str]:
    """The Hydra overrides a ``flwr run`` command's run-config makes, sized."""
    from flwr.common.config import parse_config_args

    words = shlex.split(sized_flwr_run(cmd.text, Path("/tmp/x")))
    return overrides_from_run_config(parse_config_args([words[words.index("--run-config") + 1]]))


def test_documented_configs_are_valid() -> None:
    """Every Hydra and ``flwr run`` command of the docs composes to a valid config, sized (each job of a sweep),
    slow-marked ones included: a renamed key or an out-of-range value fails here in the default run."""
    checked = 0
    for cmd in COMMANDS:
        handler = rule_for(cmd)
        if handler in (run_hydra_command, run_main_script):
            jobs = hydra_jobs(cmd)
            assert "--multirun" in cmd.text or len(jobs) == 1
        elif handler is run_flwr_command:
            jobs = [flwr_run_overrides(cmd)]
        else:
            continue
        for job in jobs:
            config = compose_config(job)
            assert config.num_rounds == 1 and config.dataset.num_clients == 10, (cmd.where, job)
            checked += 1
    assert checked >= 8, checked
