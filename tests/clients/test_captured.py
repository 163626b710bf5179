"""Tests for clients/captured.py: the vectorized step captured as a CUDA graph, over a training split resident on
the GPU, must give client by client what the per-client loop (clients/training.py) and the vectorized engine give.

Each engine test runs twice: on the CPU with every step eager on the engine's static buffers (the plan, the
buffers, the tally and their reuse across rounds, in CI), and on a GPU with the steps captured as CUDA graphs (the
``[cuda]`` cases skip without one; run them on a GPU machine with ``pytest tests -k cuda``). On the GPU, TF32 is
switched off so that float32 means float32. The small GroupNorm model runs in float32 and the paper CNN in float64
(why: the module docstring of tests/clients/test_vectorized.py), with that file's tolerances.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
import torch

from clients.captured import (
    MAX_GRAPHS,
    MIN_STEPS_FOR_GRAPH,
    CapturedCohort,
    captured_cohort,
    step_plan,
    step_shape,
    train_captured,
)
from clients.vectorized import batch_schedule, train_stacked
from fl_app.config import ConfigError
from fl_app.instructions import resolve_cohort_engine
from tests.clients.test_vectorized import (
    ATOL,
    ATOL64,
    BASE,
    OPTIMIZERS,
    SERVER_ROUND,
    SIZES,
    _assert_matches,
    _assert_trained,
    _blur_regularizer,
    _cnn,
    _data,
    _gens,
    _images,
    _max_diff,
    _reference,
    _seeds,
    _small_model,
)
from tests.helpers import build

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
Data = list[tuple[torch.Tensor, torch.Tensor]]


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=cuda)])
def device(request: pytest.FixtureRequest) -> Iterator[torch.device]:
    """The engine's device; on a GPU float32 means float32 (no TF32 in convolutions or matrix products)."""
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch.device(request.param)
    torch.set_num_threads(num_threads)
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def _split(data: Data, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]:
    """The clients' data as one resident split and each client's rows of it."""
    x = torch.cat([x for x, _ in data]).to(device)
    y = torch.cat([y for _, y in data]).to(device)
    bounds = np.cumsum([0, *[len(x) for x, _ in data]])
    return x, y, [np.arange(bounds[i], bounds[i + 1]) for i in range(len(data))]


def _on_cpu(finals: dict[str, torch.Tensor], order: Sequence[int]) -> list[dict[str, torch.Tensor]]:
    out: list[dict[str, torch.Tensor]] = [{} for _ in order]
    for position, i in enumerate(order):
        out[i] = {name: t[position].cpu() for name, t in finals.items()}
    return out


# ----- everywhere: the plan and the refusals ------------------------------------------------------------------------


def test_step_plan_pads_every_batch_to_the_width_and_stacks_longest_first() -> None:
    data = _data(SIZES)
    _, _, indices = _split(data, torch.device("cpu"))
    seeds = _seeds(len(SIZES))
    schedules = [batch_schedule(len(ix), BASE, g) for ix, g in zip(indices, _gens(seeds), strict=True)]
    plan = step_plan(indices, schedules, BASE.batch_size, torch.device("cpu"))
    # SIZES = 0, 5, 13, 32, 47 → 0, 2, 4, 8, 9 steps (max_steps = 9): longest first.
    assert plan.order == [4, 3, 2, 1, 0]
    assert plan.sizes == [47, 32, 13, 5, 0]
    assert plan.active == [4, 4, 3, 3, 2, 2, 2, 2, 1]
    assert tuple(plan.index.shape) == (9, 5, BASE.batch_size) and plan.index.dtype == torch.long
    for position, i in enumerate(plan.order):
        for s, batch in enumerate(schedules[i]):
            n = len(batch)
            assert plan.index[s, position, :n].tolist() == indices[i][batch.numpy()].tolist()
            assert plan.weight[s, position, :n].tolist() == [1.0] * n
            assert plan.weight[s, position, n:].sum() == 0.0
            assert set(plan.index[s, position, n:].tolist()) <= {int(indices[i][batch[0]])}  # padding: a real row
        for s in range(len(schedules[i]), plan.index.shape[0]):  # past its end: nothing of the client's
            assert plan.weight[s, position].sum() == 0.0


def test_step_shapes_are_a_ladder_growing_by_at_most_a_fifth() -> None:
    assert [step_shape(k) for k in range(1, 35)] == [
        1, 2, 3, 4, 5, 6, 8, 8, 10, 10, 12, 12, 15, 15, 15, 18, 18, 18, 22, 22, 22, 22, 27, 27, 27, 27, 27,
        33, 33, 33, 33, 33, 33, 40,
    ]  # fmt: skip
    shapes = sorted({step_shape(k) for k in range(1, 101)})
    assert len(shapes) == 20 <= MAX_GRAPHS  # a run of cohorts up to 100 clients captures each shape once
    assert all(b <= max(a + 1, math.ceil(1.2 * a)) for a, b in itertools.pairwise(shapes))
    assert step_shape(7, capacity=7) == 7 and step_shape(9, capacity=100) == 10
    with pytest.raises(ValueError, match="at least one"):
        step_shape(0)


