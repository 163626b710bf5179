"""fl_app/server_optimizers.py: each server optimizer against a plain-PyTorch reference step (g = −Δ), sgd bit for
bit against the server step every strategy used before, checkpoint state, and in a strategy: post-processing (ε
unchanged) and an exact resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from fl_app.checkpoint import load_checkpoint
from fl_app.server_optimizers import SERVER_OPTIMIZERS, ServerOptimizer
from tests.helpers import MovingUpdates, build, random_update
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

SHAPES = [(3, 4), (4,)]
LR, BETA1, BETA2, EPS = 0.3, 0.8, 0.95, 1e-2


def _deltas(rounds: int = 4) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(7)
    return [[rng.standard_normal(s) for s in SHAPES] for _ in range(rounds)]


def _torch_reference(name: str, weights: list[np.ndarray], deltas: list[list[np.ndarray]]) -> list[np.ndarray]:
    """The same steps with torch.optim on gradient −Δ (Yogi: its update rule in plain torch, Zaheer et al. 2018)."""
    params = [torch.tensor(w, dtype=torch.float64, requires_grad=True) for w in weights]
    if name == "momentum":
        opt = torch.optim.SGD(params, lr=LR, momentum=BETA1)
    elif name == "adagrad":
        opt = torch.optim.Adagrad(params, lr=LR, eps=EPS)
    elif name == "adam":
        opt = torch.optim.Adam(params, lr=LR, betas=(BETA1, BETA2), eps=EPS)
    elif name == "sgd":
        opt = torch.optim.SGD(params, lr=LR)
    else:
        opt = None
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t, delta in enumerate(deltas, start=1):
        grads = [-torch.tensor(d) for d in delta]
        if opt is not None:
            for p, g in zip(params, grads, strict=True):
                p.grad = g
            opt.step()
            continue
        with torch.no_grad():  # Yogi with Adam's bias corrections
            for i, (p, g) in enumerate(zip(params, grads, strict=True)):
                m[i] = BETA1 * m[i] + (1 - BETA1) * g
                v[i] = v[i] - (1 - BETA2) * g * g * torch.sign(v[i] - g * g)
                p -= LR * (m[i] / (1 - BETA1**t)) / (torch.sqrt(v[i] / (1 - BETA2**t)) + EPS)
    return [p.detach().numpy() for p in params]


@pytest.mark.parametrize("name", SERVER_OPTIMIZERS)
def test_each_server_optimizer_takes_the_reference_step(name):
    weights = [np.zeros(s) for s in SHAPES]
    optimizer = ServerOptimizer(name, lr=LR, momentum=BETA1, beta2=BETA2, eps=EPS)
    ours = weights
    for delta in _deltas():
        ours = optimizer.step(ours, delta)
    reference = _torch_reference(name, weights, _deltas())
    for a, b in zip(ours, reference, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    assert not all(np.allclose(a, 0) for a in ours)


@pytest.mark.parametrize("lr", [1.0, 0.7])
def test_sgd_is_the_former_server_step_bit_for_bit(lr):
    weights = random_update(SHAPES, 1.0, seed=1)  # float32, as the global model
    average = random_update(SHAPES, 0.1, seed=2)
    # Values where a different rounding or order would show: signed zeros, subnormals, overflow, NaN, infinities.
    specials = np.array([0.0, -0.0, 1e-45, -1e-45, 3.4e38, np.nan, np.inf, -np.inf], dtype=np.float32)
    weights[0].ravel()[: specials.size] = specials
    average[0].ravel()[: specials.size] = specials[::-1]
    stepped = ServerOptimizer("sgd", lr=lr).step(weights, average)
    former = [
        (w.astype(np.float64) + lr * a.astype(np.float64)).astype(w.dtype)
        for w, a in zip(weights, average, strict=True)
    ]
    for a, b in zip(stepped, former, strict=True):
        assert a.dtype == np.float32
        assert a.tobytes() == b.tobytes()  # bit for bit: -0.0 and NaN payloads included


@pytest.mark.parametrize("name", ["momentum", "adam", "yogi", "adagrad"])
def test_state_round_trip_continues_exactly(name):
    deltas = _deltas(5)
    straight = ServerOptimizer(name, lr=LR)
    weights = [np.zeros(s) for s in SHAPES]
    for delta in deltas:
        weights = straight.step(weights, delta)
    first = ServerOptimizer(name, lr=LR)
    resumed_weights = [np.zeros(s) for s in SHAPES]
    for delta in deltas[:3]:
        resumed_weights = first.step(resumed_weights, delta)
    second = ServerOptimizer(name, lr=LR)
    second.load_state(*first.state())
    for delta in deltas[3:]:
        resumed_weights = second.step(resumed_weights, delta)
    for a, b in zip(weights, resumed_weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="unknown server optimizer"):
        ServerOptimizer("lamb")


RUN = ["strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2"]


def _run(tmp_path, overrides, rounds, resume=None):
    strategy = build(*RUN, *overrides, checkpoint_dir=tmp_path, resume_from=resume)
    initial = ArrayRecord(random_update([(20, 30), (30,)], 0.1, seed=0))
    result = strategy.start(MovingUpdates(), initial, num_rounds=rounds)
    return strategy, result.arrays.to_numpy_ndarrays()


def test_a_server_optimizer_is_post_processing_and_resumes_exactly(tmp_path):
    sgd, sgd_weights = _run(tmp_path / "sgd", [], rounds=4)
    adam, adam_weights = _run(tmp_path / "adam", ["server_optimizer=adam"], rounds=4)
    assert adam.epsilon() == sgd.epsilon() and adam.ledger.rounds == 4  # the same releases, the same ε
    assert any(not np.array_equal(a, b) for a, b in zip(adam_weights, sgd_weights, strict=True))
    # Stopped after round 2 (checkpointed with the optimizer's moments), resumed to 4: the same model.
    _run(tmp_path / "resumed", ["server_optimizer=adam", "num_rounds=2"], rounds=2)
    checkpoint = load_checkpoint(tmp_path / "resumed")
    assert checkpoint.strategy_state["server_optimizer_steps"] == 2
    _, resumed_weights = _run(tmp_path / "resumed", ["server_optimizer=adam"], rounds=4, resume=checkpoint)
    for a, b in zip(resumed_weights, adam_weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_describe_names_the_settings_each_step_uses():
    assert ServerOptimizer("sgd").describe() == "sgd lr=1"
    assert ServerOptimizer("momentum", lr=1.0, momentum=0.9).describe() == "momentum lr=1 beta1=0.9"
    assert ServerOptimizer("adagrad", lr=0.1).describe() == "adagrad lr=0.1 tau=0.001"
    assert ServerOptimizer("adam", lr=0.01).describe() == "adam lr=0.01 beta1=0.9 beta2=0.99 tau=0.001"
