"""The GPU physical limit: one round's clients trained all at once with ``torch.func``, no Flower, no Ray.

A plain PyTorch loop like bench/baseline.py — same sampled clients, same data and mini-batch shuffles (the
generator of each client is replayed), same local SGD (momentum, weight decay, η_t = η·decay^(t−1)) or SAM /
ASAM (``client.adaptive``), same global-norm clipping to C, fixed denominator m, noise stream and server step —
but local training runs every sampled client of the round at once: the model's parameters are stacked K times
(one copy per client) and each local step is one ``vmap(grad(loss))`` over the stack, with ``functional_call``
running the model on each client's own weights and batch. This is what a GPU needs to be busy with a round of
small clients; it does not import clients/ (the app's cohort engine), so it is an independent reference.

Unequal clients: clients are sorted by their number of local steps K_i = E·⌈n_i/B⌉, longest first, so the clients
still training at step s are a prefix of the stack and step s computes only that prefix (no padded steps). A
client whose batch at step s is the short last batch of an epoch has it padded to B with zero-weight samples;
the loss is the weighted mean over its real samples, so its gradient is exactly its own batch's.

Clipping and the sum of the clipped updates run on the device in float64 (norms over the whole flattened update,
factor min(1, C/‖Δ‖)); the average, the noise and the server step are bench/baseline.py's own
(:func:`fl_app.privacy.mechanisms.uniform_average`, :func:`bench.baseline.server_step`) on the host. The result
equals bench/baseline.py's to float tolerance (batched kernels and float64 clipping change the last bits).

Models with buffers (BatchNorm running statistics) are refused; the default models (GroupNorm) have none.

``python -m bench.batched [hydra overrides] --device cuda --out result.json`` (``--device cpu`` works too).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from bench.baseline import (
    BaselineResult,
    check_supported,
    denominator,
    partition_indices,
    sampled_partitions,
    server_step,
    shuffle_generator,
)
from fl_app.config import AppConfig, compose_config
from fl_app.data.datasets import load_dataset
from fl_app.models import build_model_for_dataset, get_weights, weight_names
from fl_app.privacy import mechanisms as mech
from fl_app.threads import library_thread_counts, limit_library_threads

Params = dict[str, torch.Tensor]

#: clients per chunk when the float64 norms and sums of the stacked updates are formed (bounds the float64 copy)
_CLIP_CHUNK = 16


@dataclass
class BatchedResult(BaselineResult):
    device: str = "cpu"
    #: per round, the number of local steps of the longest client (the number of batched steps run)
    steps_per_round: list[int] = field(default_factory=list)


def client_batches(n: int, epochs: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """The mini-batches (local indices) bench/baseline.py draws for a client of n samples: one ``randperm`` of the
    generator per epoch, cut into ⌈n/B⌉ batches (the last one short)."""
    batches: list[torch.Tensor] = []
    if n == 0:
        return batches
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator)
        batches.extend(perm[start : start + batch_size] for start in range(0, n, batch_size))
    return batches


def active_counts(steps_desc: Sequence[int]) -> list[int]:
    """For clients sorted by step count, longest first: how many still train at step s = 0 .. max−1."""
    if any(a < b for a, b in itertools.pairwise(steps_desc)):
        raise ValueError("step counts must be sorted longest first")
    longest = steps_desc[0] if steps_desc else 0
    return [sum(1 for k in steps_desc if k > s) for s in range(longest)]


def stack_schedule(
    schedules: Sequence[Sequence[torch.Tensor]], indices: Sequence[np.ndarray], batch_size: int
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Dense step plan for clients sorted by step count (longest first).

    ``schedules[i]`` are client i's mini-batches (local indices), ``indices[i]`` its training-set indices. Returns
    (``index`` S×K×B int64 training-set indices, ``weight`` S×K×B float32 with 1 for a real sample and 0 for
    padding, ``active`` the prefix length per step). Padding and steps past a client's end point at sample 0
    with weight 0.
    """
    steps = [len(s) for s in schedules]
    active = active_counts(steps)
    shape = (len(active), len(schedules), batch_size)
    index = np.zeros(shape, dtype=np.int64)
    weight = np.zeros(shape, dtype=np.float32)
    for i, (batches, rows) in enumerate(zip(schedules, indices, strict=True)):
        for s, batch in enumerate(batches):
            local = batch.numpy()
            index[s, i, : len(local)] = rows[local]
            weight[s, i, : len(local)] = 1.0
    return torch.from_numpy(index), torch.from_numpy(weight), active


