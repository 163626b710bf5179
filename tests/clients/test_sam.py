"""Tests for clients/sam.py: SAM (Foret et al., 2021; DP-FedSAM Eqs. 8–9) and ASAM (Kwon et al., 2021).

Closed forms on a quadratic f(w) = ½ wᵀAw − bᵀw, whose gradient is Aw − b, check one step against
w' = w − η ∇f(w + e) with e = ρ g/‖g‖ (SAM) or e = ρ w²⊙g/‖|w|⊙g‖ (ASAM), g = ∇f(w).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from clients.sam import SAM, frozen_batchnorm_stats

DTYPE = torch.float64


def _spd(d: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    m = torch.randn(d, d, generator=gen, dtype=DTYPE)
    return m @ m.T + d * torch.eye(d, dtype=DTYPE)


def _vec(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=DTYPE)


def _quadratic(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 0.5 * w @ a @ w - b @ w


def _grad(w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ w - b


def _sam_closed_form(
    w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, lr: float, rho: float, adaptive: bool = False
) -> torch.Tensor:
    g = _grad(w, a, b)
    if adaptive:
        e = rho * w.square() * g / torch.linalg.vector_norm(w.abs() * g)
    else:
        e = rho * g / torch.linalg.vector_norm(g)
    return w - lr * _grad(w + e, a, b)


def _init_params(model: nn.Module, seed: int) -> nn.Module:
    """Deterministic weights from an explicit generator (the global RNG is never seeded or used)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    return model


def _sum_of_squares_closure(w: nn.Parameter) -> torch.Tensor:
    loss = w.square().sum()
    loss.backward()
    return loss


class _Counter:
    def __init__(self) -> None:
        self.calls = 0


def _single_closure(w: nn.Parameter, a: torch.Tensor, b: torch.Tensor, counter: _Counter | None = None) -> torch.Tensor:
    if counter is not None:
        counter.calls += 1
    loss = _quadratic(w, a, b)
    loss.backward()
    return loss


@pytest.mark.parametrize("adaptive", [False, True])
def test_one_step_matches_closed_form(adaptive: bool) -> None:
    a, b = _spd(3, 0), _vec([1.0, -2.0, 0.5])
    w0 = _vec([0.3, -1.2, 2.0])
    w = nn.Parameter(w0.clone())
    lr, rho = 0.1, 0.2
    sam = SAM([w], torch.optim.SGD, rho=rho, adaptive=adaptive, lr=lr)
    sam.step(lambda: _single_closure(w, a, b))
    expected = _sam_closed_form(w0, a, b, lr, rho, adaptive=adaptive)
    torch.testing.assert_close(w.detach(), expected, rtol=1e-12, atol=1e-12)


def test_asam_differs_from_sam() -> None:
    """Guard against the closed-form test passing for a trivial reason (e.g. |w| = 1)."""
    a, b, w0 = _spd(3, 0), _vec([1.0, -2.0, 0.5]), _vec([0.3, -1.2, 2.0])
    sam_step = _sam_closed_form(w0, a, b, 0.1, 0.2, adaptive=False)
    asam_step = _sam_closed_form(w0, a, b, 0.1, 0.2, adaptive=True)
    assert not torch.allclose(sam_step, asam_step)


@pytest.mark.parametrize("adaptive", [False, True])
def test_norm_is_global_over_parameter_tensors(adaptive: bool) -> None:
    a, b = _spd(5, 1), _vec([0.5, -1.0, 2.0, 0.0, 1.5])
    w0 = _vec([1.0, -0.5, 0.25, 2.0, -1.5])
    w1, w2 = nn.Parameter(w0[:2].clone()), nn.Parameter(w0[2:].clone())
    lr, rho = 0.05, 0.3
    # Two groups, to also check that the norm spans groups and not just tensors within a group.
    sam = SAM([{"params": [w1]}, {"params": [w2]}], torch.optim.SGD, rho=rho, adaptive=adaptive, lr=lr)

    def closure() -> torch.Tensor:
        loss = _quadratic(torch.cat([w1, w2]), a, b)
        loss.backward()
        return loss

    sam.step(closure)
    got = torch.cat([w1.detach(), w2.detach()])
    torch.testing.assert_close(got, _sam_closed_form(w0, a, b, lr, rho, adaptive), rtol=1e-12, atol=1e-12)

    # A per-tensor norm (the bug the global norm avoids) gives a measurably different step.
    g = _grad(w0, a, b)
    e_per_tensor = torch.cat([rho * g[:2] / g[:2].norm(), rho * g[2:] / g[2:].norm()])
    if not adaptive:
        per_tensor = w0 - lr * _grad(w0 + e_per_tensor, a, b)
        assert not torch.allclose(got, per_tensor, rtol=1e-6, atol=1e-9)


