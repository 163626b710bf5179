"""Tests for clients/regularizers.py: the BLUR penalty as defined in docs/algorithms.md ("Definitions of the
baselines").

R(w) = (λ/2) · max(0, ‖w − w^t‖ − C)² over the whole flattened model; its gradient λ(‖Δ‖ − C)Δ/‖Δ‖ outside the
ball and 0 inside must flow through autograd (a public implementation's ``.item()`` makes it a no-op), so the term
must change a local step when ‖Δ‖ > C and leave it bit-identical when ‖Δ‖ ≤ C.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from clients.regularizers import blur_penalty, make_blur_loss
from clients.training import LocalTrainingConfig, local_lr, train_local

CPU = torch.device("cpu")


def _mlp(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    """Multi-tensor model (4 parameter tensors), deterministic weights, global RNG untouched."""
    with torch.random.fork_rng(devices=[]):
        model = nn.Sequential(nn.Flatten(), nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2)).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.4 * torch.randn(p.shape, generator=gen, dtype=dtype))
    return model


def _data(n: int = 8, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(n, 1, 2, 2, generator=gen, dtype=dtype), torch.arange(n) % 2


def _snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _displace(model: nn.Module, norm: float, seed: int = 3) -> list[torch.Tensor]:
    """Move the model by a random direction of global norm ``norm``; return the per-tensor displacement."""
    gen = torch.Generator().manual_seed(seed)
    direction = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in model.parameters()]
    total = math.sqrt(sum(float(d.square().sum()) for d in direction))
    delta = [d * (norm / total) for d in direction]
    with torch.no_grad():
        for p, d in zip(model.parameters(), delta, strict=True):
            p.add_(d)
    return delta


def _one_sgd_step_config() -> LocalTrainingConfig:
    # One full-batch step; momentum/weight decay at their defaults (first step: buffer = gradient).
    return LocalTrainingConfig(epochs=1, batch_size=8, lr=0.1, max_steps=1)


# --- value ------------------------------------------------------------------------------------------------


def test_penalty_value_at_known_displacement() -> None:
    """Δ = (3 on one weight, 4 on one bias) spread over two tensors: ‖Δ‖ = 5; C = 2, λ = 0.5 → 0.25 · 9."""
    model = _mlp()
    ref = _snapshot(model)
    with torch.no_grad():
        model[1].weight[0, 0] += 3.0
        model[3].bias[1] += 4.0
    value = blur_penalty(model, ref, clip_norm=2.0, coef=0.5)
    assert value.item() == pytest.approx(0.25 * 9.0, rel=1e-12)
    assert value.requires_grad  # part of the autograd graph, not a detached number
    assert blur_penalty(model, ref, clip_norm=5.0, coef=0.5).item() == 0.0  # on the sphere
    assert blur_penalty(model, ref, clip_norm=7.0, coef=0.5).item() == 0.0  # inside the ball


# --- gradient against the closed form -----------------------------------------------------------------------


@pytest.mark.parametrize(("norm", "clip", "coef"), [(2.5, 1.0, 1.0), (0.7, 0.2, 3.0), (10.0, 9.99, 0.5)])
def test_gradient_matches_closed_form_outside_ball(norm: float, clip: float, coef: float) -> None:
    model = _mlp()
    ref = _snapshot(model)
    delta = _displace(model, norm)
    penalty = blur_penalty(model, ref, clip_norm=clip, coef=coef)
    grads = torch.autograd.grad(penalty, list(model.parameters()))
    for g, d in zip(grads, delta, strict=True):
        torch.testing.assert_close(g, coef * (norm - clip) * d / norm, rtol=1e-10, atol=1e-14)
    assert any(bool(g.abs().max() > 0) for g in grads)


@pytest.mark.parametrize("norm", [0.0, 0.3, 1.0])
def test_gradient_is_exactly_zero_inside_ball(norm: float) -> None:
    """Including Δ = 0, where a sqrt-of-sum-of-squares norm would give NaN."""
    model = _mlp()
    ref = _snapshot(model)
    if norm > 0:
        _displace(model, norm)
    penalty = blur_penalty(model, ref, clip_norm=1.0, coef=2.0)
    grads = torch.autograd.grad(penalty, list(model.parameters()))
    assert penalty.item() == 0.0
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)


def test_zero_clip_norm_is_an_l2_prox_term() -> None:
    """C = 0: R = (λ/2)‖Δ‖², gradient λΔ; and finite (zero) at Δ = 0."""
    model = _mlp()
    ref = _snapshot(model)
    grads = torch.autograd.grad(blur_penalty(model, ref, 0.0, 1.5), list(model.parameters()))
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    delta = _displace(model, 0.8)
    grads = torch.autograd.grad(blur_penalty(model, ref, 0.0, 1.5), list(model.parameters()))
    for g, d in zip(grads, delta, strict=True):
        torch.testing.assert_close(g, 1.5 * d, rtol=1e-10, atol=1e-14)


# --- inside train_local --------------------------------------------------------------------------------------


def test_changes_the_local_step_when_outside_ball() -> None:
    """Start ‖w − w^t‖ = 2 > C = 0.5: one SGD step differs from plain SGD by exactly −η_t ∇R (momentum buffer
    starts at the gradient, weight decay acts on w alike in both runs)."""
    x, y = _data()
    clip, coef, norm = 0.5, 1.0, 2.0
    plain, blur = _mlp(), _mlp()
    blur_loss = make_blur_loss(blur, clip_norm=clip, coef=coef)  # reference = the round's global model
    delta = _displace(plain, norm)
    _displace(blur, norm)

    train_local(plain, x, y, _one_sgd_step_config(), 1, torch.Generator().manual_seed(0), CPU)
    train_local(blur, x, y, _one_sgd_step_config(), 1, torch.Generator().manual_seed(0), CPU, extra_loss=blur_loss)

    eta = local_lr(0.1, _one_sgd_step_config().lr_decay, 1)
    diffs = [b.detach() - p.detach() for b, p in zip(blur.parameters(), plain.parameters(), strict=True)]
    for diff, d in zip(diffs, delta, strict=True):
        torch.testing.assert_close(diff, -eta * coef * (norm - clip) * d / norm, rtol=1e-9, atol=1e-12)
    assert any(not torch.equal(diff, torch.zeros_like(diff)) for diff in diffs)


@pytest.mark.parametrize(("norm", "coef"), [(0.3, 1.0), (2.0, 0.0)])
def test_no_effect_inside_ball_or_with_zero_coef(norm: float, coef: float) -> None:
    """‖Δ‖ ≤ C, or λ = 0 with ‖Δ‖ > C: the step is bit-identical to plain SGD (float32, several steps)."""
    x, y = _data(dtype=torch.float32)
    cfg = LocalTrainingConfig(epochs=1, batch_size=8, lr=0.01, max_steps=1)
    plain, blur = _mlp(dtype=torch.float32), _mlp(dtype=torch.float32)
    blur_loss = make_blur_loss(blur, clip_norm=1.0, coef=coef)
    _displace(plain, norm)
    _displace(blur, norm)
    train_local(plain, x, y, cfg, 1, torch.Generator().manual_seed(0), CPU)
    train_local(blur, x, y, cfg, 1, torch.Generator().manual_seed(0), CPU, extra_loss=blur_loss)
    for p, q in zip(plain.parameters(), blur.parameters(), strict=True):
        assert torch.equal(p, q)


def test_blur_keeps_update_closer_to_the_ball() -> None:
    """Over a few epochs a strong BLUR term yields a smaller ‖Δ‖ than plain SGD when plain SGD leaves the ball."""
    x, y = _data(16)
    cfg = LocalTrainingConfig(epochs=5, batch_size=4, lr=0.5)
    ref = _snapshot(_mlp())
    clip = 0.1

    plain = _mlp()
    train_local(plain, x, y, cfg, 1, torch.Generator().manual_seed(0), CPU)
    blur = _mlp()
    train_local(blur, x, y, cfg, 1, torch.Generator().manual_seed(0), CPU, extra_loss=make_blur_loss(blur, clip, 1.5))

    def drift(m: nn.Module) -> float:
        return math.sqrt(sum(float((p.detach() - r).square().sum()) for p, r in zip(m.parameters(), ref, strict=True)))

    assert drift(plain) > clip
    assert drift(blur) < drift(plain)


# --- make_blur_loss and validation -------------------------------------------------------------------------


def test_make_blur_loss_snapshots_a_detached_reference() -> None:
    model = _mlp()
    loss_fn = make_blur_loss(model, clip_norm=1.0, coef=2.0)
    assert loss_fn(model).item() == 0.0
    delta = _displace(model, 3.0)  # in-place change of the model must not move the reference
    assert loss_fn(model).item() == pytest.approx(0.5 * 2.0 * (3.0 - 1.0) ** 2, rel=1e-12)
    assert all(not d.requires_grad for d in delta)
    loss_fn(model).backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in model.parameters())


def test_frozen_parameters_are_excluded() -> None:
    model = _mlp()
    model[1].weight.requires_grad_(False)
    loss_fn = make_blur_loss(model, clip_norm=0.0, coef=2.0)
    with torch.no_grad():
        model[1].weight.add_(100.0)  # frozen: not part of w
        model[3].bias[0] += 0.5
    assert loss_fn(model).item() == pytest.approx(0.5 * 2.0 * 0.25, rel=1e-12)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(trainable) == 3
    with pytest.raises(ValueError):
        blur_penalty(model, _snapshot(model), 0.0, 1.0)  # 4 reference tensors for 3 trainable ones


@pytest.mark.parametrize(
    ("clip", "coef"), [(-0.1, 1.0), (math.nan, 1.0), (math.inf, 1.0), (1.0, -1.0), (1.0, math.nan)]
)
def test_hyperparameter_validation(clip: float, coef: float) -> None:
    model = _mlp()
    with pytest.raises(ValueError):
        blur_penalty(model, _snapshot(model), clip, coef)
    with pytest.raises(ValueError):
        make_blur_loss(model, clip, coef)


def test_reference_shape_mismatch_raises() -> None:
    model = _mlp()
    ref = _snapshot(model)
    ref[0] = ref[0].T.contiguous()
    with pytest.raises(ValueError):
        blur_penalty(model, ref, 1.0, 1.0)
