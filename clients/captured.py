"""The vectorized cohort engine with each local step launched once: a CUDA graph per step shape.

:mod:`clients.vectorized` runs a cohort's local step (forward, backward, SAM's ascent and second pass, the SGD
update, the tally) as a few hundred small kernels launched one after another from Python. On a GPU that launch
work, not the arithmetic, sets the pace of a small model's step. Here the same step — the one function
:func:`clients.vectorized.local_step`, no second copy of it — is captured once as a CUDA graph
(``torch.cuda.CUDAGraph``) over static buffers and replayed for every step of every round:

* the worker's whole training split lives on the GPU (:func:`resident_split`), so a step's mini-batches are a
  gather by index inside the graph; the round's batch plan (the clients' own shuffles,
  :func:`clients.vectorized.batch_schedule`, replayed exactly as on every other path) goes to the device once,
  as an S×K×W index and weight tensor, and each step copies its slice into the graph's static inputs;
* the stacked weights, momentum, the round's global weights, the learning rate (a 0-dim tensor) and the tally are
  static buffers of a :class:`CapturedCohort` that a worker keeps across rounds (:func:`captured_cohort`), so a
  round re-captures nothing;
* every step has the same width W (the batch size B; shorter batches padded with zero-weight samples, as the
  vectorized engine pads within a step), and the k clients still training run in a step *shape* of
  :func:`step_shape` (k) ≥ k clients, the rows past k padding only (a row without a real sample takes no step:
  :func:`clients.vectorized.local_step`). Shapes are k itself up to 6 and then a ladder growing by ≤ 20 %, so a
  run needs a few graphs, not one per k: with unequal clients (a Dirichlet partition, Poisson cohorts) k takes
  most values from 1 to the cohort's size over a run, and graphs keyed by k were captured anew round after round
  (:data:`MAX_GRAPHS` bounds those kept). A shape that too few steps use (:data:`MIN_STEPS_FOR_GRAPH`) and has no
  graph yet runs the same function eagerly on the same buffers.

The result equals the vectorized engine's to float tolerance (the same kernels on the same data; a step padded
to the full width and the graph's replay can change the last bits). Models with buffers or dropout are refused
(:func:`fl_app.models.check_vectorizable`). Nothing here knows about differential privacy or federation: the
caller gets the clients' final weights stacked on the device (:class:`StackedOutcome`), to clip and sum there.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import grad, vmap

from clients.training import LocalTrainingConfig, LocalTrainingResult, local_lr
from clients.vectorized import (
    Params,
    StackedRegularizer,
    _Loss,
    _reorder,
    _results,
    _Tally,
    _train_mode,
    batch_schedule,
    local_step,
)
from fl_app.data.datasets import TensorData
from fl_app.models import check_vectorizable

__all__ = [
    "MIN_STEPS_FOR_GRAPH",
    "CapturedCohort",
    "StackedOutcome",
    "StepPlan",
    "step_plan",
    "step_shape",
    "train_captured",
]

#: A step shape (k clients training) gets a graph when a round runs at least this many steps of it; capturing costs
#: about three steps (two warm-ups and the capture), and graphs are kept across rounds.
MIN_STEPS_FOR_GRAPH = 3
#: Graphs kept per cohort workspace (least recently used dropped first): each holds one step's intermediates. The
#: shapes for cohorts of up to 100 clients are 20 (:func:`step_shape`): a run's graphs are captured once.
MAX_GRAPHS = 24
#: Step shapes above the first ones grow by at most this factor (the padding a step may carry).
SHAPE_GROWTH = 1.2


def step_shape(k: int, capacity: int | None = None) -> int:
    """The number of stacked clients a step of k training clients runs on: the least shape ≥ k of the ladder
    1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 18, 22, 27, 33, … (each max(s + 1, ⌈1.2 s⌉)), at most ``capacity``."""
    if k < 1:
        raise ValueError(f"a step trains at least one client, got k={k}")
    shape = 1
    while shape < k:
        shape = max(shape + 1, math.ceil(shape * SHAPE_GROWTH))
    return shape if capacity is None else min(shape, capacity)


#: Warm-up runs before a capture (cuBLAS / cuDNN pick and allocate their workspaces outside the graph).
_WARMUPS = 2


@dataclass
class StepPlan:
    """A round's local steps for a cohort, clients sorted by step count (longest first)."""

    order: list[int]  # stack position -> index into the caller's client list
    sizes: list[int]  # per stack position, the client's number of samples
    active: list[int]  # per step s, how many clients (a prefix of the stack) still train
    index: torch.Tensor  # S × K × W int64 indices into the resident split (padding repeats a real index)
    weight: torch.Tensor  # S × K × W float32: 1 for a real sample, 0 for padding


