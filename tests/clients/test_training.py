"""Tests for clients/training.py: the local SGD / SAM loop (docs/algorithms.md) and the divergence stop
(docs/mechanisms.md, 5)."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clients.training import LocalTrainingConfig, LocalTrainingResult, local_lr, train_local
from fl_app.models import evaluate

CPU = torch.device("cpu")


def _init_params(model: nn.Module, seed: int) -> nn.Module:
    """Deterministic weights from an explicit generator (the global RNG is never seeded or used)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def _linear_model(seed: int = 0) -> nn.Module:
    # Layer constructors draw their default init from the global RNG; fork it so tests leave it as found.
    with torch.random.fork_rng(devices=[]):
        return _init_params(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), seed)


def _bn_model(seed: int = 0) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        layers = [nn.Conv2d(1, 3, 2), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.Linear(3, 2)]
        return _init_params(nn.Sequential(*layers), seed)


def _gn_model(seed: int = 0) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        layers = [nn.Conv2d(1, 4, 2), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4, 2)]
        return _init_params(nn.Sequential(*layers), seed)


def _separable(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two well-separated Gaussian blobs as N×1×2×2 images."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 2
    centers = torch.where(y[:, None] == 1, 2.0, -2.0) * torch.tensor([1.0, -1.0, 1.0, -1.0])
    x = centers + 0.3 * torch.randn(n, 4, generator=gen)
    return x.view(n, 1, 2, 2), y


def _config(**overrides: object) -> LocalTrainingConfig:
    base = LocalTrainingConfig(epochs=2, batch_size=8, lr=0.1)
    return dataclasses.replace(base, **overrides)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _weights(model: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


def _count_forwards(model: nn.Module) -> list[int]:
    """Batch sizes of every forward pass of ``model``."""
    sizes: list[int] = []
    model.register_forward_hook(lambda _m, inputs, _out: sizes.append(int(inputs[0].shape[0])))
    return sizes


# --- learning rate -------------------------------------------------------------------------------------


def test_local_lr_round_one_uses_base_lr_and_decays_per_round() -> None:
    assert local_lr(0.1, 0.998, 1) == pytest.approx(0.1)
    assert local_lr(0.1, 0.998, 3) == pytest.approx(0.1 * 0.998**2)
    assert local_lr(0.05, 1.0, 500) == pytest.approx(0.05)
    with pytest.raises(ValueError):
        local_lr(0.1, 0.998, 0)


def test_train_local_applies_decayed_lr() -> None:
    """One plain-SGD step: a linear extra loss λ·Σw shifts every weight by exactly −η_t·λ."""
    x, y = _separable(8)
    cfg = _config(epochs=1, batch_size=8, lr=0.5, lr_decay=0.5, momentum=0.0, weight_decay=0.0, max_steps=1)
    lam, server_round = 0.25, 3

    def linear_term(model: nn.Module) -> torch.Tensor:
        return lam * sum(p.sum() for p in model.parameters())

    plain, shifted = _linear_model(), _linear_model()
    train_local(plain, x, y, cfg, server_round, _gen(), CPU)
    train_local(shifted, x, y, cfg, server_round, _gen(), CPU, extra_loss=linear_term)
    eta_t = local_lr(0.5, 0.5, server_round)
    for p, q in zip(plain.parameters(), shifted.parameters(), strict=True):
        torch.testing.assert_close(q - p, torch.full_like(p, -eta_t * lam))


# --- determinism and step counts -----------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["sgd", "sam"])
def test_deterministic_given_generator_seed(optimizer: str) -> None:
    x, y = _separable(30)
    cfg = _config(optimizer=optimizer, batch_size=7, epochs=3)
    runs = []
    for _ in range(2):
        model = _bn_model()
        result = train_local(model, x, y, cfg, 1, _gen(42), CPU)
        runs.append((_weights(model), result))
    (w1, r1), (w2, r2) = runs
    assert all(torch.equal(a, b) for a, b in zip(w1, w2, strict=True))
    assert r1 == r2

    other = _bn_model()
    train_local(other, x, y, cfg, 1, _gen(43), CPU)
    assert any(not torch.equal(a, b) for a, b in zip(w1, _weights(other), strict=True))


def test_does_not_touch_global_rng() -> None:
    x, y = _separable(20)
    model = _linear_model()
    state = torch.get_rng_state()
    train_local(model, x, y, _config(optimizer="sam"), 1, _gen(), CPU)
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("optimizer", ["sgd", "sam"])
def test_steps_cover_every_sample_including_partial_batch(optimizer: str) -> None:
    x, y = _separable(10)
    model = _linear_model()
    sizes = _count_forwards(model)
    result = train_local(model, x, y, _config(optimizer=optimizer, epochs=2, batch_size=3), 1, _gen(), CPU)
    assert result.num_steps == 2 * math.ceil(10 / 3) == 8
    assert result.num_examples == 10
    passes = 2 if optimizer == "sam" else 1
    assert len(sizes) == passes * result.num_steps
    per_step = sizes[::passes]
    assert per_step == [3, 3, 3, 1] * 2
    assert not result.diverged


def test_max_steps_caps_local_steps() -> None:
    x, y = _separable(10)
    result = train_local(_linear_model(), x, y, _config(epochs=5, batch_size=3, max_steps=5), 1, _gen(), CPU)
    assert result.num_steps == 5


def test_sam_uses_two_passes_and_extra_loss_on_both() -> None:
    x, y = _separable(12)
    model = _linear_model()
    sizes = _count_forwards(model)
    calls: list[int] = []

    def reg(m: nn.Module) -> torch.Tensor:
        calls.append(1)
        return 0.0 * sum(p.sum() for p in m.parameters())

    result = train_local(model, x, y, _config(optimizer="sam", batch_size=4, epochs=1), 1, _gen(), CPU, reg)
    assert result.num_steps == 3
    assert len(sizes) == 6
    assert len(calls) == 6


def test_sam_leaves_batchnorm_stats_to_first_pass() -> None:
    x, y = _separable(16)
    model = _bn_model()
    result = train_local(model, x, y, _config(optimizer="sam", batch_size=4, epochs=2), 1, _gen(), CPU)
    assert int(model[1].num_batches_tracked) == result.num_steps == 8


def test_sam_trains_groupnorm_model() -> None:
    x, y = _separable(24)
    model = _gn_model()
    before = _weights(model)
    cfg = _config(optimizer="sam", adaptive=True, rho=0.5, epochs=3)
    result = train_local(model, x, y, cfg, 1, _gen(), CPU)
    assert not result.diverged
    assert list(model.buffers()) == []
    assert any(not torch.equal(a, b) for a, b in zip(before, _weights(model), strict=True))


# --- learning ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["sgd", "sam"])
def test_loss_decreases_on_separable_problem(optimizer: str) -> None:
    x, y = _separable(40)
    model = _linear_model()
    loss_before, _ = evaluate(model, x, y, CPU)
    cfg = _config(optimizer=optimizer, epochs=1, batch_size=8, lr=0.2)
    first = train_local(model, x, y, cfg, 1, _gen(0), CPU)
    later = first
    for rnd in range(2, 6):
        later = train_local(model, x, y, cfg, rnd, _gen(rnd), CPU)
    loss_after, acc_after = evaluate(model, x, y, CPU)
    assert later.loss < first.loss
    assert loss_after < loss_before
    assert acc_after == 1.0
    assert 0.0 <= first.accuracy <= 1.0


def test_result_is_frozen_and_model_left_without_grads() -> None:
    x, y = _separable(8)
    model = _linear_model()
    result = train_local(model, x, y, _config(), 1, _gen(), CPU)
    assert isinstance(result, LocalTrainingResult)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.loss = 0.0  # type: ignore[misc]
    assert all(p.grad is None for p in model.parameters())
    assert model.training


# --- divergence ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["sgd", "sam"])
def test_nan_extra_loss_stops_at_once_with_last_finite_weights(optimizer: str) -> None:
    """The 3rd step's loss is NaN: two steps are kept, the weights equal a clean two-step run."""
    x, y = _separable(16)
    cfg = _config(optimizer=optimizer, batch_size=4, epochs=3)
    calls = {"n": 0}
    passes = 2 if optimizer == "sam" else 1

    def poisoned(model: nn.Module) -> torch.Tensor:
        calls["n"] += 1
        step = (calls["n"] - 1) // passes + 1
        value = math.nan if step == 3 else 0.0
        return value * sum(p.sum() for p in model.parameters()) + value

    model = _linear_model()
    result = train_local(model, x, y, cfg, 1, _gen(), CPU, extra_loss=poisoned)
    assert result.diverged
    assert math.isnan(result.loss)
    assert result.num_steps == 2
    assert calls["n"] == 3 * passes  # stopped inside step 3, no further steps
    assert all(torch.isfinite(p).all() for p in model.parameters())

    reference = _linear_model()
    train_local(reference, x, y, dataclasses.replace(cfg, max_steps=2), 1, _gen(), CPU)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)


def test_nan_only_on_perturbed_pass_is_caught_and_perturbation_undone() -> None:
    x, y = _separable(8)
    cfg = _config(optimizer="sam", batch_size=8, epochs=5)
    calls = {"n": 0}

    def nan_on_second_pass(model: nn.Module) -> torch.Tensor:
        calls["n"] += 1
        return torch.tensor(math.nan if calls["n"] == 2 else 0.0)

    model = _linear_model()
    before = _weights(model)
    result = train_local(model, x, y, cfg, 1, _gen(), CPU, extra_loss=nan_on_second_pass)
    assert result.diverged and result.num_steps == 0
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(model), strict=True))


