"""fl_app/core/quiet_import.py: the accounting imports Opacus without the root logging handler Opacus installs, so
that Flower's lines are not printed twice (and its DEBUG lines not at all) in a process with a bare root logger, as
the ServerApp and ClientApp processes of ``flwr run`` have."""

from __future__ import annotations

import subprocess
import sys

from bench.processes import ROOT

ROOT_HANDLERS = "import logging; print(len(logging.getLogger().handlers), logging.getLogger().level)"


def _fresh(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_opacus_alone_installs_a_root_handler() -> None:
    assert _fresh(f"import opacus.accountants; {ROOT_HANDLERS}").split() == ["1", "30"]  # what the guard undoes


def test_the_accounting_leaves_the_root_logger_bare() -> None:
    accounted = "from fl_app.privacy.accountants import compute_epsilon; compute_epsilon(0.95, 0.2, 3, 0.02, 'prv')"
    assert _fresh(f"{accounted}; compute_epsilon(0.95, 0.2, 3, 0.02); {ROOT_HANDLERS}").split() == ["0", "30"]