def test_defaults_plain_sam() -> None:
    w = nn.Parameter(torch.zeros(2))
    sam = SAM([w], torch.optim.SGD, lr=0.1)
    assert sam.param_groups[0]["adaptive"] is False
    assert sam.param_groups[0]["rho"] == pytest.approx(0.05)


def test_negative_rho_rejected() -> None:
    with pytest.raises(ValueError, match="rho"):
        SAM([nn.Parameter(torch.zeros(2))], torch.optim.SGD, rho=-0.1, lr=0.1)


@pytest.mark.parametrize("adaptive", [False, True])
def test_rho_zero_equals_sgd_bitwise(adaptive: bool) -> None:
    """ρ = 0: e = 0 and the restore is an exact copy, so SAM(SGD) must reproduce SGD bit for bit."""
    a, b = _spd(3, 2), _vec([1.0, 0.0, -1.0])
    w_sam = nn.Parameter(_vec([0.5, 1.5, -0.5]))
    w_sgd = nn.Parameter(w_sam.detach().clone())
    kwargs = dict(lr=0.05, momentum=0.5, weight_decay=5e-4)
    sam = SAM([w_sam], torch.optim.SGD, rho=0.0, adaptive=adaptive, **kwargs)
    sgd = torch.optim.SGD([w_sgd], **kwargs)
    for _ in range(5):
        sam.step(lambda: _single_closure(w_sam, a, b))
        sgd.zero_grad()
        _single_closure(w_sgd, a, b)
        sgd.step()
    assert torch.equal(w_sam.detach(), w_sgd.detach())


def test_step_uses_exactly_two_forward_backward_passes() -> None:
    a, b = _spd(3, 3), _vec([1.0, 1.0, 1.0])
    w = nn.Parameter(_vec([0.1, 0.2, 0.3]))
    sam = SAM([w], torch.optim.SGD, rho=0.1, lr=0.1)
    counter = _Counter()
    for step in range(1, 4):
        sam.step(lambda: _single_closure(w, a, b, counter))
        assert counter.calls == 2 * step


def test_step_returns_loss_at_unperturbed_point_and_requires_closure() -> None:
    a, b = _spd(3, 3), _vec([1.0, 1.0, 1.0])
    w0 = _vec([0.1, 0.2, 0.3])
    w = nn.Parameter(w0.clone())
    sam = SAM([w], torch.optim.SGD, rho=0.1, lr=0.1)
    loss = sam.step(lambda: _single_closure(w, a, b))
    torch.testing.assert_close(loss.detach(), _quadratic(w0, a, b))
    with pytest.raises(ValueError, match="closure"):
        sam.step()


def test_lr_change_through_param_groups_takes_effect() -> None:
    a, b = _spd(3, 4), _vec([0.0, 1.0, 2.0])
    w0 = _vec([1.0, 2.0, 3.0])
    w = nn.Parameter(w0.clone())
    sam = SAM([w], torch.optim.SGD, rho=0.1, lr=0.1)
    assert sam.param_groups is sam.base_optimizer.param_groups

    sam.param_groups[0]["lr"] = 0.0
    sam.step(lambda: _single_closure(w, a, b))
    assert torch.equal(w.detach(), w0)  # lr 0: perturbation undone exactly, no move

    sam.param_groups[0]["lr"] = 0.02
    sam.step(lambda: _single_closure(w, a, b))
    torch.testing.assert_close(w.detach(), _sam_closed_form(w0, a, b, 0.02, 0.1), rtol=1e-12, atol=1e-12)