@pytest.mark.parametrize("optimizer", ["sgd", "sam"])
def test_huge_lr_diverges_and_stops_early(optimizer: str) -> None:
    """lr = 1e6 on a quadratic regulariser multiplies the weights by ~2e6 per step: overflow within a few."""
    x, y = _separable(64)
    cfg = _config(optimizer=optimizer, lr=1e6, batch_size=4, epochs=10, momentum=0.0, weight_decay=0.0)

    def l2(model: nn.Module) -> torch.Tensor:
        return sum(p.square().sum() for p in model.parameters())

    model = _linear_model()
    result = train_local(model, x, y, cfg, 1, _gen(), CPU, extra_loss=l2)
    assert result.diverged
    assert result.num_steps < 10 * 16


# --- evaluation ----------------------------------------------------------------------------------------


def test_evaluate_hand_made_case() -> None:
    with torch.random.fork_rng(devices=[]):
        model = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False))
    with torch.no_grad():
        model[1].weight.copy_(torch.eye(2))  # logits = the input itself
    x = torch.tensor([[3.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 5.0]]).view(4, 1, 1, 2)
    y = torch.tensor([0, 1, 1, 1])  # third sample predicted as class 0: wrong
    model.train()
    loss, acc = evaluate(model, x, y, CPU, batch_size=3)  # 2 batches, the last partial
    assert acc == pytest.approx(0.75)
    expected = F.cross_entropy(x.view(4, 2), y).item()
    assert loss == pytest.approx(expected, rel=1e-6)
    assert model.training  # mode restored


