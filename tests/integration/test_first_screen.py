"""The first screen of a front door: what ``flwr run`` against a ``--simulation`` SuperLink prints (its ServerApp,
Flower's engine and the ClientApps on Ray's workers, streamed back), checked line by line by
:func:`first_screen_problems` (also applied to the README's ``flwr run`` command in test_readme_commands.py, the
Hydra front door and a longer ``flwr run`` in test_simulation.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.conftest import SMALL, flwr_run_simulation

ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Ray's prefix on a worker's forwarded line: ``(ClientAppActor pid=123) ``; the process a line comes from.
RAY_SOURCE = re.compile(r"^(\((?:[\w:]+ )?pid=\d+(?:, ip=[\d.]+)?\)) ?")
#: Flower's console format (``INFO :      message``).
FLOWER_LEVEL = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*:\s*")
#: ``logging.basicConfig``'s format as Opacus sets it (``11/27/2026 23:18:12:DEBUG:message``), or the default one
#: (``DEBUG:flwr:message``): a root handler beside Flower's own, which prints every Flower record a second time.
ROOT_HANDLER = re.compile(r"^(\d\d/\d\d/\d{4} \d\d:\d\d:\d\d:)?(DEBUG|INFO|WARNING|ERROR|CRITICAL):")
#: Hydra's job-logging format (``[2026-11-29 05:44:43,059][flwr][WARNING] - message``): its root handler.
HYDRA_HANDLER = re.compile(r"^\[[\d-]+ [\d:]+,\d+\]\[[\w.]+\]\[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\] - ")


def first_screen_problems(output: str) -> list[str]:
    """What is wrong with a front door's output, one entry a problem (none: a clean screen).

    - *printed twice*: the same message from the same process (the driver, or one Ray worker by its pid) on two
      lines. Blank lines and Flower's empty ``INFO :`` lines are the only legitimately repeated ones: every other
      line our front doors print names a round, a setting or a process. (Two handlers on one record — Flower's and
      a root handler — print it twice, in two formats: both normalise to the same message.)
    - *root handler*: a line in ``logging.basicConfig``'s format.
    - *DEBUG*: a DEBUG record in any format.
    - *FutureWarning*: Ray's (or anyone's) FutureWarning.
    - *inner sampling*: Flower's ``configure_train: Sampled N nodes`` (our strategies draw the sample themselves).
    """
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for raw in output.splitlines():
        line = ANSI.sub("", raw).rstrip()
        source_match = RAY_SOURCE.match(line)
        source = source_match.group(1) if source_match else "driver"
        text = line[source_match.end() :] if source_match else line
        if ROOT_HANDLER.match(text) or HYDRA_HANDLER.match(text):
            problems.append(f"root handler: {line}")
        if text.startswith("DEBUG") or (ROOT_HANDLER.match(text) and ":DEBUG:" in f":{text}"):
            problems.append(f"DEBUG: {line}")
        if "FutureWarning" in text:
            problems.append(f"FutureWarning: {line}")
        if "configure_train: Sampled" in text:
            problems.append(f"inner sampling: {line}")
        message = HYDRA_HANDLER.sub("", ROOT_HANDLER.sub("", FLOWER_LEVEL.sub("", text))).strip()
        if not message:
            continue
        if (source, message) in seen:
            problems.append(f"printed twice: {line}")
        seen.add((source, message))
    return problems


def test_the_checker_finds_each_problem_and_nothing_else() -> None:
    clean = (
        "\x1b[92mINFO \x1b[0m:      Run output directory: /tmp/x\n"
        "\x1b[92mINFO \x1b[0m:      \n\x1b[92mINFO \x1b[0m:      \n"
        "\x1b[36m(ClientAppActor pid=1)\x1b[0m \x1b[93mWARNING \x1b[0m:   Manually terminating ClientAppActor\n"
        "\x1b[36m(ClientAppActor pid=2)\x1b[0m \x1b[93mWARNING \x1b[0m:   Manually terminating ClientAppActor\n"
    )
    assert first_screen_problems(clean) == []
    doubled = "INFO :      [round 1/2] eps 0.9\n11/27/2026 23:18:12:INFO:[round 1/2] eps 0.9\n"
    assert [p.split(":")[0] for p in first_screen_problems(doubled)] == ["root handler", "printed twice"]
    hydra = "WARNING :   Distributed DP: weak\n[2026-11-29 05:44:43,059][flwr][WARNING] - Distributed DP: weak\n"
    assert [p.split(":")[0] for p in first_screen_problems(hydra)] == ["root handler", "printed twice"]
    assert [p.split(":")[0] for p in first_screen_problems("11/27/2026 23:18:12:DEBUG:Initialising: RayBackend")] == [
        "root handler",
        "DEBUG",
    ]
    assert first_screen_problems("DEBUG :     Pre-registering run")[0].startswith("DEBUG")
    warned = "/x/ray/_private/worker.py:2051: FutureWarning: Tip: ... RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0"
    assert first_screen_problems(warned)[0].startswith("FutureWarning")
    assert first_screen_problems("INFO :      configure_train: Sampled 10 nodes (out of 10)")[0].startswith("inner")


# Slow: in the default suite the README's own `flwr run` command is held to the same checks
# (tests/integration/test_readme_commands.py::run_flwr_command), one run fewer.
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(300)
def test_flwr_run_prints_a_clean_first_screen(short_tmp: Path, shared_superlink: tuple) -> None:
    out = short_tmp / "flwr_out"
    proc = flwr_run_simulation(shared_superlink, f"num_rounds=1 overrides='{' '.join(SMALL)}' output_dir='{out}'")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "[round 1/1]" in output and "Population: 50 clients" in output  # the screen is the run's
    assert first_screen_problems(output) == [], output