def step_plan(
    indices: Sequence[np.ndarray], schedules: Sequence[Sequence[torch.Tensor]], width: int, device: torch.device
) -> StepPlan:
    """The dense plan of ``schedules[i]`` (client i's mini-batches, local indices into ``indices[i]``, its rows of
    the training split), every batch padded to ``width``; built on the host and moved to ``device`` in one copy."""
    order = sorted(range(len(schedules)), key=lambda i: (-len(schedules[i]), i))
    steps = [len(schedules[i]) for i in order]
    longest = steps[0] if steps else 0
    if any(len(b) > width for s in schedules for b in s):
        raise ValueError(f"a mini-batch is wider than the plan's width {width}")
    index = np.zeros((longest, len(order), width), dtype=np.int64)
    weight = np.zeros((longest, len(order), width), dtype=np.float32)
    for position, i in enumerate(order):
        rows = np.asarray(indices[i], dtype=np.int64)
        for s, batch in enumerate(schedules[i]):
            chosen = rows[batch.numpy()]
            index[s, position, : len(chosen)] = chosen
            index[s, position, len(chosen) :] = chosen[0]
            weight[s, position, : len(chosen)] = 1.0
    active = [sum(1 for n in steps if n > s) for s in range(longest)]
    return StepPlan(
        order=order,
        sizes=[len(indices[i]) for i in order],
        active=active,
        index=torch.from_numpy(index).to(device, non_blocking=False),
        weight=torch.from_numpy(weight).to(device, non_blocking=False),
    )


@dataclass
class StackedOutcome:
    """The clients' final weights stacked on the device (dim 0 = stack position), the round's global weights they
    started from (on the same device) and their training results."""

    params: Params  # name -> K × ..., stack order
    reference: Params  # name -> the global weights of the round
    order: list[int]  # stack position -> index into the caller's client list
    results: list[LocalTrainingResult]  # in the caller's order

    def unstacked(self) -> list[Params]:
        """Per client (in the caller's order) its tensors on the CPU (one device-to-host copy per tensor)."""
        cpu = {name: p.detach().cpu() for name, p in self.params.items()}
        out: list[Params] = [{} for _ in self.order]
        for position, i in enumerate(self.order):
            out[i] = {name: t[position] for name, t in cpu.items()}
        return out