def test_evaluate_uses_eval_mode_and_restores_it() -> None:
    model = _bn_model()
    x, y = _separable(16)
    model.eval()
    expected = F.cross_entropy(model(x), y).item()
    model.train()
    stats = copy.deepcopy(model[1].state_dict())
    loss, _ = evaluate(model, x, y, CPU)
    assert loss == pytest.approx(expected, rel=1e-6)
    assert model.training
    for key, value in model[1].state_dict().items():
        assert torch.equal(value, stats[key])  # eval mode: running stats untouched

    model.eval()
    evaluate(model, x, y, CPU)
    assert not model.training


def test_evaluate_empty_set() -> None:
    loss, acc = evaluate(_linear_model(), torch.empty(0, 1, 2, 2), torch.empty(0, dtype=torch.long), CPU)
    assert math.isnan(loss) and math.isnan(acc)


# --- config --------------------------------------------------------------------------------------------


def test_config_defaults_follow_spec() -> None:
    cfg = LocalTrainingConfig(epochs=1, batch_size=32, lr=0.1)
    assert (cfg.momentum, cfg.weight_decay, cfg.lr_decay) == (0.5, 5e-4, 0.998)
    assert cfg.optimizer == "sgd" and cfg.rho == 0.05 and cfg.adaptive is False and cfg.max_steps is None


