"""Importing a library without the root logging handler it installs at import.

Opacus calls ``logging.basicConfig`` when it is imported (``opacus/utils/module_utils.py``). In a process whose root
logger has no handler yet — the ServerApp and ClientApp processes of ``flwr run`` — that adds one, and every Flower
record then propagates to it as well as to Flower's own console handler: each line printed twice, and Flower's DEBUG
records (which its own handler filters out) printed too. :func:`import_opacus` imports it once with the root logger
restored afterwards; the accounting code calls it before its (lazy) imports of Opacus.
"""

from __future__ import annotations

import functools
import importlib
import logging


@functools.cache
def import_opacus() -> None:
    """Import Opacus once, leaving the root logger's handlers and level as they were."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        importlib.import_module("opacus.accountants")
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)
