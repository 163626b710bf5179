"""The directory the integration tests hand ``flwr run``: a copy of the checkout's own files, which packages to the
same FAB as ``flwr run .`` without Flower walking the checkout's virtualenv.

Flower 1.42 builds a FAB by listing every file under the app directory (``flwr.cli.utils.collect_files``) and only
then filtering the list with .gitignore and its include rules: 5.7 s of CPU for the checkout's 44,016 files, 42,631
of them in ``.venv`` (bench/results/2026-11-28-2core-p1), paid by every ``flwr run .``. The copy holds the files git
tracks or would track (``git ls-files --cached --others --exclude-standard``: the same .gitignore rules), so the FAB,
and the app every run installs from it, are those of the checkout. The README's own ``flwr run .`` commands run as
written (tests/integration/test_readme_commands.py).
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench.processes import ROOT


@functools.cache
def app_dir() -> Path:
    """The copy, made once per test process and removed when it exits."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    dest = Path(tempfile.mkdtemp(prefix="dpfs_app", dir="/tmp"))
    atexit.register(shutil.rmtree, dest, ignore_errors=True)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not part of the app
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest
