"""Loss landscape around a saved global model: ``python -m fl_app.landscape RUN_DIR [RUN_DIR ...]``.

The DP-FedSAM papers compare the loss surfaces of the global models of DP-FedAvg and DP-FedSAM (their Figs. 1
and 3): DP-FedSAM's surface is flatter around the solution. We draw them as Li et al.
(2018), "Visualizing the Loss Landscape of Neural Nets" (NeurIPS), Sect. 4, with *filter-normalised* random
directions:

- for every parameter tensor ``w`` a Gaussian direction ``d`` (same shape) is drawn from an explicit
  ``torch.Generator`` seeded by ``--seed`` (on the CPU, in ``model.parameters()`` order, so the draws do not
  depend on the device);
- for tensors with ≥ 2 dimensions every *filter* — each slice along dim 0: a conv output channel, a row of a
  linear layer — is rescaled to the norm of the corresponding filter of ``w``: ``d_i ← d_i · ‖w_i‖ / ‖d_i‖``;
- biases and other 1-D parameters (GroupNorm/BatchNorm affine weights) get a zero direction: Li et al.'s
  ``ignore='biasbn'`` option, which their figures use. They are still drawn (then zeroed), as in Li et al.'s code,
  so the draw sequence is the same whatever is zeroed. Buffers (e.g. BatchNorm running statistics, absent from
  the default GroupNorm models) are not perturbed.

1-D: the loss at ``w + a·d`` for ``a`` in ``linspace(-span, span, points)``; 2-D: the loss at ``w + a·d1 + b·d2``
on a ``points × points`` grid (``d1`` then ``d2`` from the same generator). The loss is the mean cross-entropy
(and the accuracy) on the first ``--samples`` test images, via :func:`clients.training.evaluate`. Every run gets
its own filter-normalised directions from the *same* generator seed — the same Gaussian draws, normalised to its
own weights — which is what makes the side-by-side DP-FedAvg / DP-FedSAM plots comparable; the same ``--seed``
reproduces them exactly.

Outputs in ``--out`` (default ``<first run dir>/landscape/``): ``landscape.npz`` (grid, 1-D and 2-D losses and
accuracies per run), ``landscape_1d.png``, ``landscape_2d.png`` (contours side by side, one shared colour scale) and
``landscape.json`` (per run: centre loss/accuracy and sharpness proxies — the largest and mean loss increase over
the 1-D segment and the 2-D grid, and the 1-D curvature at the centre by central differences).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fl_app.core.choices import DEVICES
from fl_app.landscape_plots import plot_1d, plot_2d
from fl_app.models import evaluate

__all__ = [
    "LoadedRun",
    "filter_normalized_direction",
    "load_run",
    "loss_surface_1d",
    "loss_surface_2d",
    "main",
    "sharpness_summary",
    "symmetric_grid",
]

Direction = list[torch.Tensor]
WeightsLike = nn.Module | Sequence[torch.Tensor | np.ndarray]


# --- pure functions ----------------------------------------------------------------------------------------------


def _weight_tensors(model_or_weights: WeightsLike) -> list[torch.Tensor]:
    if isinstance(model_or_weights, nn.Module):
        return [p.detach() for p in model_or_weights.parameters()]
    return [w.detach() if isinstance(w, torch.Tensor) else torch.as_tensor(np.asarray(w)) for w in model_or_weights]


def filter_normalized_direction(model_or_weights: WeightsLike, generator: torch.Generator) -> Direction:
    """A random direction shaped like the model's parameters, filter-normalised as in Li et al. (2018).

    ``model_or_weights``: a module (its ``parameters()``) or a list of tensors/arrays in that order. Returns
    float32 CPU tensors; 1-D tensors (biases, norm-layer affines) get zeros. ``generator`` must be a CPU generator;
    it is advanced by one Gaussian draw per parameter entry.
    """
    direction = []
    for w in _weight_tensors(model_or_weights):
        d = torch.randn(tuple(w.shape), generator=generator, dtype=torch.float32)
        if w.dim() <= 1:
            d.zero_()
        else:
            w_norm = w.to(device="cpu", dtype=torch.float32).reshape(w.shape[0], -1).norm(dim=1)
            d_norm = d.reshape(d.shape[0], -1).norm(dim=1)
            d = d * (w_norm / (d_norm + 1e-10)).reshape(-1, *([1] * (w.dim() - 1)))
        direction.append(d)
    return direction


def symmetric_grid(span: float, points: int) -> np.ndarray:
    """``linspace(-span, span, points)`` with the centre exactly 0 when ``points`` is odd (the unperturbed model)."""
    if points < 2 or span <= 0:
        raise ValueError(f"need points >= 2 and span > 0, got points={points}, span={span}")
    grid = np.linspace(-span, span, points)
    if points % 2:
        grid[points // 2] = 0.0
    return grid


def _surface(
    model: nn.Module,
    directions: Sequence[Direction],
    coords: Sequence[Sequence[float]],
    x: torch.Tensor,
    y: torch.Tensor,
    device: torch.device,
    batch_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Loss and accuracy at ``w + Σ_k c_k · d_k`` for every coordinate tuple ``c``; the weights are restored."""
    model.to(device)
    params = list(model.parameters())
    for k, direction in enumerate(directions):
        if len(direction) != len(params):
            raise ValueError(f"direction {k} has {len(direction)} tensors, the model {len(params)} parameters")
        for i, (d, p) in enumerate(zip(direction, params, strict=True)):
            if tuple(d.shape) != tuple(p.shape):
                raise ValueError(f"direction {k}, tensor {i}: shape {tuple(d.shape)} != parameter {tuple(p.shape)}")
    origin = [p.detach().clone() for p in params]
    dirs = [
        [d.to(device=p.device, dtype=p.dtype) for d, p in zip(direction, params, strict=True)]
        for direction in directions
    ]
    losses = np.empty(len(coords))
    accs = np.empty(len(coords))
    try:
        for n, c in enumerate(coords):
            with torch.no_grad():
                for i, (p, o) in enumerate(zip(params, origin, strict=True)):
                    target = o.clone()
                    for coef, direction in zip(c, dirs, strict=True):
                        target.add_(direction[i], alpha=float(coef))
                    p.copy_(target)
            losses[n], accs[n] = evaluate(model, x, y, device, batch_size)
    finally:
        with torch.no_grad():
            for p, o in zip(params, origin, strict=True):
                p.copy_(o)
    return losses, accs


def loss_surface_1d(
    model: nn.Module,
    direction: Direction,
    alphas: Sequence[float] | np.ndarray,
    x: torch.Tensor,
    y: torch.Tensor,
    device: torch.device | str = "cpu",
    batch_size: int = 1024,
) -> tuple[np.ndarray, np.ndarray]:
    """(losses, accuracies), each of shape ``(len(alphas),)``, at ``w + a·d``; the model's weights are restored
    afterwards (it is left on ``device``). At ``a = 0`` the weights are exactly ``w``."""
    coords = [(float(a),) for a in alphas]
    return _surface(model, [direction], coords, x, y, torch.device(device), batch_size)


def loss_surface_2d(
    model: nn.Module,
    directions: tuple[Direction, Direction],
    alphas: Sequence[float] | np.ndarray,
    betas: Sequence[float] | np.ndarray,
    x: torch.Tensor,
    y: torch.Tensor,
    device: torch.device | str = "cpu",
    batch_size: int = 1024,
) -> tuple[np.ndarray, np.ndarray]:
    """(losses, accuracies), each ``len(alphas) × len(betas)``, at ``w + a·d1 + b·d2`` (row = a, column = b);
    the model's weights are restored afterwards."""
    coords = [(float(a), float(b)) for a in alphas for b in betas]
    losses, accs = _surface(model, list(directions), coords, x, y, torch.device(device), batch_size)
    shape = (len(alphas), len(betas))
    return losses.reshape(shape), accs.reshape(shape)


