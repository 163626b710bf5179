"""Local training loop of a federated client: SGD or SAM/ASAM over E epochs of the client's data.

docs/algorithms.md, "Local training". Local optimizer: SGD with momentum 0.5, weight decay 5e-4 and a per-round decayed
learning rate η_t = η · decay^(t−1) (released DP-FedSAM code), or SAM (DP-FedSAM journal Eqs. 8–9; Foret et al., 2021) /
ASAM (Kwon et al., 2021) wrapped around that SGD, with two forward/backward passes per step on the same batch and
BatchNorm statistics frozen during the perturbed pass. K = E · ⌈n/B⌉ local steps (the last partial batch included),
optionally capped by ``max_steps``.

Divergence (docs/mechanisms.md, 5): a client whose loss turns non-finite stops at once and reports ``diverged=True`` so
the caller can report failure instead of sending a NaN update.

Nothing here knows about differential privacy: clipping and noise happen on the update, elsewhere.

Also the local procedure of Noisy-FedAvg / Noisy-FedProx (seed 004, App. B Alg. 1, Eqs. 2 and 4;
docs/algorithms.md, "Definitions of the baselines"): :func:`train_local_noisy` runs K plain-SGD steps with the minibatch
gradient clipped to V and a scheduled step size :func:`noisy_step_lr`. The Gaussian noise it is released with (w_{i,K,t}
+ N(0, σ²I)) is added by the caller, not here. """

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from clients.sam import SAM, frozen_batchnorm_stats
from fl_app.core.choices import NOISY_SCHEDULES, NoisySchedule
from fl_app.instructions import LocalTrainingConfig, NoisyLocalConfig
from fl_app.models import to_compute_layout

__all__ = [
    "LocalTrainingConfig",
    "LocalTrainingResult",
    "NoisyLocalConfig",
    "NoisySchedule",
    "local_lr",
    "noisy_step_lr",
    "sgd_kernels",
    "train_local",
    "train_local_noisy",
]

ExtraLoss = Callable[[nn.Module], torch.Tensor]


@dataclass(frozen=True)
class LocalTrainingResult:
    """Outcome of :func:`train_local`.

    ``loss``/``accuracy`` are the cross-entropy and accuracy averaged over every training sample processed
    (for SAM: on the first, unperturbed pass; ``extra_loss`` terms excluded so numbers are comparable across
    algorithms). ``num_examples`` is the client's dataset size n (what Flower reports as ``num_examples``);
    ``num_steps`` counts the optimizer steps actually taken. When ``diverged`` is true, ``loss`` is NaN and
    the model holds the last finite weights: no step was taken with the non-finite gradient.
    """

    loss: float
    accuracy: float
    num_examples: int
    num_steps: int
    diverged: bool


def local_lr(base_lr: float, lr_decay: float, server_round: int) -> float:
    """η_t = η · decay^(t−1) for server round t ≥ 1 (docs/algorithms.md; the released code's per-round decay).

    Exponent t − 1 so that round 1 (Flower numbers rounds from 1) trains with the configured η.
    """
    if server_round < 1:
        raise ValueError(f"server_round must be >= 1 (Flower rounds start at 1), got {server_round}")
    return base_lr * lr_decay ** (server_round - 1)


def sgd_kernels(device: torch.device | str) -> dict[str, bool]:
    """The keyword that picks ``torch.optim.SGD``'s kernels for local training on ``device``: the one place that
    decides it (the app, SAM's base step, the benchmark's compute limit and the pfl-research replay take it here).

    On the CPU the fused kernel (one vectorized pass over each tensor for weight decay, momentum and the update):
    ~0.3 ms a step against ~0.9 ms for the multi-tensor ``foreach`` kernels and ~0.8 ms for torch's default
    per-tensor loop over the paper CNN's 1.7M weights on one thread, of a ~16 ms step. It computes the same
    elementwise operations in the same order, so the weights are bit for bit those of the per-tensor loop
    (tests/clients/test_training.py). Elsewhere the ``foreach`` kernels, whose CUDA results the GPU tests pin.
    """
    return {"fused": True} if torch.device(device).type == "cpu" else {"foreach": True}


