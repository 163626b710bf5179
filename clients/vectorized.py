"""Local training of many clients at once: stacked copies of one model under ``torch.func`` (vmap + grad).

The same local procedures as :mod:`clients.training`, run for a whole cohort of clients in one batched
computation instead of one client after another — the way to fill a GPU with a round of small clients:

* :func:`train_stacked` — docs/algorithms.md, "Local training": E epochs of ⌈n_i/B⌉ mini-batches (``max_steps`` caps
  K_i), SGD with momentum, weight decay and the round's learning rate η_t, or SAM / ASAM around it (journal Eqs. 8–9;
  two gradients on the same batch, the step taken from the unperturbed weights), optionally with a regulariser such as
  BLUR (both SAM passes, as :func:`clients.training.train_local` adds ``extra_loss``);
* :func:`train_stacked_noisy` — the Noisy-FedAvg / Noisy-FedProx local steps (seed 004 App. B Alg. 1): K plain
  SGD steps, the minibatch gradient clipped to V on the global norm, the prox term after clipping.

Every client draws exactly the mini-batches :mod:`clients.training` would draw from the same generator (the
schedules are built by :func:`batch_schedule` / :func:`noisy_batch_schedule`, which replay those loops'
``randperm`` calls), so client i's result equals the per-client path's to float tolerance. (The batched kernels
round differently from one client's: in float64 the two agree to ~1e-15; in float32 a ReLU / max-pool network can
occasionally see a pre-activation within rounding of its kink fall on the other side in the two paths, after which
the client's weights differ by more, 1e-4 to 1e-2 after a few steps; see tests/clients/test_vectorized.py.)

Unequal clients, no padded steps: clients are sorted by their number of local steps, longest first, so the clients
still training at step s are a prefix of the stack and step s computes only those. Within a step, a client whose
batch is the short last batch of its epoch gets its batch padded to the step's width with zero-weight samples
(the loss is the weighted mean over its real samples, so its gradient is exactly its own batch's).

Divergence (docs/mechanisms.md, 5), with the per-client path's rules: a client whose loss (either SAM pass; for the
noisy steps also the gradient norm) turns non-finite stops at its last weights — its later steps are computed but never
applied — and is reported ``diverged`` alone; so is one whose weights turned non-finite on a step with a finite loss.
The others are untouched. Nothing syncs with the host inside the loop.

Models with buffers (BatchNorm running statistics) are refused: their per-client statistics would need a
per-client train-mode state that vmap does not give. GroupNorm models (no buffers) work. Nothing here knows about
differential privacy or federation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from clients.noisy_training import noisy_minibatches, noisy_step_lr
from clients.training import LocalTrainingConfig, LocalTrainingResult, NoisyLocalConfig, local_lr
from fl_app.models import check_vectorizable

__all__ = [
    "StackedRegularizer",
    "batch_schedule",
    "check_vectorizable",
    "noisy_batch_schedule",
    "train_stacked",
    "train_stacked_noisy",
]

Params = dict[str, torch.Tensor]
#: R(w_i, w_ref) for one client's parameters (a dict) and the round's reference weights; vmapped over clients.
StackedRegularizer = Callable[[Params, Params], torch.Tensor]


def batch_schedule(n: int, config: LocalTrainingConfig, generator: torch.Generator) -> list[torch.Tensor]:
    """The mini-batch index tensors :func:`clients.training.train_local` draws for a client of n samples."""
    if n == 0:
        return []
    steps_per_epoch = math.ceil(n / config.batch_size)
    total = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    batches: list[torch.Tensor] = []
    while len(batches) < total:
        perm = torch.randperm(n, generator=generator, device=generator.device).cpu()
        for start in range(0, n, config.batch_size):
            if len(batches) >= total:
                break
            batches.append(perm[start : start + config.batch_size])
    return batches


def noisy_batch_schedule(n: int, config: NoisyLocalConfig, generator: torch.Generator) -> list[torch.Tensor]:
    """The K minibatches of b = min(B, n) indices :func:`clients.noisy_training.train_local_noisy` draws."""
    if n == 0:
        return []
    return list(noisy_minibatches(n, min(config.batch_size, n), config.steps, generator, torch.device("cpu")))


@dataclass
class _Plan:
    """Client order (longest first), the concatenated data, and per step the active prefix's padded batches."""

    order: list[int]  # stack position -> index into the caller's client list
    x: torch.Tensor  # all clients' samples, concatenated
    y: torch.Tensor
    steps: list[int]  # per stack position
    index: list[torch.Tensor]  # per step s: [k_s, width_s] indices into x (padding repeats a real index)
    weight: list[torch.Tensor]  # per step s: [k_s, width_s], 1 for real samples and 0 for padding