def sharpness_summary(
    alphas: np.ndarray,
    losses_1d: np.ndarray,
    losses_2d: np.ndarray | None,
    center_loss: float,
    center_accuracy: float,
) -> dict[str, float | None]:
    """Flatness proxies of one run's surfaces, relative to the loss at the saved model itself.

    ``max/mean_increase``: max/mean of ``L − L(w)`` over the segment or grid; ``curvature_1d``: central second
    difference ``(L(h) − 2L(0) + L(−h)) / h²`` at the centre (None when 0 is not on the grid).
    """
    summary: dict[str, float | None] = {
        "center_loss": float(center_loss),
        "center_accuracy": float(center_accuracy),
        "max_increase_1d": float(np.max(losses_1d) - center_loss),
        "mean_increase_1d": float(np.mean(losses_1d) - center_loss),
        "curvature_1d": None,
        "max_increase_2d": None,
        "mean_increase_2d": None,
    }
    zero = np.flatnonzero(alphas == 0.0)
    if zero.size and 0 < zero[0] < len(alphas) - 1:
        i = int(zero[0])
        h = float(alphas[i + 1] - alphas[i])
        if np.isclose(h, alphas[i] - alphas[i - 1]):
            summary["curvature_1d"] = float((losses_1d[i + 1] - 2 * losses_1d[i] + losses_1d[i - 1]) / h**2)
    if losses_2d is not None:
        summary["max_increase_2d"] = float(np.max(losses_2d) - center_loss)
        summary["mean_increase_2d"] = float(np.mean(losses_2d) - center_loss)
    return summary


# --- I/O ---------------------------------------------------------------------------------------------------------


@dataclass
class LoadedRun:
    """A run's final global model and what is needed to evaluate it."""

    path: Path
    strategy: str
    model: nn.Module
    dataset: str
    data_dir: str | None
    download: bool


def _config_of(meta: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The run's config as ``run.json`` stores it (``AppConfig.to_dict()``, validated when the run wrote it): only its
    seed, dataset and model are read here, fields every version of the config has carried."""
    config = meta.get("config")
    if not isinstance(config, dict):
        raise ValueError(f"{run_dir}/run.json has no config")
    return config


def load_run(run_dir: Path) -> LoadedRun:
    """Rebuild the model of ``run_dir/run.json``'s config and load ``final_model.npz`` into it."""
    from fl_app.models import build_model_for_dataset, set_weights, weight_names

    meta_path, model_path = run_dir / "run.json", run_dir / "final_model.npz"
    for p in (meta_path, model_path):
        if not p.exists():
            raise FileNotFoundError(f"{p} not found (is {run_dir} a finished run directory?)")
    config = _config_of(json.loads(meta_path.read_text()), run_dir)
    dataset = config["dataset"]
    model = build_model_for_dataset(config["model"]["name"], dataset["name"], int(config["seed"]))
    names = weight_names(model)
    with np.load(model_path) as arrays:
        absent = [n for n in names if n not in arrays.files]
        if absent:
            raise ValueError(f"{model_path} lacks {absent[:3]}{'...' if len(absent) > 3 else ''} for this model")
        set_weights(model, [arrays[n] for n in names])
    return LoadedRun(
        path=run_dir,
        strategy=str(config.get("strategy", {}).get("name", run_dir.name)),
        model=model,
        dataset=str(dataset["name"]),
        data_dir=dataset.get("data_dir"),
        download=bool(dataset.get("download", False)),
    )


def _labels(runs: Sequence[LoadedRun]) -> list[str]:
    labels = [r.strategy for r in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{r.strategy} ({r.path.name})" for r in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{r.strategy} ({r.path})" for r in runs]
    return labels


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fl_app.landscape",
        description="Loss landscape around saved global models (Li et al. 2018 filter-normalised directions).",
    )
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="run directories to compare")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: <first run>/landscape)")
    parser.add_argument("--points", type=int, default=21, help="grid points per axis, odd (default 21)")
    parser.add_argument("--span", type=float, default=1.0, help="the grid covers [-span, span] (default 1)")
    parser.add_argument("--samples", type=int, default=1000, help="first N test images (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the direction generator (default 0)")
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--no-2d", action="store_true", help="skip the 2-D surface (points² evaluations per run)")
    args = parser.parse_args(argv)
    if args.points < 3 or args.points % 2 == 0:
        parser.error("--points must be odd and >= 3 (the centre is the saved model)")
    if args.span <= 0 or args.samples < 1:
        parser.error("--span must be > 0 and --samples >= 1")
    return args


@dataclass
class _Surfaces:
    """Every run's surfaces on the grid: the 1-D losses and accuracies, the 2-D ones (unless skipped), summaries."""

    losses_1d: list[np.ndarray] = field(default_factory=list)
    accs_1d: list[np.ndarray] = field(default_factory=list)
    losses_2d: list[np.ndarray] = field(default_factory=list)
    accs_2d: list[np.ndarray] = field(default_factory=list)
    summaries: list[dict[str, Any]] = field(default_factory=list)