def test_lr_scheduler_drives_base_step() -> None:
    w = nn.Parameter(torch.ones(2))
    sam = SAM([w], torch.optim.SGD, rho=0.1, lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(sam, step_size=1, gamma=0.5)
    sam.step(lambda: _sum_of_squares_closure(w))
    sched.step()
    assert sam.base_optimizer.param_groups[0]["lr"] == pytest.approx(0.5)


def test_manual_first_second_step_equals_step() -> None:
    a, b = _spd(3, 5), _vec([1.0, -1.0, 0.0])
    w_a = nn.Parameter(_vec([0.4, -0.3, 1.1]))
    w_b = nn.Parameter(w_a.detach().clone())
    sam_a = SAM([w_a], torch.optim.SGD, rho=0.2, lr=0.1, momentum=0.9)
    sam_b = SAM([w_b], torch.optim.SGD, rho=0.2, lr=0.1, momentum=0.9)
    for _ in range(3):
        sam_a.step(lambda: _single_closure(w_a, a, b))
        sam_b.zero_grad()
        _single_closure(w_b, a, b)
        sam_b.first_step(zero_grad=True)
        assert sam_b.is_perturbed
        _single_closure(w_b, a, b)
        sam_b.second_step(zero_grad=True)
        assert not sam_b.is_perturbed and w_b.grad is None
    assert torch.equal(w_a.detach(), w_b.detach())


def test_step_order_is_enforced_and_restore_is_exact() -> None:
    a, b = _spd(3, 6), _vec([1.0, 2.0, 3.0])
    w0 = _vec([0.123, -4.56, 7.89])
    w = nn.Parameter(w0.clone())
    sam = SAM([w], torch.optim.SGD, rho=0.7, lr=0.1)
    with pytest.raises(RuntimeError):
        sam.second_step()
    _single_closure(w, a, b)
    sam.first_step()
    assert not torch.equal(w.detach(), w0)
    with pytest.raises(RuntimeError):
        sam.first_step()
    sam.restore()
    assert torch.equal(w.detach(), w0)


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_perturbed_weights_are_w_plus_e_in_place_and_w_comes_back_in_its_own_storage(adaptive: bool) -> None:
    """first_step writes w + e into a buffer the parameter points at: the same bits as adding e in place (float32,
    a channels-last weight), the parameter's layout kept; second_step points it back at w's own storage (no copy,
    so the optimizer updates the tensor the model had) and takes the base step there."""
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(8, 4, 3, 3, generator=gen).contiguous(memory_format=torch.channels_last)
    w = nn.Parameter(weight.clone(memory_format=torch.preserve_format))
    grad = torch.randn(8, 4, 3, 3, generator=gen)
    sam = SAM([w], torch.optim.SGD, rho=0.3, adaptive=adaptive, lr=0.1, momentum=0.5)
    storage = w.data_ptr()
    for _ in range(2):  # the second step reuses the buffer
        w.grad = grad.clone()
        before = w.detach().clone(memory_format=torch.preserve_format)
        scale = 0.3 / (torch.linalg.vector_norm(w.abs() * grad if adaptive else grad) + 1e-12)
        expected = before.clone(memory_format=torch.preserve_format)
        e = grad * scale
        if adaptive:
            e.mul_(before.square())
        expected.add_(e)
        sam.first_step(zero_grad=False)
        assert torch.equal(w.detach(), expected)
        assert w.is_contiguous(memory_format=torch.channels_last)
        sam.second_step(zero_grad=False)
        assert w.data_ptr() == storage
        assert w.is_contiguous(memory_format=torch.channels_last)
        assert not torch.equal(w.detach(), before)  # the base step moved w itself


def test_zero_gradient_gives_no_perturbation_and_no_nan() -> None:
    w = nn.Parameter(_vec([1.0, 2.0]))
    sam = SAM([w], torch.optim.SGD, rho=0.5, lr=0.1)
    w.grad = torch.zeros_like(w)
    sam.first_step(zero_grad=False)
    assert torch.equal(w.detach(), _vec([1.0, 2.0]))
    sam.second_step()
    assert torch.isfinite(w).all()


def test_parameters_without_grad_are_left_alone() -> None:
    used = nn.Parameter(_vec([1.0, 2.0]))
    unused = nn.Parameter(_vec([3.0, 4.0]))
    sam = SAM([used, unused], torch.optim.SGD, rho=0.5, lr=0.1)
    sam.step(lambda: _sum_of_squares_closure(used))
    assert torch.equal(unused.detach(), _vec([3.0, 4.0]))
    # Only the used parameter enters the norm: e = ρ ĝ, so w' = w − η · 2(w + ρ w/‖w‖).
    w0 = _vec([1.0, 2.0])
    expected = w0 - 0.1 * 2 * (w0 + 0.5 * w0 / w0.norm())
    torch.testing.assert_close(used.detach(), expected, rtol=1e-12, atol=1e-12)


def test_state_dict_round_trip_keeps_momentum_and_shared_groups() -> None:
    a, b = _spd(3, 7), _vec([1.0, -2.0, 0.5])
    w = nn.Parameter(_vec([0.3, -1.2, 2.0]))
    sam = SAM([w], torch.optim.SGD, rho=0.2, adaptive=True, lr=0.1, momentum=0.9)
    for _ in range(2):
        sam.step(lambda: _single_closure(w, a, b))
    state = copy.deepcopy(sam.state_dict())
    assert state["param_groups"][0]["rho"] == pytest.approx(0.2)
    assert state["param_groups"][0]["adaptive"] is True

    w_restored = nn.Parameter(w.detach().clone())
    sam2 = SAM([w_restored], torch.optim.SGD, rho=0.05, lr=0.5, momentum=0.9)
    sam2.load_state_dict(state)
    assert sam2.param_groups is sam2.base_optimizer.param_groups
    assert sam2.param_groups[0]["rho"] == pytest.approx(0.2)
    assert sam2.param_groups[0]["adaptive"] is True
    buf_loaded = sam2.base_optimizer.state[w_restored]["momentum_buffer"]
    torch.testing.assert_close(buf_loaded, sam.base_optimizer.state[w]["momentum_buffer"])
    # Continuing from the loaded state matches continuing the original optimizer.
    sam.step(lambda: _single_closure(w, a, b))
    sam2.step(lambda: _single_closure(w_restored, a, b))
    assert torch.equal(w.detach(), w_restored.detach())
    # Group sharing survives the load: an lr edit on the wrapper reaches the base optimizer.
    sam2.param_groups[0]["lr"] = 0.0
    assert sam2.base_optimizer.param_groups[0]["lr"] == 0.0


def test_state_dict_refused_mid_step() -> None:
    w = nn.Parameter(_vec([1.0, 2.0]))
    sam = SAM([w], torch.optim.SGD, lr=0.1)
    w.grad = torch.ones_like(w)
    sam.first_step(zero_grad=False)
    with pytest.raises(RuntimeError):
        sam.state_dict()


# --- BatchNorm handling -------------------------------------------------------------------------------------


def _bn_model(momentum: float | None = 0.1) -> nn.Module:
    # Layer constructors draw their default init from the global RNG; fork it so tests leave it as found.
    with torch.random.fork_rng(devices=[]):
        model = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.BatchNorm2d(4, momentum=momentum),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(4 * 4 * 4, 3),
        )
    return _init_params(model, seed=0)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(8, 1, 4, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen)