def _plan(
    data: Sequence[tuple[torch.Tensor, torch.Tensor]], schedules: Sequence[list[torch.Tensor]], device: torch.device
) -> _Plan:
    order = sorted(range(len(data)), key=lambda i: (-len(schedules[i]), i))
    offsets, start = [], 0
    for x, _ in data:
        offsets.append(start)
        start += int(x.shape[0])
    x_all = torch.cat([x for x, _ in data]).to(device) if data else torch.empty(0)
    y_all = torch.cat([y for _, y in data]).to(device=device, dtype=torch.long) if data else torch.empty(0)
    steps = [len(schedules[i]) for i in order]
    index, weight = [], []
    for s in range(steps[0] if steps else 0):
        active = [i for i in order if len(schedules[i]) > s]
        width = max(len(schedules[i][s]) for i in active)
        rows_i, rows_w = [], []
        for i in active:
            batch = schedules[i][s] + offsets[i]
            pad = width - len(batch)
            rows_i.append(torch.cat([batch, batch[:1].expand(pad)]) if pad else batch)
            rows_w.append(torch.cat([torch.ones(len(batch)), torch.zeros(pad)]))
        index.append(torch.stack(rows_i).to(device))
        weight.append(torch.stack(rows_w).to(device))
    return _Plan(order, x_all, y_all, steps, index, weight)


def _stack(global_params: Params, k: int) -> Params:
    return {name: p.detach().unsqueeze(0).repeat(k, *([1] * p.dim())) for name, p in global_params.items()}


def _per_client_norm(tensors: Params) -> torch.Tensor:
    """Global L2 norm of each client's tensors (dim 0 = client), combined layer by layer like the per-client path."""
    layer_norms = [torch.linalg.vector_norm(t.flatten(1), 2, dim=1) for t in tensors.values()]
    return torch.linalg.vector_norm(torch.stack(layer_norms, dim=1), 2, dim=1)