def _stacked_grad(model: nn.Module) -> Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor], Params]:
    """vmap over clients of ∇_w of the weighted mean cross-entropy of one client's batch."""

    def loss(params: Params, xb: torch.Tensor, yb: torch.Tensor, wb: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, params, (xb,))
        return (F.cross_entropy(logits, yb, reduction="none") * wb).sum() / wb.sum()

    return vmap(grad(loss))  # type: ignore[no-any-return]


def _view(scale: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-client scalar [k] shaped to broadcast against a stacked tensor [k, ...]."""
    return scale.view(-1, *([1] * (like.dim() - 1)))


def train_stacked(
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    index: torch.Tensor,
    weight: torch.Tensor,
    active: Sequence[int],
    config: AppConfig,
    server_round: int,
    use_sam: bool,
) -> None:
    """Local training of K stacked clients in place on ``params`` (name → K×...), as docs/algorithms.md states it.

    Step s trains the first ``active[s]`` clients on ``x[index[s, :k]]`` with sample weights ``weight[s, :k]``:
    SGD with momentum and weight decay as ``torch.optim.SGD`` (buf ← μ·buf + g + λw, w ← w − η·buf), with the
    SAM / ASAM gradient taken at w + e on the same batch.
    """
    c = config.client
    lr = c.lr * c.lr_decay ** (server_round - 1)
    stacked_grad = _stacked_grad(model)
    momentum = {name: torch.zeros_like(p) for name, p in params.items()}
    for s, k in enumerate(active):
        rows, wb = index[s, :k], weight[s, :k]
        xb, yb = x[rows], y[rows]
        current = {name: p[:k] for name, p in params.items()}
        grads = stacked_grad(current, xb, yb, wb)
        if use_sam:
            if c.adaptive:
                sq = [(current[n].abs() * g).flatten(1).square().sum(1) for n, g in grads.items()]
            else:
                sq = [g.flatten(1).square().sum(1) for g in grads.values()]
            scale = c.rho / (torch.stack(sq).sum(0).sqrt() + 1e-12)
            perturbed = {}
            for n, g in grads.items():
                e = g * _view(scale, g)
                if c.adaptive:
                    e = e * current[n].square()
                perturbed[n] = current[n] + e
            grads = stacked_grad(perturbed, xb, yb, wb)
        with torch.no_grad():
            for n, g in grads.items():
                buf = momentum[n][:k]
                buf.mul_(c.momentum).add_(g.add(current[n], alpha=c.weight_decay))
                current[n].add_(buf, alpha=-lr)


def clipped_sum(
    params: Params, global_params: Params, clip_norm: float | None
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Σ_i min(1, C/‖Δ_i‖)·Δ_i in float64 over the stacked clients (Δ_i = w_i − w), and the norms ‖Δ_i‖.

    ``clip_norm=None`` sums the updates unclipped (non-private recipes)."""
    names = list(params)
    count = next(iter(params.values())).shape[0]
    norms_sq = torch.zeros(count, dtype=torch.float64, device=next(iter(params.values())).device)
    for start in range(0, count, _CLIP_CHUNK):
        part = slice(start, start + _CLIP_CHUNK)
        for n in names:
            delta = (params[n][part] - global_params[n]).double()
            norms_sq[part] += delta.flatten(1).square().sum(1)
    norms = norms_sq.sqrt()
    # A zero update: C/0 = inf, clamped to 1.
    factors = torch.ones_like(norms) if clip_norm is None else torch.clamp(clip_norm / norms, max=1.0)
    totals = [torch.zeros(global_params[n].shape, dtype=torch.float64, device=norms.device) for n in names]
    for start in range(0, count, _CLIP_CHUNK):
        part = slice(start, start + _CLIP_CHUNK)
        for total, n in zip(totals, names, strict=True):
            delta = (params[n][part] - global_params[n]).double()
            total += torch.tensordot(factors[part], delta, dims=1)
    return totals, norms


def run_batched(
    config: AppConfig,
    num_rounds: int | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> BatchedResult:
    """Train ``config`` for ``num_rounds`` (default ``config.num_rounds``) rounds, each round's clients at once
    (``dtype``: the model's and the data's, as in :func:`bench.baseline.run_baseline`)."""
    use_sam, private = check_supported(config)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device is available to torch on this machine")
    limit_library_threads(torch.get_num_threads())
    d, p, c = config.dataset, config.privacy, config.client
    train, _ = load_dataset(d.name, d.data_dir, download=d.download)
    model = build_model_for_dataset(config.model.name, d.name, seed=config.seed).to(device=device, dtype=dtype)
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        raise ValueError(f"the batched loop needs a model without buffers (BatchNorm statistics); found {buffers[:3]}")
    names = weight_names(model)
    if names != [name for name, _ in model.named_parameters()]:
        raise ValueError("the exchanged weights must be exactly the model's parameters")
    model.train()
    weights = get_weights(model, dtype)
    shapes = [tuple(w.shape) for w in weights]
    x_all = train.x.to(device=device, dtype=dtype)
    y_all = train.y.to(device=device, dtype=torch.long)
    m = denominator(config)
    result = BatchedResult(weights=weights, device=device)
    for t in range(1, (config.num_rounds if num_rounds is None else num_rounds) + 1):
        t0 = time.perf_counter()
        sampled = sampled_partitions(config, t)
        rows = {pid: partition_indices(config, pid) for pid in sampled}
        schedules = {
            pid: client_batches(len(rows[pid]), c.local_epochs, c.batch_size, shuffle_generator(config, t, pid))
            for pid in sampled
        }
        # Longest first (ties: partition order); clients with no data have no steps and a zero update.
        order = sorted((pid for pid in sampled if schedules[pid]), key=lambda pid: (-len(schedules[pid]), pid))
        global_params = {n: torch.from_numpy(w).to(device) for n, w in zip(names, weights, strict=True)}
        if order:
            index, weight, active = stack_schedule(
                [schedules[pid] for pid in order], [rows[pid] for pid in order], c.batch_size
            )
            index, weight = index.to(device), weight.to(device)
            params = {n: w.unsqueeze(0).repeat(len(order), *([1] * w.dim())) for n, w in global_params.items()}
            train_stacked(model, params, x_all, y_all, index, weight, active, config, t, use_sam)
            totals, _ = clipped_sum(params, global_params, p.clip_norm if private else None)
            total_arrays = [total.cpu().numpy() for total in totals]
            result.steps_per_round.append(len(active))
        else:
            total_arrays = [np.zeros(shape, dtype=np.float64) for shape in shapes]
            result.steps_per_round.append(0)
        count = m if private else max(len(sampled), 1)
        average = mech.uniform_average([total_arrays], count, shapes)
        weights = server_step(config, weights, average, t, private)
        result.round_seconds.append(time.perf_counter() - t0)
        result.clients_per_round.append(len(sampled))
    result.weights = weights
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.batched [hydra overrides] --device cpu|cuda --threads N --out result.json``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of conf/config.yaml, as for apps.main")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True, help="JSON result; the model goes next to it (.npz)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    limit_library_threads(torch.get_num_threads())
    result = run_batched(compose_config(args.overrides), device=args.device)
    weights_file = args.out.with_suffix(".npz")
    np.savez(weights_file, *result.weights)
    summary = {
        "round_seconds": result.round_seconds,
        "clients_per_round": result.clients_per_round,
        "steps_per_round": result.steps_per_round,
        "threads": torch.get_num_threads(),
        "library_threads": library_thread_counts(),
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
        "weights_file": str(weights_file),
    }
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