def _sam_step_on(model: nn.Module, x: torch.Tensor, y: torch.Tensor, freeze: bool) -> None:
    sam = SAM(model.parameters(), torch.optim.SGD, rho=0.5, lr=0.1, momentum=0.5)
    loss_fn = nn.CrossEntropyLoss()
    loss_fn(model(x), y).backward()
    sam.first_step(zero_grad=True)
    if freeze:
        with frozen_batchnorm_stats(model):
            loss_fn(model(x), y).backward()
    else:
        loss_fn(model(x), y).backward()
    sam.second_step(zero_grad=True)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_perturbed_pass_does_not_update_batchnorm_stats(momentum: float | None) -> None:
    x, y = _batch()
    model = _bn_model(momentum)
    reference = copy.deepcopy(model)
    reference(x)  # one ordinary training-mode forward on the same batch
    _sam_step_on(model, x, y, freeze=True)
    bn, bn_ref = model[1], reference[1]
    assert torch.equal(bn.running_mean, bn_ref.running_mean)
    assert torch.equal(bn.running_var, bn_ref.running_var)
    assert int(bn.num_batches_tracked) == 1

    # Sanity: without freezing, the perturbed pass would have moved the statistics.
    unfrozen = _bn_model(momentum)
    _sam_step_on(unfrozen, x, y, freeze=False)
    assert not torch.equal(unfrozen[1].running_mean, bn_ref.running_mean)


def test_frozen_stats_keep_train_mode_batch_normalisation() -> None:
    """Inside the block BN still normalises with batch statistics, i.e. the forward is unchanged."""
    x, _ = _batch()
    model = _bn_model()
    expected = copy.deepcopy(model)(x)
    with frozen_batchnorm_stats(model):
        assert model.training and model[1].training
        out = model(x)
    assert torch.equal(out, expected)


def test_frozen_stats_restored_on_exception_and_after_nan() -> None:
    model = _bn_model()
    before = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}
    with pytest.raises(RuntimeError), frozen_batchnorm_stats(model):
        model(torch.full((4, 1, 4, 4), float("inf")))  # would make the running stats NaN
        raise RuntimeError("boom")
    after = {k: v for k, v in model.state_dict().items() if k in before}
    for key, value in before.items():
        assert torch.equal(after[key], value), key


def test_groupnorm_model_has_no_running_stats_and_trains() -> None:
    with torch.random.fork_rng(devices=[]):
        layers = [
            nn.Conv2d(1, 4, 3, padding=1),
            nn.GroupNorm(2, 4),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64, 3),
        ]
    model = _init_params(nn.Sequential(*layers), seed=0)
    x, y = _batch()
    before = [p.detach().clone() for p in model.parameters()]
    _sam_step_on(model, x, y, freeze=True)
    assert list(model.buffers()) == []
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