def test_step_plan_refuses_a_batch_wider_than_the_width() -> None:
    schedules = [[torch.arange(8)]]
    with pytest.raises(ValueError, match="wider"):
        step_plan([np.arange(8)], schedules, 4, torch.device("cpu"))


def test_graphs_need_a_cuda_device() -> None:
    x, y = torch.zeros(4, 1, 8, 8), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="CUDA"):
        CapturedCohort(_small_model(), x, y, BASE, capacity=2, width=8, graphs=True)
    with pytest.raises(ValueError, match="CUDA"):
        resolve_cohort_engine("captured", device_is_gpu=False)
    assert resolve_cohort_engine("captured", device_is_gpu=True) == "captured"
    assert resolve_cohort_engine("auto", device_is_gpu=True) == "captured"
    assert resolve_cohort_engine("auto", device_is_gpu=False) == "sequential"


# ----- the engine, on the CPU (eager) and on a GPU (captured) ---------------------------------------------------------


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_matches_train_local_small_model(optimizer: str, device: torch.device) -> None:
    config = dataclasses.replace(BASE, **OPTIMIZERS[optimizer])  # type: ignore[arg-type]
    model, data, seeds = _small_model(), _data(SIZES), _seeds(len(SIZES))
    x, y, indices = _split(data, device)
    outcome = train_captured(copy.deepcopy(model).to(device), x, y, indices, config, SERVER_ROUND, _gens(seeds))
    finals = _on_cpu(outcome.params, outcome.order)
    _assert_matches(finals, outcome.results, _reference(model, data, config, seeds))
    _assert_trained(model, finals, data)
    assert [r.num_steps for r in outcome.results] == [0, 2, 4, 8, 9]


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_matches_train_local_paper_cnn(optimizer: str, device: torch.device) -> None:
    """Equal clients (one graph for every step) and unequal ones (graphs for the frequent shapes, eager steps for
    the rest), the paper CNN in float64."""
    config = dataclasses.replace(BASE, epochs=3, max_steps=None, **OPTIMIZERS[optimizer])  # type: ignore[arg-type]
    for sizes in [(16, 16, 16), (3, 0, 17, 9)]:
        model, data, seeds = _cnn(), _images(sizes, seed=1), _seeds(len(sizes))
        x, y, indices = _split(data, device)
        outcome = train_captured(copy.deepcopy(model).to(device), x, y, indices, config, SERVER_ROUND, _gens(seeds))
        finals = _on_cpu(outcome.params, outcome.order)
        _assert_matches(finals, outcome.results, _reference(model, data, config, seeds), atol=ATOL64)
        _assert_trained(model, finals, data)


def test_blur_matches_train_local(device: torch.device) -> None:
    config = dataclasses.replace(BASE, **OPTIMIZERS["sam"])  # type: ignore[arg-type]
    model, data, seeds = _small_model(), _data(SIZES), _seeds(len(SIZES))
    x, y, indices = _split(data, device)
    blur, key = _blur_regularizer(0.3, 0.5), ("blur", 0.3, 0.5)
    outcome = train_captured(
        copy.deepcopy(model).to(device), x, y, indices, config, SERVER_ROUND, _gens(seeds), blur, key
    )
    reference = _reference(model, data, config, seeds, blur=(0.3, 0.5))
    _assert_matches(_on_cpu(outcome.params, outcome.order), outcome.results, reference)


def test_a_later_round_reuses_the_workspace_and_its_graphs(device: torch.device) -> None:
    """A later round (new global weights, learning rate and shuffles) runs on the buffers (and, on a GPU, replays
    the graphs) of the first and gives what the vectorized engine and the per-client loop give."""
    config = dataclasses.replace(BASE, epochs=4, max_steps=None, **OPTIMIZERS["asam"])  # type: ignore[arg-type]
    sizes = (24, 24, 24, 24)
    data = _data(sizes, seed=5)
    model = _small_model(seed=3).to(device)
    x, y, indices = _split(data, device)
    train_captured(model, x, y, indices, config, 1, _gens(_seeds(4)))
    workspace = captured_cohort(model, x, y, config, 4, config.batch_size, graphs=device.type == "cuda")
    first = (workspace.replays, workspace.eager_steps)
    assert first == ((12, 0) if device.type == "cuda" else (0, 12))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.9).add_(0.01)
    seeds = [7, 8, 9, 10]
    later = train_captured(model, x, y, indices, config, 5, _gens(seeds))
    assert (workspace.replays, workspace.eager_steps) == (2 * first[0], 2 * first[1])
    assert list(workspace.graphs) == ([4] if device.type == "cuda" else [])  # nothing captured anew
    finals = _on_cpu(later.params, later.order)
    stacked, results = train_stacked(model, data, config, 5, _gens(seeds), device)
    for got, want in zip(finals, stacked, strict=True):
        assert _max_diff(got, {k: v.cpu() for k, v in want.items()}) <= ATOL
    assert [r.num_steps for r in later.results] == [r.num_steps for r in results] == [12] * 4
    _assert_matches(finals, later.results, _reference(model.cpu(), data, config, seeds, server_round=5))


