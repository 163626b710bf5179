"""Local training loop of a federated client: SGD or SAM/ASAM over E epochs of the client's data.

docs/algorithms.md, "Local training". Local optimizer: SGD with momentum 0.5, weight decay 5e-4 and a per-round decayed
learning rate η_t = η · decay^(t−1) (released DP-FedSAM code), or SAM (DP-FedSAM journal Eqs. 8–9; Foret et al., 2021) /
ASAM (Kwon et al., 2021) wrapped around that SGD, with two forward/backward passes per step on the same batch and
BatchNorm statistics frozen during the perturbed pass. K = E · ⌈n/B⌉ local steps (the last partial batch included),
optionally capped by ``max_steps``.

Divergence (docs/mechanisms.md, 5): a client whose loss turns non-finite stops at once and reports ``diverged=True`` so
the caller can report failure instead of sending a NaN update.

Nothing here knows about differential privacy: clipping and noise happen on the update, elsewhere.

The local procedure of Noisy-FedAvg / Noisy-FedProx is clients/noisy_training.py's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from clients.sam import SAM, frozen_batchnorm_stats
from fl_app.core.choices import NoisySchedule
from fl_app.instructions import LocalTrainingConfig, NoisyLocalConfig
from fl_app.models import to_compute_layout

__all__ = [
    "LocalTrainingConfig",
    "LocalTrainingResult",
    "NoisyLocalConfig",
    "NoisySchedule",
    "local_lr",
    "sgd_kernels",
    "train_local",
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


@dataclass
class Progress:
    """What a local procedure's steps have seen so far: the summed loss and the right predictions, accumulated on
    the device (one transfer at the end, beyond the per-step finiteness check), the samples and steps, and whether
    it stopped on a non-finite value."""

    loss_sum: torch.Tensor
    correct: torch.Tensor
    seen: int = 0
    num_steps: int = 0
    diverged: bool = False

    @classmethod
    def on(cls, device: torch.device, loss_dtype: torch.dtype | None = None) -> Progress:
        return cls(torch.zeros((), device=device, dtype=loss_dtype), torch.zeros((), device=device, dtype=torch.long))

    def add(self, data_loss: torch.Tensor, logits: torch.Tensor, yb: torch.Tensor, batch: int) -> None:
        """One step's batch of ``batch`` samples: its mean loss ``data_loss`` and its ``logits`` against ``yb``."""
        with torch.no_grad():
            self.loss_sum += data_loss.detach() * batch
            self.correct += (logits.argmax(dim=1) == yb).sum()
        self.seen += batch
        self.num_steps += 1


def _result(params: list[torch.Tensor], progress: Progress, n: int) -> LocalTrainingResult:
    """The outcome of a local procedure; weights that became non-finite count as diverged."""
    loss_sum, correct, seen, num_steps, diverged = (
        progress.loss_sum, progress.correct, progress.seen, progress.num_steps, progress.diverged
    )
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


#: An empty client cannot train: zero weight in any example-weighted metric average.
EMPTY_CLIENT = LocalTrainingResult(loss=0.0, accuracy=0.0, num_examples=0, num_steps=0, diverged=False)


def place_for_training(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device
) -> tuple[int, torch.Tensor, torch.Tensor] | None:
    """The n samples on ``device`` (one transfer: a client's shard is small, hundreds to a few thousand images,
    so it beats one per batch) and the model there in its compute layout, in train mode; None for an empty client.
    ValueError when x and y disagree on n."""
    n = int(x.shape[0])
    if int(y.shape[0]) != n:
        raise ValueError(f"x has {n} samples but y has {int(y.shape[0])}")
    if n == 0:
        return None
    to_compute_layout(model, device)
    model.train()
    return n, x.to(device), y.to(device=device, dtype=torch.long)


def _local_optimizer(
    params: list[torch.nn.Parameter], config: LocalTrainingConfig, lr: float, device: torch.device
) -> torch.optim.Optimizer:
    """SGD with momentum and weight decay at step size ``lr``, wrapped in SAM for ``optimizer=sam``; the kernels are
    :func:`sgd_kernels`'."""
    if config.optimizer == "sam":
        return SAM(
            params,
            torch.optim.SGD,
            rho=config.rho,
            adaptive=config.adaptive,
            lr=lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            **sgd_kernels(device),
        )
    return torch.optim.SGD(
        params, lr=lr, momentum=config.momentum, weight_decay=config.weight_decay, **sgd_kernels(device)
    )


def _train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sam: SAM | None,
    xb: torch.Tensor,
    yb: torch.Tensor,
    total_loss: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One local step on (xb, yb) — SGD, or SAM's two passes — returning the batch's data loss and logits; None,
    with the weights unmoved, when a loss is not finite."""
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
    # Checked every step, before the weights move: stopping at once keeps the model at its last finite weights
    # (docs/mechanisms.md, 5). This costs one host sync per step, which is negligible next to a client's handful
    # of local steps; deferring it would let NaN reach the weights and momentum buffers.
    if not bool(finite):
        if sam is not None:
            sam.restore()
        return None
    if sam is not None:
        sam.second_step(zero_grad=False)
    else:
        optimizer.step()
    return data_loss, logits


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

    The optimizer is built per call (momentum buffers start from zero every round, as in the released code), with
    :func:`sgd_kernels`' kernels (fused on the CPU): the weights are bit for bit those of torch's per-tensor loop.
    """
    if (placed := place_for_training(model, x, y, device)) is None:
        return EMPTY_CLIENT
    n, x_dev, y_dev = placed
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _local_optimizer(params, config, local_lr(config.lr, config.lr_decay, server_round), device)
    sam = optimizer if isinstance(optimizer, SAM) else None

    def total_loss(data_loss: torch.Tensor) -> torch.Tensor:
        return data_loss if extra_loss is None else data_loss + extra_loss(model)

    total_steps = config.epochs * math.ceil(n / config.batch_size)
    if config.max_steps is not None:
        total_steps = min(total_steps, config.max_steps)

    progress = Progress.on(device)
    while progress.num_steps < total_steps and not progress.diverged:
        # Shuffle on the generator's device so the permutation depends on nothing but its seed.
        perm = torch.randperm(n, generator=generator, device=generator.device).to(device)
        for start in range(0, n, config.batch_size):
            if progress.num_steps >= total_steps:
                break
            idx = perm[start : start + config.batch_size]
            xb, yb = x_dev[idx], y_dev[idx]
            stepped = _train_step(model, optimizer, sam, xb, yb, total_loss)
            if stepped is None:
                progress.diverged = True
                break
            progress.add(*stepped, yb, int(yb.shape[0]))

    optimizer.zero_grad(set_to_none=True)
    return _result(params, progress, n)
