"""Tests for the Noisy-FedAvg / Noisy-FedProx local procedure (seed 004, App. B Alg. 1, Eqs. 2 and 4).

Covers :func:`clients.noisy_training.noisy_step_lr` (the four Thm 3 schedules), :class:`NoisyLocalConfig`
validation and :func:`clients.noisy_training.train_local_noisy`: per-step gradient clipping to V on the global
norm, the prox term added after clipping, exactly K plain-SGD steps, minibatch sampling, determinism and the
divergence stop.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clients.noisy_training import noisy_step_lr, train_local_noisy
from clients.training import LocalTrainingResult, NoisyLocalConfig

CPU = torch.device("cpu")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _linear_model(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Linear:
    """A 4 → 3 softmax-regression model with deterministic weights (global RNG left untouched)."""
    with torch.random.fork_rng(devices=[]):
        model = nn.Linear(4, 3).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=dtype))
    return model


def _data(n: int = 12, seed: int = 1, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """n distinct feature rows (so a row identifies its sample) with labels in {0, 1, 2}."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=gen, dtype=dtype) + torch.arange(n, dtype=dtype)[:, None] * 0.01
    y = torch.arange(n) % 3
    return x, y


def _config(**overrides: object) -> NoisyLocalConfig:
    base = NoisyLocalConfig(steps=5, batch_size=4, lr=0.1, schedule="constant", grad_clip=1.0)
    return dataclasses.replace(base, **overrides)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _closed_form_grad(model: nn.Linear, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """∇ of the mean cross-entropy of softmax regression: ((softmax − onehot)ᵀ X / n, mean(softmax − onehot))."""
    with torch.no_grad():
        probs = torch.softmax(x @ model.weight.T + model.bias, dim=1)
        err = probs - F.one_hot(y, probs.shape[1]).to(probs.dtype)
        return [err.T @ x / x.shape[0], err.mean(dim=0)]


def _autograd_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    loss = F.cross_entropy(model(x), y)
    return [g.detach() for g in torch.autograd.grad(loss, list(model.parameters()))]


def _clip(grads: list[torch.Tensor], v: float) -> list[torch.Tensor]:
    norm = torch.sqrt(sum(g.square().sum() for g in grads))
    return [g / max(1.0, float(norm) / v) for g in grads]


def _global_norm(tensors: list[torch.Tensor]) -> float:
    return float(torch.sqrt(sum(t.square().sum() for t in tensors)))


# --- step-size schedules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        ("constant", 0.1),
        ("cyclic", 0.1 / 4),  # μ/(k+1), k = 3
        ("stagewise", 0.1 / 6),  # μ/(t+1), t = 5
        ("continuous", 0.1 / 54),  # μ/(tK+k+1) = μ/(50+3+1)
    ],
)
def test_noisy_step_lr_values(schedule: str, expected: float) -> None:
    assert noisy_step_lr(0.1, schedule, k=3, t=5, K=10) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("schedule", ["constant", "cyclic", "stagewise", "continuous"])
def test_noisy_step_lr_first_step_of_first_round_is_mu(schedule: str) -> None:
    assert noisy_step_lr(0.3, schedule, k=0, t=0, K=7) == 0.3