def _data_loss(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean cross-entropy on a batch, and the logits (for accuracy)."""
    logits = model(xb)
    return F.cross_entropy(logits, yb), logits


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether no tensor holds NaN or ±Inf. On the CPU through NumPy on the same memory: torch's ``isfinite`` and
    ``all`` take ~2.5 ms over the paper CNN's 1.7M weights on one thread, NumPy's ~0.13 ms (a client's whole local
    training is ~70 ms at P2's size, so the torch check alone was ~3% of it)."""
    with torch.no_grad():
        if all(t.device.type == "cpu" for t in tensors):
            return all(bool(np.isfinite(t.detach().numpy()).all()) for t in tensors)
        return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def _result(
    params: list[torch.Tensor],
    diverged: bool,
    loss_sum: torch.Tensor,
    correct: torch.Tensor,
    seen: int,
    n: int,
    num_steps: int,
) -> LocalTrainingResult:
    """The outcome of a local procedure; weights that became non-finite count as diverged."""
    if not diverged and params:
        # A last step with finite loss can still overflow the weights; never report them as a success.
        diverged = not _all_finite(params)
    if diverged:
        accuracy = correct.item() / seen if seen else 0.0
        return LocalTrainingResult(loss=math.nan, accuracy=accuracy, num_examples=n, num_steps=num_steps, diverged=True)
    return LocalTrainingResult(
        loss=loss_sum.item() / seen,
        accuracy=correct.item() / seen,
        num_examples=n,
        num_steps=num_steps,
        diverged=False,
    )


def train_local(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: LocalTrainingConfig,
    server_round: int,
    generator: torch.Generator,
    device: torch.device,
    extra_loss: ExtraLoss | None = None,
) -> LocalTrainingResult:
    """Train ``model`` in place on (x, y) for E epochs of ⌈n/B⌉ mini-batches each (docs/algorithms.md).

    Args:
        model: the network; moved to ``device`` in its compute layout (:func:`fl_app.models.to_compute_layout`)
            and left in train mode with gradients cleared.
        x: inputs, already normalised, N×C×H×W (any device; moved to ``device`` once).
        y: integer class labels, shape N.
        config: local hyper-parameters.
        server_round: current round t ≥ 1, for the learning-rate decay :func:`local_lr`.
        generator: the only source of randomness (the per-epoch shuffles), so runs are reproducible.
        device: where to compute.
        extra_loss: optional regulariser R(model) added to the loss on every pass (both SAM passes), e.g. a
            proximal term.

    The optimizer is built per call, so momentum buffers start from zero every round, as in the released code.
    Its kernels are :func:`sgd_kernels`' (fused on the CPU): the weights are bit for bit those of torch's
    per-tensor loop.
    """
    n = int(x.shape[0])
    if int(y.shape[0]) != n:
        raise ValueError(f"x has {n} samples but y has {int(y.shape[0])}")
    if n == 0:
        # An empty client cannot train; zero weight in any example-weighted metric average.
        return LocalTrainingResult(loss=0.0, accuracy=0.0, num_examples=0, num_steps=0, diverged=False)

    to_compute_layout(model, device)
    model.train()
    # A client's shard is small (hundreds to a few thousand images), so one transfer beats one per batch.
    x_dev = x.to(device)
    y_dev = y.to(device=device, dtype=torch.long)

    lr = local_lr(config.lr, config.lr_decay, server_round)
    params = [p for p in model.parameters() if p.requires_grad]
    sam: SAM | None = None
    optimizer: torch.optim.Optimizer
    if config.optimizer == "sam":
        sam = SAM(
            params,
            torch.optim.SGD,
            rho=config.rho,
            adaptive=config.adaptive,
            lr=lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            **sgd_kernels(device),
        )
        optimizer = sam
    else:
        optimizer = torch.optim.SGD(
            params, lr=lr, momentum=config.momentum, weight_decay=config.weight_decay, **sgd_kernels(device)
        )

    def total_loss(data_loss: torch.Tensor) -> torch.Tensor:
        return data_loss if extra_loss is None else data_loss + extra_loss(model)

    steps_per_epoch = math.ceil(n / config.batch_size)
    total_steps = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)

    # Accumulated on device; only one transfer at the end (beyond the per-step finiteness check).
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    seen = 0
    num_steps = 0
    diverged = False

    while num_steps < total_steps and not diverged:
        # Shuffle on the generator's device so the permutation depends on nothing but its seed.
        perm = torch.randperm(n, generator=generator, device=generator.device).to(device)
        for start in range(0, n, config.batch_size):
            if num_steps >= total_steps:
                break
            idx = perm[start : start + config.batch_size]
            xb, yb = x_dev[idx], y_dev[idx]

            optimizer.zero_grad(set_to_none=True)
            data_loss, logits = _data_loss(model, xb, yb)
            loss = total_loss(data_loss)
            loss.backward()
            finite = torch.isfinite(loss)
            if sam is not None:
                sam.first_step(zero_grad=True)
                with frozen_batchnorm_stats(model):
                    perturbed_loss = total_loss(_data_loss(model, xb, yb)[0])
                    perturbed_loss.backward()
                finite = finite & torch.isfinite(perturbed_loss)
            # Checked every step, before the weights move: stopping at once keeps the model at its last finite
            # weights (docs/mechanisms.md, 5). This costs one host sync per step, which is negligible next to a client's
            # handful of local steps; deferring it would let NaN reach the weights and momentum buffers.
            if not bool(finite):
                if sam is not None:
                    sam.restore()
                diverged = True
                break
            if sam is not None:
                sam.second_step(zero_grad=False)
            else:
                optimizer.step()

            with torch.no_grad():
                loss_sum += data_loss.detach() * yb.shape[0]
                correct += (logits.argmax(dim=1) == yb).sum()
            seen += int(yb.shape[0])
            num_steps += 1

    optimizer.zero_grad(set_to_none=True)
    return _result(params, diverged, loss_sum, correct, seen, n, num_steps)


