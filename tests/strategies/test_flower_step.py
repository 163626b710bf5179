"""strategies/flower_step.py: Flower's own strategies as the server step of our rounds, chosen from the Hydra config
(``server_optimizer=flower_fedadam``): Flower's FedAvg is our plain step bit for bit, Flower's FedAdam takes the step
its formula states, and a run under client-level DP with it is post-processing (the same ε) that resumes exactly."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import FedAdam

from fl_app.checkpoint import load_checkpoint
from fl_app.config import ConfigError, ServerOptimizerConfig, compose_config
from fl_app.server_optimizers import ServerOptimizer
from strategies.flower_step import FlowerServerStep, server_step
from tests.helpers import FakeGrid, MovingUpdates, build, random_update
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

SHAPES = [(3, 4), (4,)]
KEYS = ["w", "b"]


def _rounds(rounds: int = 3) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    rng = np.random.default_rng(11)
    weights = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    return weights, [[1e-2 * rng.standard_normal(s) for s in SHAPES] for _ in range(rounds)]


def _steps(step, weights: list[np.ndarray], averages: list[list[np.ndarray]]) -> list[np.ndarray]:
    for server_round, average in enumerate(averages, start=1):
        arrays = ArrayRecord({k: Array(w) for k, w in zip(KEYS, weights, strict=True)})
        step.begin_round(server_round, arrays, FakeGrid())
        weights = step.step(weights, average)
    return weights


def test_flowers_fedavg_is_our_plain_step_bit_for_bit() -> None:
    weights, averages = _rounds()
    flower = _steps(FlowerServerStep(ServerOptimizerConfig(name="flower_fedavg"), 1.0), weights, averages)
    ours = _steps(ServerOptimizer("sgd"), weights, averages)
    for a, b in zip(flower, ours, strict=True):
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b)


def test_flowers_fedadam_takes_the_step_its_formula_states() -> None:
    """FedAdam as Flower writes it: m ← β₁m + (1−β₁)Δ, v ← β₂v + (1−β₂)Δ², w ← w + η_t·m/(√v + τ) with
    η_t = η·√(1−β₂^(t+1))/(1−β₁^(t+1)), Δ = (w + Δ̄) − w in the model's dtype."""
    lr, beta1, beta2, tau = 0.05, 0.8, 0.9, 1e-3
    config = ServerOptimizerConfig(name="flower_fedadam", momentum=beta1, beta2=beta2, eps=tau)
    weights, averages = _rounds()
    got = _steps(FlowerServerStep(config, lr), weights, averages)
    expected = [w.copy() for w in weights]
    m = [np.zeros(s, dtype=np.float32) for s in SHAPES]
    v = [np.zeros(s, dtype=np.float32) for s in SHAPES]
    for t, average in enumerate(averages, start=1):
        eta = lr * np.sqrt(1 - beta2 ** (t + 1.0)) / (1 - beta1 ** (t + 1.0))
        for i, (w, a) in enumerate(zip(expected, average, strict=True)):
            d = (w.astype(np.float64) + a) - w
            m[i] = beta1 * m[i] + (1 - beta1) * d
            v[i] = beta2 * v[i] + (1 - beta2) * d**2
            expected[i] = (w + eta * m[i] / (np.sqrt(v[i]) + tau)).astype(np.float32)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not np.allclose(got[0], _steps(ServerOptimizer("adam", lr, beta1, beta2, tau), weights, averages)[0])


def test_the_config_builds_flowers_strategy_and_refuses_a_step_size_fedavg_has_not() -> None:
    step = server_step(compose_config(["server_optimizer=flower_fedadam"]))
    assert isinstance(step, FlowerServerStep) and type(step.strategy) is FedAdam
    assert step.strategy.eta == 0.01 and step.strategy.tau == 1e-3  # strategy.server_lr's default for FedAdam
    assert step.describe().startswith("flower_fedadam (Flower's FedAdam) eta=0.01")
    assert isinstance(server_step(compose_config([])), ServerOptimizer)
    with pytest.raises(ConfigError, match=r"strategy\.server_lr=0\.5.*flower_fedavg"):
        compose_config(["server_optimizer=flower_fedavg", "strategy.server_lr=0.5"])
    with pytest.raises(ConfigError, match=r"server_optimizer\.name=flower_fedadam: DP-FTRL needs sgd or momentum"):
        build("strategy=dp_ftrl_fedavg", "server_optimizer=flower_fedadam", "dataset.num_clients=20")


RUN = ["strategy=dp_fedsam", "dataset.num_clients=50", "privacy.sample_rate=0.2"]


def _run(tmp_path, overrides, rounds, resume=None):
    strategy = build(*RUN, *overrides, checkpoint_dir=tmp_path, resume_from=resume)
    initial = ArrayRecord(random_update([(20, 30), (30,)], 0.1, seed=0))
    result = strategy.start(MovingUpdates(), initial, num_rounds=rounds)
    return strategy, result.arrays.to_numpy_ndarrays()


def test_dp_fedsam_with_flowers_fedadam_from_the_config_is_post_processing_and_resumes_exactly(tmp_path) -> None:
    plain, plain_weights = _run(tmp_path / "sgd", [], rounds=3)
    same, same_weights = _run(tmp_path / "fedavg", ["server_optimizer=flower_fedavg"], rounds=3)
    for a, b in zip(same_weights, plain_weights, strict=True):
        np.testing.assert_array_equal(a, b)  # Flower's FedAvg under the layer: the same releases, bit for bit
    adam, adam_weights = _run(tmp_path / "fedadam", ["server_optimizer=flower_fedadam"], rounds=3)
    assert adam.epsilon() == plain.epsilon() == same.epsilon() and adam.ledger.rounds == 3
    assert any(not np.array_equal(a, b) for a, b in zip(adam_weights, plain_weights, strict=True))
    # Stopped after round 2 (checkpointed with FedAdam's moments), resumed to 3: the same model.
    _run(tmp_path / "resumed", ["server_optimizer=flower_fedadam", "num_rounds=2"], rounds=2)
    checkpoint = load_checkpoint(tmp_path / "resumed")
    assert {"flower_m_t", "flower_v_t"} <= set(checkpoint.strategy_arrays)
    _, resumed = _run(tmp_path / "resumed", ["server_optimizer=flower_fedadam"], rounds=3, resume=checkpoint)
    for a, b in zip(resumed, adam_weights, strict=True):
        np.testing.assert_array_equal(a, b)
