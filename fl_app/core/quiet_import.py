"""Importing a library without the root logging handler it installs at import.

Opacus calls ``logging.basicConfig`` when it is imported (``opacus/utils/module_utils.py``). In a process whose root
logger has no handler yet — the ServerApp and ClientApp processes of ``flwr run``, a user's ``run_simulation`` —
that adds one, and every Flower record then propagates to it as well as to Flower's own console handler: each line
printed twice, and Flower's DEBUG records (which its own handler filters out) printed too. :func:`import_opacus`
imports it once with the root logger holding a handler that prints nothing, so that ``basicConfig`` (a no-op on a
root logger with a handler) adds none: removing the handler after the import would leave a window of seconds
(Opacus imports torch) in which the other threads' records — Flower's simulation engine runs beside the ServerApp's
thread — reach it. The accounting code calls it before its (lazy) imports of Opacus; once Opacus is imported, no
later import of it runs ``basicConfig`` again.
"""

from __future__ import annotations

import functools
import importlib
import logging


@functools.cache
def import_opacus() -> None:
    """Import Opacus once, leaving the root logger's handlers and level as they were."""
    root = logging.getLogger()
    level = root.level
    placeholder = logging.NullHandler()
    if not root.handlers:  # otherwise basicConfig is a no-op already
        root.addHandler(placeholder)
    try:
        importlib.import_module("opacus.accountants")
    finally:
        root.removeHandler(placeholder)
        root.setLevel(level)
