"""The local procedure of Noisy-FedAvg / Noisy-FedProx (seed 004, App. B Alg. 1, Eqs. 2 and 4; docs/algorithms.md,
"Definitions of the baselines"): :func:`train_local_noisy` runs K plain-SGD steps with the minibatch gradient
clipped to V and a scheduled step size :func:`noisy_step_lr`. The Gaussian noise it is released with
(w_{i,K,t} + N(0, σ²I)) is added by the caller, not here."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn

from clients.training import EMPTY_CLIENT, LocalTrainingResult, Progress, _data_loss, _result, place_for_training
from fl_app.core.choices import NOISY_SCHEDULES, NoisySchedule
from fl_app.instructions import NoisyLocalConfig

__all__ = ["noisy_minibatches", "noisy_step_lr", "train_local_noisy"]


def noisy_step_lr(lr: float, schedule: NoisySchedule, k: int, t: int, K: int) -> float:
    """Step size η_{k,t} of seed 004 (Thm 3 schedules) for local step k and 0-based round index t.

    - ``constant``:   η = μ
    - ``cyclic``:     η = μ / (k + 1)          (decays within a round, restarts every round)
    - ``stagewise``:  η = μ / (t + 1)          (constant within a round, decays across rounds)
    - ``continuous``: η = μ / (t·K + k + 1)    (decays over the global step count)

    ``k`` = 0..K−1 is the local step and ``t`` ≥ 0 the 0-based round index of the paper; Flower's server round
    r ≥ 1 maps to t = r − 1 (so round 1 starts with η = μ under every schedule).
    """
    if not (lr > 0.0 and math.isfinite(lr)):
        raise ValueError(f"lr must be finite and > 0, got {lr}")
    if K < 1:
        raise ValueError(f"K must be >= 1, got {K}")
    if not 0 <= k < K:
        raise ValueError(f"k must be in [0, K) = [0, {K}), got {k}")
    if t < 0:
        raise ValueError(f"t must be >= 0 (0-based round index, t = server_round - 1), got {t}")
    if schedule == "constant":
        return lr
    if schedule == "cyclic":
        return lr / (k + 1)
    if schedule == "stagewise":
        return lr / (t + 1)
    if schedule == "continuous":
        return lr / (t * K + k + 1)
    raise ValueError(f"schedule must be one of {NOISY_SCHEDULES}, got {schedule!r}")


def _gradient(
    data_loss: torch.Tensor, params: list[torch.nn.Parameter], device: torch.device
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """∇f(w; ξ) per parameter (zeros where unused), its global L2 norm, and whether the loss and norm are finite."""
    if not params:
        return [], torch.zeros((), device=device), torch.isfinite(data_loss)
    grads = torch.autograd.grad(data_loss, params, allow_unused=True)
    g = [torch.zeros_like(p) if gi is None else gi for p, gi in zip(params, grads, strict=True)]
    grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(gi, 2) for gi in g]), 2)
    return g, grad_norm, torch.isfinite(data_loss) & torch.isfinite(grad_norm)


def _clipped_prox_step(
    params: list[torch.nn.Parameter],
    g: list[torch.Tensor],
    grad_norm: torch.Tensor,
    grad_clip: float,
    alpha: float,
    anchor: list[torch.Tensor],
    lr: float,
) -> None:
    """w ← w − η (g / max(1, ‖g‖/V) + α (w − w_t)), in place (the prox term only for α > 0)."""
    # g / max(1, ‖g‖/V): exact formula, no epsilon (clip_grad_norm_ adds 1e-6 to the norm).
    # When ‖g‖ ≤ V the divisor is exactly 1, so the unclipped gradient is used bit for bit.
    denom = torch.clamp(grad_norm / grad_clip, min=1.0)
    for i, (p, gi) in enumerate(zip(params, g, strict=True)):
        step = gi / denom.to(device=gi.device, dtype=gi.dtype)
        if alpha > 0.0:
            step = step + alpha * (p - anchor[i])
        p.add_(step, alpha=-lr)


def noisy_minibatches(
    n: int, b: int, steps: int, generator: torch.Generator, device: torch.device
) -> Iterator[torch.Tensor]:
    """``steps`` minibatches of b indices: a permutation of the n samples is drawn from ``generator`` (on its
    device, so that it depends on nothing but its seed) and consumed in consecutive chunks of b; when fewer than b
    indices are left, the rest is dropped and a fresh permutation is drawn. So every minibatch has exactly b
    distinct samples (uniformly without replacement), consecutive minibatches of one pass are disjoint, and the
    number of steps does not depend on n."""
    perm = torch.randperm(n, generator=generator, device=generator.device).to(device)
    pos = 0
    for _ in range(steps):
        if pos + b > n:
            perm = torch.randperm(n, generator=generator, device=generator.device).to(device)
            pos = 0
        yield perm[pos : pos + b]
        pos += b


def train_local_noisy(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: NoisyLocalConfig,
    server_round: int,
    generator: torch.Generator,
    device: torch.device,
) -> LocalTrainingResult:
    """Local procedure of Noisy-FedAvg (seed 004 Eq. 2) / Noisy-FedProx (Eq. 4), App. B Algorithm 1.

    From the model's current weights w_t (the round's global model; a detached copy is kept for the prox term),
    for k = 0..K−1 with t = ``server_round`` − 1::

        g = ∇f(w; ξ)                      mean cross-entropy on a minibatch ξ of size B
        g ← g / max(1, ‖g‖ / V)           clip to V on the global L2 norm over all trainable parameters
        g ← g + α (w − w_t)               FedProx only (α = ``prox_coef``), added *after* clipping as in Eq. 4
        w ← w − η_{k,t} g                 η_{k,t} = :func:`noisy_step_lr`

    The step is plain SGD: no momentum and no weight decay (the privacy analysis of seed 004 assumes exactly
    this update), and no learning-rate decay other than the schedule.

    Minibatches of b = min(B, n) distinct samples: :func:`noisy_minibatches`.

    Divergence (docs/mechanisms.md, 5; same semantics as :func:`train_local`): if the loss, or the norm of the minibatch
    gradient, is non-finite, training stops before moving the weights and the result has ``diverged=True``,
    ``loss`` NaN and ``num_steps`` equal to the steps taken; weights that overflow on a finite step are
    reported as diverged too.

    Returns loss/accuracy averaged over all samples seen (on the unclipped forward pass), ``num_examples`` = n,
    ``num_steps`` = K unless diverged; the model in train mode on ``device``, no gradients stored. No noise here.
    """
    if server_round < 1:
        raise ValueError(f"server_round must be >= 1 (Flower rounds start at 1), got {server_round}")
    if (placed := place_for_training(model, x, y, device)) is None:
        return EMPTY_CLIENT
    n, x_dev, y_dev = placed
    model.zero_grad(set_to_none=True)
    t = server_round - 1
    K = config.steps
    b = min(config.batch_size, n)
    alpha = config.prox_coef
    params = [p for p in model.parameters() if p.requires_grad]
    anchor = [p.detach().clone() for p in params] if alpha > 0.0 else []

    # float64 so the average is exact to the last bit of a float32 loss, whatever the model's dtype.
    progress = Progress.on(device, torch.float64)
    for k, idx in enumerate(noisy_minibatches(n, b, K, generator, device)):
        xb, yb = x_dev[idx], y_dev[idx]
        data_loss, logits = _data_loss(model, xb, yb)
        g, grad_norm, finite = _gradient(data_loss, params, device)
        # One host sync per step, before the weights move (docs/mechanisms.md, 5), as in train_local.
        if not bool(finite):
            progress.diverged = True
            break
        lr = noisy_step_lr(config.lr, config.schedule, k, t, K)
        with torch.no_grad():
            _clipped_prox_step(params, g, grad_norm, config.grad_clip, alpha, anchor, lr)
        progress.add(data_loss, logits, yb, b)
    return _result(params, progress, n)