# --- Noisy-FedAvg / Noisy-FedProx (seed 004, App. B Algorithm 1) ----------------------------------------------


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

    Minibatches: a permutation of the n samples is drawn from ``generator`` at the start of the call and
    consumed in consecutive chunks of b = min(B, n) indices; when fewer than b indices are left, the rest is
    dropped and a fresh permutation is drawn. So every minibatch has exactly b distinct samples (uniformly
    without replacement), consecutive minibatches of one pass are disjoint, and K does not depend on n.

    Divergence (docs/mechanisms.md, 5; same semantics as :func:`train_local`): if the loss, or the norm of the minibatch
    gradient, is non-finite, training stops before moving the weights and the result has ``diverged=True``,
    ``loss`` NaN and ``num_steps`` equal to the steps taken; weights that overflow on a finite step are
    reported as diverged too.

    Returns a :class:`LocalTrainingResult`: loss/accuracy averaged over all samples seen (on the unclipped
    forward pass), ``num_examples`` = n, ``num_steps`` = K unless diverged. The model is left in train mode
    on ``device`` with no gradients stored. The noise of the release is the caller's business.
    """
    if server_round < 1:
        raise ValueError(f"server_round must be >= 1 (Flower rounds start at 1), got {server_round}")
    n = int(x.shape[0])
    if int(y.shape[0]) != n:
        raise ValueError(f"x has {n} samples but y has {int(y.shape[0])}")
    if n == 0:
        return LocalTrainingResult(loss=0.0, accuracy=0.0, num_examples=0, num_steps=0, diverged=False)

    to_compute_layout(model, device)
    model.train()
    model.zero_grad(set_to_none=True)
    x_dev = x.to(device)
    y_dev = y.to(device=device, dtype=torch.long)

    t = server_round - 1
    K = config.steps
    b = min(config.batch_size, n)
    alpha = config.prox_coef
    params = [p for p in model.parameters() if p.requires_grad]
    anchor = [p.detach().clone() for p in params] if alpha > 0.0 else []

    # float64 so the average is exact to the last bit of a float32 loss, whatever the model's dtype.
    loss_sum = torch.zeros((), device=device, dtype=torch.float64)
    correct = torch.zeros((), device=device, dtype=torch.long)
    seen = 0
    num_steps = 0
    diverged = False

    def new_perm() -> torch.Tensor:
        # Drawn on the generator's device so the permutation depends on nothing but its seed.
        return torch.randperm(n, generator=generator, device=generator.device).to(device)

    perm = new_perm()
    pos = 0
    for k in range(K):
        if pos + b > n:
            perm = new_perm()
            pos = 0
        idx = perm[pos : pos + b]
        pos += b
        xb, yb = x_dev[idx], y_dev[idx]

        data_loss, logits = _data_loss(model, xb, yb)
        if params:
            grads = torch.autograd.grad(data_loss, params, allow_unused=True)
            g = [torch.zeros_like(p) if gi is None else gi for p, gi in zip(params, grads, strict=True)]
            grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(gi, 2) for gi in g]), 2)
            finite = torch.isfinite(data_loss) & torch.isfinite(grad_norm)
        else:
            g, grad_norm, finite = [], torch.zeros((), device=device), torch.isfinite(data_loss)
        # One host sync per step, before the weights move (docs/mechanisms.md, 5), as in train_local.
        if not bool(finite):
            diverged = True
            break

        lr = noisy_step_lr(config.lr, config.schedule, k, t, K)
        with torch.no_grad():
            # g / max(1, ‖g‖/V): exact formula, no epsilon (clip_grad_norm_ adds 1e-6 to the norm).
            # When ‖g‖ ≤ V the divisor is exactly 1, so the unclipped gradient is used bit for bit.
            denom = torch.clamp(grad_norm / config.grad_clip, min=1.0)
            for i, (p, gi) in enumerate(zip(params, g, strict=True)):
                step = gi / denom.to(device=gi.device, dtype=gi.dtype)
                if alpha > 0.0:
                    step = step + alpha * (p - anchor[i])
                p.add_(step, alpha=-lr)
            loss_sum += data_loss.detach() * b
            correct += (logits.argmax(dim=1) == yb).sum()
        seen += b
        num_steps += 1

    return _result(params, diverged, loss_sum, correct, seen, n, num_steps)