def test_noisy_step_lr_continuous_counts_global_steps() -> None:
    K = 4
    values = [noisy_step_lr(1.0, "continuous", k, t, K) for t in range(3) for k in range(K)]
    assert values == pytest.approx([1.0 / (s + 1) for s in range(3 * K)])


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lr=0.0),
        dict(lr=math.nan),
        dict(schedule="linear"),
        dict(k=-1),
        dict(k=4),
        dict(t=-1),
        dict(K=0),
    ],
)
def test_noisy_step_lr_validation(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = dict(lr=0.1, schedule="cyclic", k=0, t=0, K=4)
    args.update(kwargs)
    with pytest.raises(ValueError):
        noisy_step_lr(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "overrides",
    [
        dict(steps=0),
        dict(batch_size=0),
        dict(lr=0.0),
        dict(lr=math.inf),
        dict(schedule="exponential"),
        dict(grad_clip=0.0),
        dict(grad_clip=-1.0),
        dict(grad_clip=math.inf),
        dict(prox_coef=-0.1),
        dict(prox_coef=math.nan),
    ],
)
def test_config_validation(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _config(**overrides)


def test_config_default_is_fedavg_and_frozen() -> None:
    cfg = _config()
    assert cfg.prox_coef == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0  # type: ignore[misc]


# --- one step against the closed form --------------------------------------------------------------------


@pytest.mark.parametrize("active", [True, False])
def test_one_step_matches_closed_form(active: bool) -> None:
    """Full batch, K = 1: w₁ = w₀ − μ · g / max(1, ‖g‖/V) with g the closed-form softmax-regression gradient."""
    x, y = _data(10)
    model = _linear_model()
    w0 = [p.detach().clone() for p in model.parameters()]
    g = _closed_form_grad(model, x, y)
    g_norm = _global_norm(g)
    v = 0.25 * g_norm if active else 4.0 * g_norm
    lr = 0.7
    cfg = _config(steps=1, batch_size=10, lr=lr, grad_clip=v, schedule="stagewise")

    result = train_local_noisy(model, x, y, cfg, server_round=1, generator=_gen(), device=CPU)
    assert result.num_steps == 1 and not result.diverged

    factor = v / g_norm if active else 1.0
    for p, p0, gi in zip(model.parameters(), w0, g, strict=True):
        torch.testing.assert_close(p.detach(), p0 - lr * factor * gi, rtol=1e-12, atol=1e-12)
    step_len = _global_norm([p.detach() - p0 for p, p0 in zip(model.parameters(), w0, strict=True)])
    if active:
        assert step_len == pytest.approx(lr * v, rel=1e-10)  # clipped: the step has length exactly η·V
    else:
        assert step_len == pytest.approx(lr * g_norm, rel=1e-10)  # untouched gradient


def test_step_size_follows_schedule_and_round() -> None:
    """Stage-wise in server round 3 (t = 2): the single step uses η = μ/3."""
    x, y = _data(10)
    model = _linear_model()
    w0 = [p.detach().clone() for p in model.parameters()]
    g = _closed_form_grad(model, x, y)
    cfg = _config(steps=1, batch_size=10, lr=0.6, grad_clip=1e6, schedule="stagewise")
    train_local_noisy(model, x, y, cfg, server_round=3, generator=_gen(), device=CPU)
    for p, p0, gi in zip(model.parameters(), w0, g, strict=True):
        torch.testing.assert_close(p.detach(), p0 - 0.2 * gi, rtol=1e-12, atol=1e-12)


# --- FedProx ----------------------------------------------------------------------------------------------


def test_prox_term_two_steps_matches_manual_computation() -> None:
    """Eq. 4 over 2 full-batch steps (cyclic η): w₂ = w₁ − η₁ (clip(∇f(w₁)) + α (w₁ − w₀)); clip active."""
    x, y = _data(10)
    alpha, lr, v = 0.8, 0.5, 0.05
    cfg = _config(steps=2, batch_size=10, lr=lr, grad_clip=v, schedule="cyclic", prox_coef=alpha)

    manual = _linear_model()
    w0 = [p.detach().clone() for p in manual.parameters()]
    with torch.no_grad():
        for k in range(2):
            g = _clip(_closed_form_grad(manual, x, y), v)
            eta = lr / (k + 1)
            for p, p0, gi in zip(manual.parameters(), w0, g, strict=True):
                p.sub_(eta * (gi + alpha * (p - p0)))

    model = _linear_model()
    result = train_local_noisy(model, x, y, cfg, server_round=1, generator=_gen(), device=CPU)
    assert result.num_steps == 2
    for p, q in zip(model.parameters(), manual.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-12, atol=1e-12)


def test_prox_term_adds_exactly_alpha_times_drift() -> None:
    """Same data and batches: Prox and Avg agree after step 1 (w = w_t) and differ at step 2 by −η₁·α(w₁ − w₀)."""
    x, y = _data(10)
    alpha, lr, v = 0.8, 0.5, 0.05
    base = _config(steps=2, batch_size=10, lr=lr, grad_clip=v, schedule="cyclic")

    one_step = _linear_model()
    train_local_noisy(one_step, x, y, dataclasses.replace(base, steps=1), 1, _gen(), CPU)
    w0, w1 = _flat(_linear_model()), _flat(one_step)

    avg, prox = _linear_model(), _linear_model()
    train_local_noisy(avg, x, y, base, 1, _gen(), CPU)
    train_local_noisy(prox, x, y, dataclasses.replace(base, prox_coef=alpha), 1, _gen(), CPU)
    eta1 = lr / 2
    torch.testing.assert_close(_flat(prox) - _flat(avg), -eta1 * alpha * (w1 - w0), rtol=1e-10, atol=1e-14)
    assert not torch.equal(_flat(prox), _flat(avg))


def test_prox_term_is_not_clipped() -> None:
    """The prox term is added after clipping (Eq. 4): with tiny V the step is dominated by α(w − w_t)."""
    x, y = _data(10)
    model = _linear_model()
    w0 = _flat(model)
    cfg = _config(steps=2, batch_size=10, lr=1.0, grad_clip=1e-6, schedule="constant", prox_coef=0.5)
    snapshots: list[torch.Tensor] = []
    model.register_forward_pre_hook(lambda m, _inp: snapshots.append(_flat(m)))
    train_local_noisy(model, x, y, cfg, 1, _gen(), CPU)
    w1, w2 = snapshots[1], _flat(model)
    # Step 2 = −η (clip(g) + α (w1 − w0)); the clipped part has norm ≤ 1e-6.
    expected = -1.0 * 0.5 * (w1 - w0)
    assert float(torch.linalg.vector_norm((w2 - w1) - expected)) <= 1e-6 * (1 + 1e-9)


# --- step count, sampling, clipping bound ---------------------------------------------------------------


def test_exactly_k_steps_of_batch_size_b() -> None:
    """K = 7, n = 10, B = 4: seven forward passes of 4 samples each, independent of n."""
    x, y = _data(10)
    model = _linear_model()
    sizes: list[int] = []
    model.register_forward_hook(lambda _m, inputs, _out: sizes.append(int(inputs[0].shape[0])))
    result = train_local_noisy(model, x, y, _config(steps=7, batch_size=4), 1, _gen(), CPU)
    assert sizes == [4] * 7
    assert result.num_steps == 7 and result.num_examples == 10 and not result.diverged


def test_batch_larger_than_client_uses_whole_dataset() -> None:
    x, y = _data(5)
    model = _linear_model()
    sizes: list[int] = []
    model.register_forward_hook(lambda _m, inputs, _out: sizes.append(int(inputs[0].shape[0])))
    result = train_local_noisy(model, x, y, _config(steps=3, batch_size=64), 1, _gen(), CPU)
    assert sizes == [5, 5, 5] and result.num_steps == 3


def test_minibatches_without_replacement_within_a_pass() -> None:
    """n = 10, B = 4: each pass of a permutation gives 2 disjoint batches of distinct samples, then a reshuffle."""
    x, y = _data(10)
    row_index = {tuple(row.tolist()): i for i, row in enumerate(x)}
    model = _linear_model()
    batches: list[list[int]] = []
    model.register_forward_hook(
        lambda _m, inputs, _out: batches.append([row_index[tuple(r.tolist())] for r in inputs[0]])
    )
    train_local_noisy(model, x, y, _config(steps=6, batch_size=4), 1, _gen(3), CPU)
    assert len(batches) == 6
    for batch in batches:
        assert len(set(batch)) == 4
    for first, second in zip(batches[0::2], batches[1::2], strict=True):  # the two batches of one pass
        assert not set(first) & set(second)
    # Across passes the data are reshuffled (with this seed the passes differ).
    assert [set(b) for b in batches[0:2]] != [set(b) for b in batches[2:4]]


def test_per_step_parameter_change_bounded_by_eta_v() -> None:
    """FedAvg: ‖w_{k+1} − w_k‖ = η_k ‖clip(g)‖ ≤ η_k · V every step, with equality where clipping is active."""
    x, y = _data(12)
    lr, v, K = 0.9, 0.1, 8
    model = _linear_model()
    snapshots: list[torch.Tensor] = []
    model.register_forward_pre_hook(lambda m, _inp: snapshots.append(_flat(m)))
    cfg = _config(steps=K, batch_size=3, lr=lr, grad_clip=v, schedule="cyclic")
    train_local_noisy(model, x, y, cfg, 1, _gen(), CPU)
    snapshots.append(_flat(model))
    assert len(snapshots) == K + 1
    changes = [float(torch.linalg.vector_norm(b - a)) for a, b in itertools.pairwise(snapshots)]
    bounds = [noisy_step_lr(lr, "cyclic", k, 0, K) * v for k in range(K)]
    for change, bound in zip(changes, bounds, strict=True):
        assert change <= bound * (1 + 1e-9)
    assert any(change == pytest.approx(bound, rel=1e-9) for change, bound in zip(changes, bounds, strict=True))


def test_loss_and_accuracy_are_averages_over_samples_seen() -> None:
    x, y = _data(10)
    label = {tuple(row.tolist()): int(c) for row, c in zip(x, y, strict=True)}
    model = _linear_model()
    losses: list[float] = []
    hits: list[int] = []

    def record(_m: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        yb = torch.tensor([label[tuple(r.tolist())] for r in inputs[0]])
        losses.append(float(F.cross_entropy(out.detach(), yb)))
        hits.append(int((out.detach().argmax(dim=1) == yb).sum()))

    model.register_forward_hook(record)
    result = train_local_noisy(model, x, y, _config(steps=5, batch_size=4, lr=0.3), 1, _gen(), CPU)
    assert result.loss == pytest.approx(sum(losses) / 5, rel=1e-9)
    assert result.accuracy == pytest.approx(sum(hits) / 20)


# --- determinism, state, edge cases -------------------------------------------------------------------------


def test_deterministic_given_generator_seed() -> None:
    x, y = _data(12)
    cfg = _config(steps=9, batch_size=5, prox_coef=0.3, schedule="continuous")
    models = [_linear_model() for _ in range(2)]
    results = [train_local_noisy(m, x, y, cfg, 4, _gen(42), CPU) for m in models]
    assert torch.equal(_flat(models[0]), _flat(models[1]))
    assert results[0] == results[1]

    other = _linear_model()
    train_local_noisy(other, x, y, cfg, 4, _gen(43), CPU)
    assert not torch.equal(_flat(other), _flat(models[0]))


def test_does_not_touch_global_rng_and_leaves_no_grads() -> None:
    x, y = _data(12)
    model = _linear_model()
    state = torch.get_rng_state()
    result = train_local_noisy(model, x, y, _config(), 1, _gen(), CPU)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is None for p in model.parameters())
    assert model.training
    assert isinstance(result, LocalTrainingResult)


def test_frozen_parameters_are_not_updated() -> None:
    x, y = _data(12)
    model = _linear_model()
    model.bias.requires_grad_(False)
    bias = model.bias.detach().clone()
    weight = model.weight.detach().clone()
    train_local_noisy(model, x, y, _config(prox_coef=0.5), 1, _gen(), CPU)
    assert torch.equal(model.bias, bias)
    assert not torch.equal(model.weight.detach(), weight)


def test_empty_client_takes_no_step() -> None:
    model = _linear_model()
    result = train_local_noisy(model, torch.zeros(0, 4, dtype=torch.float64), torch.zeros(0, dtype=torch.long),
                               _config(), 1, _gen(), CPU)  # fmt: skip
    assert result == LocalTrainingResult(loss=0.0, accuracy=0.0, num_examples=0, num_steps=0, diverged=False)


def test_input_validation() -> None:
    x, y = _data(6)
    with pytest.raises(ValueError):
        train_local_noisy(_linear_model(), x, y, _config(), 0, _gen(), CPU)
    with pytest.raises(ValueError):
        train_local_noisy(_linear_model(), x, y[:5], _config(), 1, _gen(), CPU)


# --- divergence ----------------------------------------------------------------------------------------------


class _NaNAfter(nn.Module):
    """Wraps a model; its forward returns NaN logits from the ``bad``-th call on (1-based)."""

    def __init__(self, inner: nn.Module, bad: int) -> None:
        super().__init__()
        self.inner = inner
        self.bad = bad
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = self.inner(x)
        return out * math.nan if self.calls >= self.bad else out


def test_nan_loss_stops_at_once_with_last_finite_weights() -> None:
    """Step 3 produces NaN: two steps are kept and the weights equal a clean two-step run."""
    x, y = _data(12)
    cfg = _config(steps=6, batch_size=4, prox_coef=0.2)
    model = _NaNAfter(_linear_model(), bad=3)
    result = train_local_noisy(model, x, y, cfg, 1, _gen(), CPU)
    assert result.diverged and math.isnan(result.loss)
    assert result.num_steps == 2
    assert model.calls == 3
    assert 0.0 <= result.accuracy <= 1.0

    reference = _linear_model()
    train_local_noisy(reference, x, y, dataclasses.replace(cfg, steps=2), 1, _gen(), CPU)
    assert torch.equal(_flat(model.inner), _flat(reference))


def test_non_finite_input_diverges_before_any_step() -> None:
    x, y = _data(8)
    x[:, 0] = math.inf
    model = _linear_model()
    before = _flat(model)
    result = train_local_noisy(model, x, y, _config(steps=3, batch_size=8), 1, _gen(), CPU)
    assert result.diverged and result.num_steps == 0 and math.isnan(result.loss)
    assert torch.equal(_flat(model), before)