@pytest.mark.parametrize(
    "overrides",
    [
        {"epochs": 0},
        {"batch_size": 0},
        {"lr": 0.0},
        {"momentum": -0.1},
        {"weight_decay": -1.0},
        {"lr_decay": 0.0},
        {"optimizer": "adam"},
        {"rho": -0.5},
        {"max_steps": 0},
    ],
)
def test_config_validation(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _config(**overrides)


def test_empty_client_takes_no_step() -> None:
    model = _linear_model()
    before = _weights(model)
    result = train_local(model, torch.empty(0, 1, 2, 2), torch.empty(0, dtype=torch.long), _config(), 1, _gen(), CPU)
    assert result == LocalTrainingResult(loss=0.0, accuracy=0.0, num_examples=0, num_steps=0, diverged=False)
    assert all(torch.equal(a, b) for a, b in zip(before, _weights(model), strict=True))


@pytest.mark.parametrize("optimizer", ["sgd", "sam"])
@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]
)
def test_training_on_the_device_with_cpu_data_and_cpu_generator(optimizer: str, device: str) -> None:
    """The model on ``device``, the data and the shuffle generator on the CPU (as a worker holds them): the model
    stays on the device and trains as the CPU path does (on a GPU to float tolerance, on the CPU exactly)."""
    x, y = _separable(40)
    on = torch.device(device)
    model = _bn_model()
    cfg = _config(optimizer=optimizer, epochs=3, lr=0.2)
    result = train_local(model, x, y, cfg, 1, _gen(), on)
    assert not result.diverged and result.num_steps == 15
    assert all(p.device.type == device for p in model.parameters())
    loss, acc = evaluate(model, x, y, on)
    assert math.isfinite(loss) and 0.0 <= acc <= 1.0
    # Same shuffles as on CPU: the permutation comes from the CPU generator, not the device.
    cpu_model = _bn_model()
    train_local(cpu_model, x, y, cfg, 1, _gen(), CPU)
    for p, q in zip(model.parameters(), cpu_model.parameters(), strict=True):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-3, atol=1e-4)
        if device == "cpu":
            assert torch.equal(p, q)


# --- the optimizer's kernels ---------------------------------------------------------------------------


def _reference_train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: LocalTrainingConfig) -> None:
    """train_local's SGD / SAM steps written with torch's per-tensor (``foreach=False``) optimizer kernels."""
    from clients.sam import SAM

    params = list(model.parameters())
    kwargs = {"lr": cfg.lr, "momentum": cfg.momentum, "weight_decay": cfg.weight_decay, "foreach": False}
    sam = SAM(params, torch.optim.SGD, rho=cfg.rho, **kwargs) if cfg.optimizer == "sam" else None
    optimizer = sam if sam is not None else torch.optim.SGD(params, **kwargs)
    gen = _gen()
    n = int(x.shape[0])
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, cfg.batch_size):
            idx = perm[start : start + cfg.batch_size]
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            if sam is not None:
                sam.first_step(zero_grad=True)
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                sam.second_step(zero_grad=False)
            else:
                optimizer.step()


@pytest.mark.parametrize("optimizer", ["sgd", "sam"])
def test_multi_tensor_kernels_give_the_per_tensor_loops_weights_bit_for_bit(optimizer: str) -> None:
    """train_local runs SGD's foreach kernels (fewer dispatches a step); momentum and weight decay included, the
    weights are exactly those of torch's per-tensor loop, so the app still equals the plain loop (bench/)."""
    from fl_app.models import build_model_for_dataset, to_compute_layout

    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(40, 1, 28, 28, generator=gen), torch.randint(0, 10, (40,), generator=gen)
    cfg = _config(optimizer=optimizer, epochs=2, batch_size=16, lr=0.05, momentum=0.5, weight_decay=5e-4)
    with torch.random.fork_rng(devices=[]):
        model = build_model_for_dataset("cnn", "fashion_mnist", seed=0)
    reference = to_compute_layout(copy.deepcopy(model), CPU)  # the layout train_local trains in
    train_local(model, x, y, cfg, 1, _gen(), CPU)
    _reference_train(reference, x, y, cfg)
    assert all(torch.equal(a, b) for a, b in zip(_weights(model), _weights(reference), strict=True))


def test_weights_that_overflow_on_the_last_step_count_as_diverged() -> None:
    """The loss of the last step is finite, its step sends the weights to ±Inf: the check on the weights (done
    through NumPy on the CPU) reports divergence."""
    x, y = _separable(8)
    cfg = _config(lr=1e38, momentum=0.0, weight_decay=0.0, max_steps=1)

    def steep(model: nn.Module) -> torch.Tensor:  # a gradient of 100 on every weight: 1e38 · 100 overflows float32
        return 100 * sum(p.sum() for p in model.parameters())

    result = train_local(_linear_model(), x, y, cfg, 1, _gen(), CPU, extra_loss=steep)
    assert result.num_steps == 1 and result.diverged and math.isnan(result.loss)