class CapturedCohort:
    """Static buffers for up to ``capacity`` clients of one model, config and width, and the step graphs over them.

    A worker keeps one across rounds (:func:`captured_cohort`); :meth:`train` runs one round.
    """

    def __init__(
        self,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        config: LocalTrainingConfig,
        capacity: int,
        width: int,
        regularizer: StackedRegularizer | None = None,
        graphs: bool = True,
    ) -> None:
        check_vectorizable(model)
        device = x.device
        if y.device != device:
            raise ValueError(f"x is on {device} but y on {y.device}")
        if graphs and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device} (graphs=False runs every step eagerly)")
        self.capture_graphs = graphs
        self.model = model.to(device)
        self.config = config
        self.capacity, self.width = capacity, width
        self.x, self.y = x, y
        trainable = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
        self.reference = {name: torch.empty_like(p) for name, p in trainable.items()}
        # Zeros, not empty: rows past a round's cohort are padding in its larger step shapes (computed, never kept).
        self.params = {name: torch.zeros((capacity, *p.shape), dtype=p.dtype, device=device) for name, p in
                       trainable.items()}  # fmt: skip
        self.momentum = {name: torch.zeros_like(p) for name, p in self.params.items()}
        self.index = torch.zeros((capacity, width), dtype=torch.long, device=device)
        self.weight = torch.zeros((capacity, width), dtype=torch.float32, device=device)
        # In the weights' dtype: a float32 η would round a float64 model's step.
        self.lr = torch.zeros((), dtype=next(iter(trainable.values())).dtype, device=device)
        self.tally = _Tally(capacity, device)
        self.grad_fn = vmap(grad(_Loss(self.model, regularizer), has_aux=True), in_dims=(0, 0, 0, 0, None))
        self.graphs: OrderedDict[int, torch.cuda.CUDAGraph] = OrderedDict()
        self.replays = 0
        self.eager_steps = 0
        self.captures = 0

    def step(self, k: int) -> None:
        """The local step of the first k stacked clients on the static buffers (what a graph captures); rows whose
        weights are all zero take no step."""
        index = self.index[:k]
        local_step(
            self.grad_fn, self.config, self.lr,
            {name: t[:k] for name, t in self.params.items()}, {name: t[:k] for name, t in self.momentum.items()},
            self.x[index], self.y[index], self.weight[:k], self.reference, self.tally,
        )  # fmt: skip

    def _capture(self, k: int) -> None:
        """Capture the step for k clients. Warm-ups and capture run before the round's state is loaded (they may
        scribble on the buffers; :meth:`train` loads every one of them afterwards)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(_WARMUPS):
                self.step(k)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step(k)
        self.graphs[k] = graph
        self.captures += 1
        while len(self.graphs) > MAX_GRAPHS:
            self.graphs.popitem(last=False)

    def train(self, global_params: Params, plan: StepPlan, lr: float) -> None:
        """One round: every client starts from ``global_params`` with zero momentum and takes its planned steps."""
        k_all = len(plan.order)
        if k_all > self.capacity or plan.index.shape[-1] != self.width:
            raise ValueError(f"plan of {k_all} clients × width {plan.index.shape[-1]} exceeds the workspace "
                             f"({self.capacity} × {self.width})")  # fmt: skip
        shapes = [step_shape(k, self.capacity) for k in plan.active]
        counts: dict[int, int] = {}
        for shape in shapes:
            counts[shape] = counts.get(shape, 0) + 1
        with torch.no_grad(), _train_mode(self.model):
            for shape, n in counts.items():
                if self.capture_graphs and n >= MIN_STEPS_FOR_GRAPH and shape not in self.graphs:
                    self._capture(shape)
            for name, p in global_params.items():
                self.reference[name].copy_(p)
                self.params[name][:k_all].copy_(p.unsqueeze(0).expand_as(self.params[name][:k_all]))
                self.momentum[name].zero_()
            self.tally.reset()
            self.lr.fill_(lr)
            for s, (k, shape) in enumerate(zip(plan.active, shapes, strict=True)):
                self._load_batch(plan, s, k, shape)
                graph = self.graphs.get(shape)
                if graph is None:
                    self.step(shape)
                    self.eager_steps += 1
                else:
                    self.graphs.move_to_end(shape)
                    graph.replay()
                    self.replays += 1

    def _load_batch(self, plan: StepPlan, s: int, k: int, shape: int) -> None:
        """Step s's batches into the static inputs: the k training clients' rows, zero weight for the rest of the
        shape (clients done training, or rows past the cohort: padding, which takes no step)."""
        self.index[:k].copy_(plan.index[s, :k])
        self.weight[:k].copy_(plan.weight[s, :k])
        if shape > k:
            self.weight[k:shape].zero_()

    def outcome(self, plan: StepPlan) -> StackedOutcome:
        """The round's stacked final weights (views of the workspace: read them before the next round) and results."""
        k_all = len(plan.order)
        params = {name: t[:k_all] for name, t in self.params.items()}
        t = self.tally
        stacked = _results(params, t.alive[:k_all], t.loss_sum[:k_all], t.correct[:k_all], t.seen[:k_all],
                           t.steps[:k_all], plan.sizes)  # fmt: skip
        return StackedOutcome(
            params=params, reference=self.reference, order=plan.order, results=_reorder(stacked, plan.order)
        )


