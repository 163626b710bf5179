"""matplotlib for the project's figures: the headless Agg backend, imported only when a figure is drawn (the
figures are optional: without matplotlib the tools write their data and skip them)."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (ImportError without matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