def _bcast(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view(-1, *([1] * (like.dim() - 1)))


class _Loss:
    """The per-client loss (weighted mean cross-entropy over the real samples, plus an optional regulariser)."""

    def __init__(self, model: nn.Module, regularizer: StackedRegularizer | None) -> None:
        self.model = model
        self.regularizer = regularizer

    def __call__(
        self, params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, reference: Params
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        logits = functional_call(self.model, params, (x,))
        data_loss = (F.cross_entropy(logits, y, reduction="none") * w).sum() / w.sum()
        total = data_loss if self.regularizer is None else data_loss + self.regularizer(params, reference)
        correct = ((logits.argmax(dim=1) == y).to(w.dtype) * w).sum()
        return total, (total.detach(), data_loss.detach(), correct.detach())


def _results(
    params: Params, alive: torch.Tensor, loss_sum: torch.Tensor, correct: torch.Tensor, seen: torch.Tensor,
    steps: torch.Tensor, sizes: Sequence[int],
) -> list[LocalTrainingResult]:  # fmt: skip
    finite_weights = torch.stack([torch.isfinite(p.flatten(1)).all(dim=1) for p in params.values()], dim=1).all(dim=1)
    ok = (alive & finite_weights).tolist()
    loss_sum_l, correct_l, seen_l, steps_l = loss_sum.tolist(), correct.tolist(), seen.tolist(), steps.tolist()
    out = []
    for j, n in enumerate(sizes):
        seen_j = seen_l[j]
        if n == 0:
            out.append(LocalTrainingResult(loss=0.0, accuracy=0.0, num_examples=0, num_steps=0, diverged=False))
        elif not ok[j]:
            accuracy = correct_l[j] / seen_j if seen_j else 0.0
            out.append(
                LocalTrainingResult(math.nan, accuracy, num_examples=n, num_steps=int(steps_l[j]), diverged=True)
            )
        else:
            loss, accuracy = loss_sum_l[j] / seen_j, correct_l[j] / seen_j
            out.append(LocalTrainingResult(loss, accuracy, num_examples=n, num_steps=int(steps_l[j]), diverged=False))
    return out


class _Tally:
    """Per client of a cohort: whether it is still training (a non-finite step stops it, as on the per-client path),
    and its example-weighted loss, correct predictions, examples seen and steps taken, in float64."""

    def __init__(self, count: int, device: torch.device) -> None:
        self.alive = torch.ones(count, dtype=torch.bool, device=device)
        self.loss_sum = torch.zeros(count, device=device, dtype=torch.float64)
        self.correct = torch.zeros(count, device=device, dtype=torch.float64)
        self.seen = torch.zeros(count, device=device, dtype=torch.float64)
        self.steps = torch.zeros(count, device=device, dtype=torch.long)

    def reset(self) -> None:
        """Every client alive, nothing counted (in place: a captured step keeps pointing at these tensors)."""
        self.alive.fill_(True)
        for counter in (self.loss_sum, self.correct, self.seen, self.steps):
            counter.zero_()

    def step(
        self, take: torch.Tensor, weight: torch.Tensor, data_loss: torch.Tensor, hits: torch.Tensor,
        stopped: torch.Tensor,
    ) -> None:  # fmt: skip
        """Count the step of the first ``len(take)`` clients for those that took it; those ``stopped`` (a
        non-finite loss on a batch of theirs) train no more."""
        k = int(take.shape[0])
        real = weight.sum(dim=1).to(torch.float64)
        takef = take.to(torch.float64)
        # where, not a product: a row that takes no step may have a NaN loss (padding's 0/0), and 0 · NaN is NaN.
        self.loss_sum[:k] += torch.where(take, data_loss.to(torch.float64) * real, 0.0)
        self.correct[:k] += takef * hits.to(torch.float64)
        self.seen[:k] += takef * real
        self.steps[:k] += take.to(torch.long)
        self.alive[:k] &= ~stopped

    def finish(
        self, params: Params, data: Sequence[tuple[torch.Tensor, torch.Tensor]], plan: _Plan
    ) -> tuple[list[Params], list[LocalTrainingResult]]:
        """Per client, in the caller's order: its final parameters (on the CPU) and its training result."""
        sizes = [int(data[i][0].shape[0]) for i in plan.order]
        stacked = _results(params, self.alive, self.loss_sum, self.correct, self.seen, self.steps, sizes)
        return _unstack(params, plan.order, len(data)), _reorder(stacked, plan.order)


def _reorder(stacked: list[LocalTrainingResult], order: list[int]) -> list[LocalTrainingResult]:
    results: list[LocalTrainingResult] = list(stacked)
    for position, i in enumerate(order):
        results[i] = stacked[position]
    return results


def _unstack(params: Params, order: list[int], count: int) -> list[Params]:
    """Per client (in the caller's order) its tensors, moved to the CPU."""
    cpu = {name: p.detach().cpu() for name, p in params.items()}
    result: list[Params] = [{} for _ in range(count)]
    for position, i in enumerate(order):
        result[i] = {name: t[position] for name, t in cpu.items()}
    return result


def _start(
    model: nn.Module, data: Sequence[tuple[torch.Tensor, torch.Tensor]], device: torch.device
) -> tuple[nn.Module, Params]:
    check_vectorizable(model)
    for x, y in data:
        if int(x.shape[0]) != int(y.shape[0]):
            raise ValueError(f"x has {int(x.shape[0])} samples but y has {int(y.shape[0])}")
    model = model.to(device)
    global_params = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    return model, global_params


@contextmanager
def _train_mode(model: nn.Module) -> Iterator[None]:
    """Train mode while the cohort trains (as the per-client path trains); every module's own mode restored after."""
    modes = [(module, module.training) for module in model.modules()]
    model.train()
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode


#: clients.sam.SAM's default: a zero gradient gives a zero perturbation, not 0/0
SAM_EPS = 1e-12


def local_step(
    grad_fn: Callable[..., tuple[Params, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]],
    config: LocalTrainingConfig,
    lr: float | torch.Tensor,
    p: Params,
    momentum: Params,
    xb: torch.Tensor,
    yb: torch.Tensor,
    weight: torch.Tensor,
    reference: Params,
    tally: _Tally,
) -> None:
    """One local step of the first k clients of the stack, in place (docs/algorithms.md; journal Eqs. 8–9 for SAM /
    ASAM).

    ``p`` / ``momentum`` are the clients' views (dim 0 = client), ``xb`` / ``yb`` / ``weight`` their padded batches
    (k × width), ``reference`` the round's global weights (the regulariser's). A client whose loss (either SAM pass)
    is non-finite, or that stopped before, keeps its weights and momentum. Every operation stays on the device and
    nothing syncs with the host, so the step can be captured as a CUDA graph (:mod:`clients.captured`), with ``lr``
    a 0-dim tensor there.
    """
    g, (total, data_loss, hits) = grad_fn(p, xb, yb, weight, reference)
    # A row of padding only (a client done training, run in a larger step shape by the captured engine) takes no
    # step: its weights, momentum, tally and state stay as they are (its loss, 0/0, is NaN and is not looked at).
    has_batch = weight.sum(dim=1) > 0
    finite = torch.isfinite(total)
    if config.optimizer == "sam":
        scaled = {name: p[name].abs() * gi for name, gi in g.items()} if config.adaptive else g
        scale = config.rho / (_per_client_norm(scaled) + SAM_EPS)
        perturbed = {}
        for name, gi in g.items():
            e = gi * _bcast(scale, gi)
            if config.adaptive:
                e = e * p[name].square()
            perturbed[name] = p[name] + e
        g, (perturbed_total, _, _) = grad_fn(perturbed, xb, yb, weight, reference)
        finite = finite & torch.isfinite(perturbed_total)
    k = int(xb.shape[0])
    take = tally.alive[:k] & finite & has_batch
    for name, gi in g.items():
        d_p = gi + config.weight_decay * p[name] if config.weight_decay else gi
        buf = momentum[name]
        new_buf = buf * config.momentum + d_p if config.momentum else d_p
        new_p = p[name] - lr * new_buf
        mask = _bcast(take, new_p)
        buf.copy_(torch.where(mask, new_buf, buf))
        p[name].copy_(torch.where(mask, new_p, p[name]))
    tally.step(take, weight, data_loss, hits, stopped=has_batch & ~finite)


def train_stacked(
    model: nn.Module,
    data: Sequence[tuple[torch.Tensor, torch.Tensor]],
    config: LocalTrainingConfig,
    server_round: int,
    generators: Sequence[torch.Generator],
    device: torch.device,
    regularizer: StackedRegularizer | None = None,
) -> tuple[list[Params], list[LocalTrainingResult]]:
    """Train one copy of ``model`` (its current weights = the round's global model) per client, all at once.

    Client i trains on ``data[i]`` with mini-batches drawn from ``generators[i]`` exactly as
    :func:`clients.training.train_local` would. Returns, per client in the given order, its final parameters (by
    name, on the CPU) and a :class:`LocalTrainingResult`. ``model`` is moved to ``device``, otherwise left unchanged
    (its parameters are the shared starting point; its train/eval mode is restored). Momentum buffers start from
    zero, as the per-client path's fresh optimizer does.
    """
    if len(generators) != len(data):
        raise ValueError(f"{len(data)} clients but {len(generators)} generators")
    if not data:
        return [], []
    model, global_params = _start(model, data, device)
    schedules = [batch_schedule(int(x.shape[0]), config, g) for (x, _), g in zip(data, generators, strict=True)]
    plan = _plan(data, schedules, device)
    count = len(data)
    params = _stack(global_params, count)
    momentum = {name: torch.zeros_like(p) for name, p in params.items()}
    loss_fn = _Loss(model, regularizer)
    grad_fn = vmap(grad(loss_fn, has_aux=True), in_dims=(0, 0, 0, 0, None))
    lr = local_lr(config.lr, config.lr_decay, server_round)
    tally = _Tally(count, device)
    with torch.no_grad(), _train_mode(model):
        for index, weight in zip(plan.index, plan.weight, strict=True):
            k = int(index.shape[0])
            local_step(
                grad_fn, config, lr,
                {name: t[:k] for name, t in params.items()}, {name: t[:k] for name, t in momentum.items()},
                plan.x[index], plan.y[index], weight, global_params, tally,
            )  # fmt: skip
    return tally.finish(params, data, plan)


def train_stacked_noisy(
    model: nn.Module,
    data: Sequence[tuple[torch.Tensor, torch.Tensor]],
    config: NoisyLocalConfig,
    server_round: int,
    generators: Sequence[torch.Generator],
    device: torch.device,
) -> tuple[list[Params], list[LocalTrainingResult]]:
    """:func:`clients.noisy_training.train_local_noisy` for every client at once (same minibatches, clip to V, prox)."""
    if server_round < 1:
        raise ValueError(f"server_round must be >= 1 (Flower rounds start at 1), got {server_round}")
    if len(generators) != len(data):
        raise ValueError(f"{len(data)} clients but {len(generators)} generators")
    if not data:
        return [], []
    model, global_params = _start(model, data, device)
    schedules = [noisy_batch_schedule(int(x.shape[0]), config, g) for (x, _), g in zip(data, generators, strict=True)]
    plan = _plan(data, schedules, device)
    count = len(data)
    params = _stack(global_params, count)
    grad_fn = vmap(grad(_Loss(model, None), has_aux=True), in_dims=(0, 0, 0, 0, None))
    t, K, alpha = server_round - 1, config.steps, config.prox_coef
    tally = _Tally(count, device)
    with torch.no_grad(), _train_mode(model):
        for k_step, (index, weight) in enumerate(zip(plan.index, plan.weight, strict=True)):
            k = int(index.shape[0])
            p = {name: tensor[:k] for name, tensor in params.items()}
            g, (_, data_loss, hits) = grad_fn(p, plan.x[index], plan.y[index], weight, global_params)
            grad_norm = _per_client_norm(g)
            take = tally.alive[:k] & torch.isfinite(data_loss) & torch.isfinite(grad_norm)
            denom = torch.clamp(grad_norm / config.grad_clip, min=1.0)
            lr = noisy_step_lr(config.lr, config.schedule, k_step, t, K)
            for name, gi in g.items():
                step = gi / _bcast(denom, gi).to(gi.dtype)
                if alpha > 0.0:
                    step = step + alpha * (p[name] - global_params[name])
                new_p = p[name] - lr * step
                p[name].copy_(torch.where(_bcast(take, new_p), new_p, p[name]))
            tally.step(take, weight, data_loss, hits, stopped=~take)
    return tally.finish(params, data, plan)