#: Workspaces a worker keeps (a run uses one; a sweep's runs in one process more).
_WORKSPACES: OrderedDict[tuple[object, ...], CapturedCohort] = OrderedDict()
_MAX_WORKSPACES = 2


def captured_cohort(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: LocalTrainingConfig,
    clients: int,
    width: int,
    regularizer: StackedRegularizer | None = None,
    regularizer_key: object = None,
    graphs: bool = True,
) -> CapturedCohort:
    """The worker's workspace for this model, split, config and width, with room for ``clients`` (grown — and its
    graphs captured anew — when a cohort is larger than any before). ``regularizer_key`` names the regulariser's
    constants (a new key, a new workspace: a graph bakes them in)."""
    # The learning rate is a buffer (it decays by round); everything else of the config is baked into the graph.
    constants = (config.optimizer, config.adaptive, config.rho, config.momentum, config.weight_decay)
    key = (id(model), x.data_ptr(), tuple(x.shape), y.data_ptr(), constants, width, regularizer_key, graphs)
    workspace = _WORKSPACES.get(key)
    if workspace is None or workspace.capacity < clients or workspace.model is not model:
        # Room for the next shape up: cohorts that vary round to round (Poisson) rarely outgrow it.
        capacity = step_shape(max(clients, workspace.capacity if workspace is not None else 0))
        _WORKSPACES.pop(key, None)
        workspace = CapturedCohort(model, x, y, config, capacity, width, regularizer, graphs)
        _WORKSPACES[key] = workspace
        while len(_WORKSPACES) > _MAX_WORKSPACES:
            _WORKSPACES.popitem(last=False)
    _WORKSPACES.move_to_end(key)
    return workspace


@functools.lru_cache(maxsize=2)
def _resident(split: TensorData, device: str) -> TensorData:  # TensorData hashes by identity
    return TensorData(split.x.to(device), split.y.to(device=device, dtype=torch.long))


def resident_split(split: TensorData, device: torch.device) -> TensorData:
    """``split`` copied to ``device`` once per process (the worker's whole training split stays there)."""
    return _resident(split, str(device))


def train_captured(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    indices: Sequence[np.ndarray],
    config: LocalTrainingConfig,
    server_round: int,
    generators: Sequence[torch.Generator],
    regularizer: StackedRegularizer | None = None,
    regularizer_key: object = None,
    graphs: bool | None = None,
) -> StackedOutcome:
    """Train one copy of ``model`` (its weights = the round's global model) per client on the GPU that holds ``x``.

    Client i trains on the rows ``indices[i]`` of ``x`` / ``y`` (the training split resident on the GPU,
    :func:`resident_split`; ``y`` int64) with the
    mini-batches :func:`clients.training.train_local` would draw from ``generators[i]``: SGD with momentum, weight
    decay and η_t, or SAM / ASAM around it. Returns the stacked final weights on the device and the results.
    ``graphs`` (default: where the device is a GPU) captures the steps; without, every step runs eagerly on the same
    buffers (the plan, buffers and tally are then checkable on a CPU).
    """
    if len(generators) != len(indices):
        raise ValueError(f"{len(indices)} clients but {len(generators)} generators")
    if not indices:
        return StackedOutcome(params={}, reference={}, order=[], results=[])
    device = x.device
    schedules = [batch_schedule(len(rows), config, g) for rows, g in zip(indices, generators, strict=True)]
    # One width for every round (the configured batch size): a workspace and its graphs serve the whole run.
    width = config.batch_size
    plan = step_plan(indices, schedules, width, device)
    model = model.to(device)
    if graphs is None:
        graphs = device.type == "cuda"
    workspace = captured_cohort(model, x, y, config, len(indices), width, regularizer, regularizer_key, graphs)
    global_params = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    workspace.train(global_params, plan, local_lr(config.lr, config.lr_decay, server_round))
    return workspace.outcome(plan)