def test_unequal_clients_capture_only_frequent_shapes(device: torch.device) -> None:
    config = dataclasses.replace(BASE, epochs=1, max_steps=None, **OPTIMIZERS["sgd"])  # type: ignore[arg-type]
    sizes = (8 * 6, 8 * 6, 8 * 1)  # 6, 6 and 1 steps: k = 3 once, k = 2 five times
    data = _data(sizes, seed=6)
    model = _small_model(seed=4).to(device)
    x, y, indices = _split(data, device)
    outcome = train_captured(model, x, y, indices, config, 1, _gens(_seeds(3)))
    workspace = captured_cohort(model, x, y, config, 3, config.batch_size, graphs=device.type == "cuda")
    assert MIN_STEPS_FOR_GRAPH <= 5
    if device.type == "cuda":
        assert list(workspace.graphs) == [2] and workspace.eager_steps == 1 and workspace.replays == 5
    reference = _reference(model.cpu(), data, config, _seeds(3), server_round=1)
    _assert_matches(_on_cpu(outcome.params, outcome.order), outcome.results, reference)


def test_padded_step_shapes_leave_finished_clients_and_rows_past_the_cohort_untouched(device: torch.device) -> None:
    """Ten clients (18, 15, 15, 12, 9, 6, 6, 3, 3 and 0 steps): 9, 7 and 5 training clients run in shapes of 10, 8
    and 5, so a client done training (and the empty one) sits in a padded row while others step. Then seven of them
    on the same workspace: 7 clients run in a shape of 8, whose last row holds the first cohort's weights. Every
    client gets what the per-client loop gives."""
    config = dataclasses.replace(BASE, epochs=3, max_steps=None, **OPTIMIZERS["sam"])  # type: ignore[arg-type]
    sizes = (47, 40, 33, 32, 24, 16, 13, 8, 5, 0)
    data = _data(sizes, seed=8)
    model = _small_model(seed=5).to(device)
    x, y, indices = _split(data, device)
    outcome = train_captured(model, x, y, indices, config, 1, _gens(_seeds(10)))
    workspace = captured_cohort(model, x, y, config, 10, config.batch_size, graphs=device.type == "cuda")
    assert workspace.capacity == 10
    assert [r.num_steps for r in outcome.results] == [18, 15, 15, 12, 9, 6, 6, 3, 3, 0]
    if device.type == "cuda":  # shapes 10, 8, 5, 4, 3 and 1, three steps each
        assert sorted(workspace.graphs) == [1, 3, 4, 5, 8, 10] and workspace.eager_steps == 0
    reference = _reference(model.cpu(), data, config, _seeds(10), server_round=1)
    _assert_matches(_on_cpu(outcome.params, outcome.order), outcome.results, reference)

    model.to(device)
    seven = indices[:7]
    later = train_captured(model, x, y, seven, config, 2, _gens(_seeds(7)))
    assert captured_cohort(model, x, y, config, 7, config.batch_size, graphs=device.type == "cuda") is workspace
    assert step_shape(7, workspace.capacity) == 8  # the row past the cohort is padding
    reference = _reference(model.cpu(), data[:7], config, _seeds(7), server_round=2)
    _assert_matches(_on_cpu(later.params, later.order), later.results, reference)


@pytest.mark.parametrize("optimizer", ["sgd", "sam"])
def test_diverging_client_is_reported_alone(optimizer: str, device: torch.device) -> None:
    config = dataclasses.replace(BASE, **OPTIMIZERS[optimizer])  # type: ignore[arg-type]
    model, data, seeds = _small_model(), _data((16, 16, 16)), _seeds(3)
    x1, y1 = data[1]
    x1 = x1.clone()
    x1[0, 0, 0, 0] = float("inf")
    data[1] = (x1, y1)
    x, y, indices = _split(data, device)
    outcome = train_captured(copy.deepcopy(model).to(device), x, y, indices, config, SERVER_ROUND, _gens(seeds))
    assert [r.diverged for r in outcome.results] == [False, True, False]
    reference = _reference(model, data, config, seeds)
    finals = _on_cpu(outcome.params, outcome.order)
    for i in (0, 2):
        assert _max_diff(finals[i], reference[i][0]) <= ATOL


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_the_captured_engine_without_a_gpu_is_refused_at_construction() -> None:
    """Before any worker starts: the strategy's construction names the key and says why."""
    with pytest.raises(ConfigError, match=r"simulation\.cohort_engine=captured.*CUDA"):
        build("strategy=dp_fedsam", "simulation.cohort_engine=captured", "simulation.device=auto")