def _surfaces(runs: Sequence[LoadedRun], labels: Sequence[str], args: argparse.Namespace, grid: np.ndarray,
              device: torch.device) -> _Surfaces:  # fmt: skip
    """Each run's directions from the same generator seed, and its surfaces along them on its first test images."""
    from fl_app.data.datasets import load_dataset

    found = _Surfaces()
    for run, label in zip(runs, labels, strict=True):
        _, test = load_dataset(run.dataset, run.data_dir, download=run.download)
        x, y = test.x[: args.samples], test.y[: args.samples]
        generator = torch.Generator().manual_seed(args.seed)
        d1 = filter_normalized_direction(run.model, generator)
        d2 = filter_normalized_direction(run.model, generator)
        center_loss, center_acc = evaluate(run.model, x, y, device)
        l1, a1 = loss_surface_1d(run.model, d1, grid, x, y, device)
        found.losses_1d.append(l1)
        found.accs_1d.append(a1)
        l2 = None
        if not args.no_2d:
            l2, a2 = loss_surface_2d(run.model, (d1, d2), grid, grid, x, y, device)
            found.losses_2d.append(l2)
            found.accs_2d.append(a2)
        summary = sharpness_summary(grid, l1, l2, center_loss, center_acc)
        found.summaries.append({"run_dir": str(run.path), "label": label, "strategy": run.strategy, **summary})
        print(f"{label}: centre loss {center_loss:.4f} (acc {center_acc:.4f}), max 1-D increase "
              f"{summary['max_increase_1d']:.4f}", file=sys.stderr)  # fmt: skip
    return found


def _write(out_dir: Path, runs: Sequence[LoadedRun], labels: list[str], grid: np.ndarray, found: _Surfaces,
           info: dict[str, Any]) -> list[str]:  # fmt: skip
    """landscape.npz, landscape.json and the plots (skipped without matplotlib) in ``out_dir``; the names written."""
    arrays: dict[str, np.ndarray] = {
        "alphas": grid,
        "labels": np.array(labels),
        "run_dirs": np.array([str(r.path) for r in runs]),
        "center_loss": np.array([s["center_loss"] for s in found.summaries]),
        "losses_1d": np.stack(found.losses_1d),
        "accuracies_1d": np.stack(found.accs_1d),
    }
    if found.losses_2d:
        arrays.update(betas=grid, losses_2d=np.stack(found.losses_2d), accuracies_2d=np.stack(found.accs_2d))
    np.savez(out_dir / "landscape.npz", **arrays)  # type: ignore[arg-type]
    (out_dir / "landscape.json").write_text(json.dumps({**info, "runs": found.summaries}, indent=2) + "\n")
    written = ["landscape.npz", "landscape.json"]
    try:
        plot_1d(grid, arrays["losses_1d"], arrays["accuracies_1d"], labels, out_dir / "landscape_1d.png")
        written.append("landscape_1d.png")
        if found.losses_2d:
            plot_2d(grid, arrays["losses_2d"], labels, out_dir / "landscape_2d.png")
            written.append("landscape_2d.png")
        else:  # do not leave an earlier 2-D plot next to this run's data
            (out_dir / "landscape_2d.png").unlink(missing_ok=True)
    except ImportError as exc:
        print(f"warning: plots skipped ({exc}); install matplotlib", file=sys.stderr)
    return written


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    from fl_app.data.datasets import DatasetUnavailableError

    try:
        runs = [load_run(d) for d in args.run_dirs]
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    device = _device(args.device)
    grid = symmetric_grid(args.span, args.points)
    labels = _labels(runs)
    out_dir: Path = args.out or args.run_dirs[0] / "landscape"
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        found = _surfaces(runs, labels, args, grid, device)
    except DatasetUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    info = {
        "method": "Li et al. 2018 filter-normalised random directions, biases/1-D parameters zeroed",
        "seed": args.seed,
        "span": args.span,
        "points": args.points,
        "samples": args.samples,
        "device": str(device),
    }
    written = _write(out_dir, runs, labels, grid, found, info)
    print(json.dumps(found.summaries, indent=2))
    print(f"wrote {', '.join(written)} to {out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
