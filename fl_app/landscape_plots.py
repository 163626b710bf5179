"""The loss-landscape figures of ``python -m fl_app.landscape`` (fl_app/landscape.py): the 1-D curves of loss and
accuracy, and the 2-D contours side by side on one colour scale."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fl_app.plotting import pyplot


def plot_1d(alphas: np.ndarray, losses: np.ndarray, accs: np.ndarray, labels: Sequence[str], path: Path) -> Path:
    plt = pyplot()
    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(12, 4.5))
    for loss, acc, label in zip(losses, accs, labels, strict=True):
        ax_l.plot(alphas, loss, label=label)
        ax_a.plot(alphas, 100 * acc, label=label)
    ax_l.set_ylabel("test loss (cross-entropy)")
    ax_a.set_ylabel("test accuracy (%)")
    for ax in (ax_l, ax_a):
        ax.set_xlabel("a  (w + a·d, filter-normalised d)")
        ax.axvline(0.0, color="grey", linewidth=0.8, linestyle=":")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("1-D loss landscape around the final global model")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_2d(grid: np.ndarray, losses: np.ndarray, labels: Sequence[str], path: Path) -> Path:
    """Contours side by side on one colour scale, so flatter basins are comparable at a glance."""
    plt = pyplot()
    n = len(labels)
    fig, axes = plt.subplots(1, n, figsize=(5 * n + 1.5, 4.8), squeeze=False, layout="constrained")
    finite = losses[np.isfinite(losses)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    levels = np.linspace(lo, hi if hi > lo else lo + 1e-6, 25)
    a, b = np.meshgrid(grid, grid, indexing="ij")
    filled = None
    for ax, surface, label in zip(axes[0], losses, labels, strict=True):
        filled = ax.contourf(b, a, surface, levels=levels, cmap="viridis", extend="both")
        lines = ax.contour(b, a, surface, levels=levels[::3], colors="white", linewidths=0.6)
        ax.clabel(lines, fontsize=6, fmt="%.2f")
        ax.plot([0], [0], marker="*", color="red", markersize=10)
        ax.set_title(label)
        ax.set_xlabel("b (d2)")
        ax.set_ylabel("a (d1)")
        ax.set_aspect("equal")
    if filled is not None:
        fig.colorbar(filled, ax=axes[0].tolist(), label="test loss")
    fig.suptitle("2-D loss landscape (filter-normalised directions, shared colour scale)")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
