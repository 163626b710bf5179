"""Tests for clients/cohort.py: a worker trains a cohort of clients (sequential or vectorized engine), privatizes and
screens each one, and returns the float64 sum in partition order with per-client statistics.

Both engines must give, client by client, what one client on its own gives (:func:`_per_client_path`: train_one,
then the recipe: the building blocks a cohort of one runs), for every recipe kind the strategies use: DP-FedAvg,
DP-FedSAM (client placement), ASAM, the BLUR term, Noisy-FedProx (absolute noise from the per-client seeded stream)
and DP-FedSAM-topk with client-side masks.
The data are real Fashion-MNIST Dirichlet(0.3) partitions of the first 300 training images, the model the paper CNN.

The engine comparisons train the CNN in float64 (the global weights and the updates stay float32): in float32 the
batched convolutions of the vectorized engine round differently from one client's, and after a few steps some
pre-activation within rounding of a ReLU / max-pool kink falls on the other side, which moves a client by ~1e-5
(measured on this data with 600 images and B = 32: 1.1e-5 on a DP-FedSAM cohort's sum in round 3).
tests/clients/test_vectorized.py explains and checks this. In float32 the sequential engine is checked bit for bit
against the per-client path instead.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pytest
import torch
from torch import nn

import clients.cohort as cohort
import clients.local_update as local_update
import strategies  # noqa: F401  (registers the strategy names the configs here are validated by)
from clients.captured import StackedOutcome, step_plan
from clients.cohort import CohortResult, clip_and_sum_stacked, train_cohort
from clients.faults import inject_fault
from clients.local_update import train_one
from clients.recipes import privatize_update
from clients.training import NoisyLocalConfig
from clients.vectorized import batch_schedule, train_stacked
from fl_app.config import AppConfig, compose_config
from fl_app.instructions import DataSpec, RecipeSpec, TrainInstructions, local_training_config, make_train_instructions
from fl_app.models import build_model_for_dataset, get_weights, set_weights, weight_names
from fl_app.privacy import mechanisms as mech

ATOL = 1e-5
CPU = torch.device("cpu")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SMALL = [
    "dataset.max_train_samples=300",
    "dataset.num_clients=10",
    "dataset.partition=dirichlet",
    "dataset.alpha=0.3",
    "simulation.device=cpu",
    "privacy.sample_rate=0.3",
    "client.batch_size=16",
]
# Partitions of 49, 17 and 29 samples: with B = 16, 4, 2 and 2 local steps, each ending on a short batch, and every
# client's batches depend on its shuffle stream. Not sorted, so the partition-order summation is exercised.
PIDS = [2, 5, 4]
SIZES = {0: 18, 2: 49, 4: 29, 5: 17, 8: 22}
SERVER_ROUND = 3  # the learning-rate decay and the round's streams are not those of round 1

Recorded = dict[int, list[np.ndarray]]


pytestmark = pytest.mark.usefixtures("fashion_mnist")  # tests/conftest.py: skipped where it is not installed


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def global_weights() -> list[np.ndarray]:
    return get_weights(build_model_for_dataset("cnn", "fashion_mnist", seed=1))


@pytest.fixture
def float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every path (both engines and the per-client building blocks) trains a float64 CNN on float64 inputs (see the
    module docstring)."""
    models: dict[tuple[str, str, str], nn.Module] = {}
    real_client_data = local_update.client_data

    def model64(name: str, dataset: str, device: str) -> nn.Module:
        if (name, dataset, device) not in models:
            models[name, dataset, device] = build_model_for_dataset(name, dataset, seed=0).double().to(device)
        return models[name, dataset, device]

    def data64(spec: DataSpec, partition_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = real_client_data(spec, partition_id)
        return x.double(), y

    for module in (local_update, cohort):
        monkeypatch.setattr(module, "_model", model64)
        monkeypatch.setattr(module, "client_data", data64)


class SentRecorder:
    """Wraps privatize_update inside clients.cohort: keeps each client's Δ and what its recipe made of it."""

    def __init__(self) -> None:
        self.raw: Recorded = {}
        self.sent: Recorded = {}

    def __call__(
        self,
        update: list[np.ndarray],
        ins: TrainInstructions,
        partition_id: int,
        shared_mask: Sequence[np.ndarray] | None = None,
    ) -> tuple[list[np.ndarray], float]:
        sent, norm = privatize_update(update, ins, partition_id, shared_mask)
        self.raw[partition_id] = [np.array(u, copy=True) for u in update]
        self.sent[partition_id] = [np.array(s, copy=True) for s in sent]
        return sent, norm


def _record(monkeypatch: pytest.MonkeyPatch) -> SentRecorder:
    recorder = SentRecorder()
    monkeypatch.setattr(cohort, "privatize_update", recorder)
    return recorder


# ----- instructions, as the strategies build them ---------------------------------------------------------------------


def _config(*overrides: str) -> AppConfig:
    return compose_config([*SMALL, *overrides])


def _instructions(
    config: AppConfig,
    recipe: RecipeSpec,
    training: object,
    *,
    private: bool = True,
    clip: bool = True,
    server_round: int = SERVER_ROUND,
) -> TrainInstructions:
    """What FederatedStrategy.configure_train sends (strategies/base.py), for the given recipe and procedure."""
    p = config.privacy
    m = (
        float(round(p.sample_rate * config.dataset.num_clients))
        if p.sampling == "fixed"
        else mech.expected_clients(config.dataset.num_clients, p.sample_rate)
    )
    return make_train_instructions(
        config,
        server_round,
        recipe=recipe,
        training=training,  # type: ignore[arg-type]
        clip_norm=p.clip_norm if private and clip else 0.0,
        add_noise=private and p.placement == "client",
        noise_multiplier=p.noise_multiplier if private else 0.0,
        expected_clients=m,
    )


@functools.cache
def _dp_fedavg() -> TrainInstructions:
    config = _config("strategy=dp_fedavg")
    return _instructions(config, RecipeSpec(), local_training_config(config, "sgd"))


@functools.cache
def _dp_fedsam_client_placement() -> TrainInstructions:
    config = _config("strategy=dp_fedsam", "privacy.placement=client", "privacy.sampling=fixed")
    return _instructions(config, RecipeSpec(), local_training_config(config, "sam"))


@functools.cache
def _asam() -> TrainInstructions:
    config = _config("strategy=dp_fedsam", "client.adaptive=true", "client.rho=0.5")
    return _instructions(config, RecipeSpec(), local_training_config(config, "sam"))


@functools.cache
def _blur() -> TrainInstructions:
    # Two epochs: Δ = 0 at a client's first step, so BLUR (zero inside the ball) only acts from its second step on.
    config = _config("strategy=dp_fedavg_blur", "client.local_epochs=2")
    recipe = RecipeSpec(kind="dense", blur_coef=config.strategy.blur_coef)
    return _instructions(config, recipe, local_training_config(config, "sgd"))


@functools.cache
def _noisy_fedprox() -> TrainInstructions:
    config = _config("strategy=noisy_fedprox", "strategy.local_steps=3", "strategy.lr_schedule=cyclic")
    s = config.strategy
    training = NoisyLocalConfig(
        steps=s.local_steps,
        batch_size=config.client.batch_size,
        lr=s.noisy_lr,
        schedule=s.lr_schedule,  # type: ignore[arg-type]
        grad_clip=s.grad_clip,
        prox_coef=s.prox_coef,
    )
    return _instructions(config, RecipeSpec(kind="noisy_model", noise_std=s.noise_std), training, clip=False)


@functools.cache
def _dp_fedsam_topk_client() -> TrainInstructions:
    config = _config("strategy=dp_fedsam_topk", "privacy.placement=client", "privacy.sampling=fixed")
    recipe = RecipeSpec(kind="topk_noisy", sparsity=config.strategy.sparsity)
    return _instructions(config, recipe, local_training_config(config, "sam"))


CASES: dict[str, Callable[[], TrainInstructions]] = {
    "dp_fedavg": _dp_fedavg,
    "dp_fedsam_client": _dp_fedsam_client_placement,
    "asam": _asam,
    "dp_fedavg_blur": _blur,
    "noisy_fedprox": _noisy_fedprox,
    "dp_fedsam_topk_client": _dp_fedsam_topk_client,
}


def test_instructions_are_the_intended_recipes() -> None:
    """The cases really are what their names say (else the equivalence tests below prove less)."""
    ins = {name: make() for name, make in CASES.items()}
    assert ins["dp_fedavg"].training.optimizer == "sgd" and not ins["dp_fedavg"].add_noise  # type: ignore[union-attr]
    assert ins["dp_fedavg"].clip_norm > 0
    assert ins["dp_fedsam_client"].training.optimizer == "sam" and ins["dp_fedsam_client"].add_noise  # type: ignore[union-attr]
    assert ins["asam"].training.adaptive and ins["asam"].training.rho == 0.5  # type: ignore[union-attr]
    assert ins["dp_fedavg_blur"].recipe.blur_coef > 0 and ins["dp_fedavg_blur"].clip_norm > 0
    noisy = ins["noisy_fedprox"]
    assert noisy.training is None and noisy.noisy_training is not None and noisy.noisy_training.prox_coef > 0
    assert noisy.noisy_training.schedule == "cyclic" and noisy.recipe.kind == "noisy_model" and noisy.clip_norm == 0
    topk = ins["dp_fedsam_topk_client"]
    assert topk.recipe.kind == "topk_noisy" and topk.add_noise and 0 < topk.recipe.sparsity < 1
    assert topk.expected_clients == 3.0


# ----- helpers --------------------------------------------------------------------------------------------------------


def _max_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    assert [np.shape(x) for x in a] == [np.shape(y) for y in b]
    return max(
        float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in zip(a, b, strict=True)
    )


def _per_client_path(
    weights: list[np.ndarray], ins: TrainInstructions, pids: Sequence[int]
) -> tuple[list[np.ndarray], dict[int, list[np.ndarray]], dict[int, dict]]:
    """Each partition on its own from the building blocks (train_one, then its recipe; the instructions through
    their wire format), the float64 sum in partition order, and each client's update and metrics."""
    sent: dict[int, list[np.ndarray]] = {}
    metrics: dict[int, dict] = {}
    received = TrainInstructions.from_config(dict(ins.to_config_record()))
    for pid in sorted(pids):
        update, result, _ = train_one([w.copy() for w in weights], received, pid)
        assert not result.diverged
        sent[pid], norm = privatize_update(update, received, pid)
        metrics[pid] = {
            "pre_clip_norm": norm,
            "train_loss": result.loss,
            "train_accuracy": result.accuracy,
            "num_steps": result.num_steps,
            "num_examples": result.num_examples,
        }
    total = mech.uniform_sum([sent[pid] for pid in sorted(pids)], [w.shape for w in weights])
    return total, sent, metrics


def _assert_metrics_match(result: CohortResult, metrics: dict[int, dict], num_examples: int | None = None) -> None:
    assert result.accepted == sorted(metrics)
    for j, pid in enumerate(result.accepted):
        want = metrics[pid]
        for key in ("pre_clip_norm", "train_loss"):
            got = result.metrics[key][j]
            assert math.isclose(got, want[key], rel_tol=1e-5, abs_tol=1e-7), (pid, key, got, want[key])
        assert result.metrics["num_steps"][j] == want["num_steps"], pid
        assert result.metrics["train_accuracy"][j] == want["train_accuracy"], pid
    if num_examples is None:
        num_examples = sum(m["num_examples"] for m in metrics.values())
    assert result.num_examples == num_examples


# ----- both engines = the per-client path -----------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
def test_engines_match_the_per_client_path(
    case: str, global_weights: list[np.ndarray], float64: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ins = CASES[case]()
    total, sent, metrics = _per_client_path(global_weights, ins, PIDS)
    training = ins.training
    steps = [3] * 3 if training is None else [training.epochs * math.ceil(SIZES[p] / training.batch_size) for p in PIDS]
    assert [metrics[pid]["num_steps"] for pid in PIDS] == steps
    results: dict[str, CohortResult] = {}
    for engine in ("sequential", "vectorized"):
        recorder = _record(monkeypatch)
        result = train_cohort(global_weights, ins, PIDS, [""] * len(PIDS), engine)  # type: ignore[arg-type]
        results[engine] = result
        assert result.rejected == {"failed": [], "nonfinite": [], "shape": []}
        assert result.reclipped == 0
        assert all(t.dtype == np.float64 for t in result.total)
        # Each client's update, as its recipe sends it, is the per-client path's.
        assert sorted(recorder.sent) == sorted(PIDS)
        for pid in PIDS:
            diff = _max_diff(recorder.sent[pid], sent[pid])
            assert diff <= ATOL, f"{engine}: client {pid} differs by {diff:.3g}"
        diff = _max_diff(result.total, total)
        assert diff <= ATOL, f"{engine}: sum differs by {diff:.3g}"
        _assert_metrics_match(result, metrics)
    assert _max_diff(results["sequential"].total, results["vectorized"].total) <= ATOL
    # Sanity: the updates are not all zero, and the clipped recipes really clipped (‖Δ‖ > C before).
    assert mech.global_l2_norm(total) > 1e-3
    if ins.clip_norm > 0:
        assert min(m["pre_clip_norm"] for m in metrics.values()) > ins.clip_norm


def test_blur_term_is_active_in_the_cohort(global_weights: list[np.ndarray]) -> None:
    """With λ = 0 the clients' updates differ: the BLUR case above compares a term that does something."""
    ins = _blur()
    plain = dataclasses.replace(ins, recipe=dataclasses.replace(ins.recipe, blur_coef=0.0))
    with_blur = train_cohort(global_weights, ins, PIDS, [""] * 3, "sequential")
    without = train_cohort(global_weights, plain, PIDS, [""] * 3, "sequential")
    assert _max_diff(with_blur.total, without.total) > 1e-4
    assert max(with_blur.metrics["pre_clip_norm"]) < max(without.metrics["pre_clip_norm"])


def test_sequential_engine_is_the_per_client_path_bit_for_bit_in_float32(global_weights: list[np.ndarray]) -> None:
    """With the real (float32) model the sequential engine runs exactly one client's computation per client."""
    local_update._model.cache_clear()
    for make in (_dp_fedsam_client_placement, _noisy_fedprox):
        ins = make()
        total, _, metrics = _per_client_path(global_weights, ins, PIDS)
        result = train_cohort(global_weights, ins, PIDS, [""] * 3, "sequential")
        assert all(np.array_equal(a, b) for a, b in zip(result.total, total, strict=True))
        for key in ("pre_clip_norm", "train_loss", "train_accuracy", "num_steps"):
            assert result.metrics[key] == [metrics[pid][key] for pid in sorted(PIDS)]


def test_vectorized_engine_runs_the_real_float32_model(global_weights: list[np.ndarray]) -> None:
    """The production dtype end to end: same clients accepted, same steps and examples as the per-client path."""
    ins = _dp_fedavg()
    _, _, metrics = _per_client_path(global_weights, ins, PIDS)
    result = train_cohort(global_weights, ins, PIDS, [""] * 3, "vectorized")
    assert result.accepted == sorted(PIDS)
    assert result.metrics["num_steps"] == [metrics[pid]["num_steps"] for pid in sorted(PIDS)]
    assert result.num_examples == sum(m["num_examples"] for m in metrics.values())
    assert all(math.isfinite(v) for v in result.metrics["train_loss"])
    assert mech.global_l2_norm(result.total) <= len(PIDS) * ins.clip_norm * (1 + 1e-6)


def test_frozen_parameter_gets_a_zero_update_on_both_engines(
    global_weights: list[np.ndarray], float64: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parameter with requires_grad=False is exchanged but not trained: Δ = 0 for it on either engine."""
    model64 = local_update._model  # the float64 builder of the fixture

    def frozen(name: str, dataset: str, device: str) -> nn.Module:
        model = model64(name, dataset, device)
        model.features[0].bias.requires_grad_(False)  # type: ignore[index]
        return model

    for module in (local_update, cohort):
        monkeypatch.setattr(module, "_model", frozen)
    ins, pids = _dp_fedavg(), [5, 4]
    raw = {}
    for engine in ("sequential", "vectorized"):
        recorder = _record(monkeypatch)
        result = train_cohort(global_weights, ins, pids, ["", ""], engine)  # type: ignore[arg-type]
        assert result.accepted == [4, 5]
        raw[engine] = recorder.raw
    for pid in pids:
        assert not raw["vectorized"][pid][1].any() and not raw["sequential"][pid][1].any()  # features.0.bias
        assert np.abs(raw["sequential"][pid][0]).max() > 1e-6
        assert _max_diff(raw["sequential"][pid], raw["vectorized"][pid]) <= ATOL


# ----- faults, screening, divergence ----------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sequential", "vectorized"])
def test_faults_are_rejected_client_by_client(
    engine: str, global_weights: list[np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    ins = _dp_fedavg()  # server placement: the worker re-clips every update to C, as the server would
    pids = [2, 5, 4, 0, 8]
    faults = ["raise", "nan", "wrong_shape", "huge_norm", ""]
    recorder = _record(monkeypatch)
    result = train_cohort(global_weights, ins, pids, faults, engine)  # type: ignore[arg-type]
    assert result.rejected == {"failed": [2], "nonfinite": [5], "shape": [4]}
    assert result.accepted == [0, 8]
    assert result.reclipped == 1  # only the ×10⁶ update was over C
    assert len(result.metrics["train_loss"]) == 2 and len(result.metrics["pre_clip_norm"]) == 2
    assert result.num_examples == SIZES[0] + SIZES[8]
    huge, _ = mech.clip_update(inject_fault("huge_norm", recorder.sent[0]), ins.clip_norm)
    assert mech.global_l2_norm(huge) <= ins.clip_norm
    expected = mech.uniform_sum([huge, recorder.sent[8]], [w.shape for w in global_weights])
    assert _max_diff(result.total, expected) == 0.0
    # Re-clipping the ×10⁶ update gives back (to rounding) the clipped update the client would have sent.
    assert _max_diff(huge, recorder.sent[0]) <= ATOL


@pytest.mark.parametrize("engine", ["sequential", "vectorized"])
def test_huge_norm_alone_is_reclipped_to_c(engine: str, global_weights: list[np.ndarray]) -> None:
    ins = _dp_fedavg()
    result = train_cohort(global_weights, ins, [5, 0], ["huge_norm", "raise"], engine)  # type: ignore[arg-type]
    assert result.accepted == [5] and result.rejected["failed"] == [0] and result.reclipped == 1
    assert result.num_examples == SIZES[5]
    assert mech.global_l2_norm(result.total) <= ins.clip_norm


def test_client_placement_does_not_reclip(global_weights: list[np.ndarray]) -> None:
    """In client placement the update carries noise and is not re-clipped (the server does not clip it either)."""
    ins = _dp_fedsam_client_placement()
    result = train_cohort(global_weights, ins, [5, 0], ["huge_norm", ""], "sequential")
    assert result.accepted == [0, 5] and result.reclipped == 0
    assert mech.global_l2_norm(result.total) > 1e3


def _poison_partition(monkeypatch: pytest.MonkeyPatch, poisoned_id: int) -> None:
    """Every image of partition ``poisoned_id`` gets an Inf pixel: its first step has a non-finite loss."""
    real = local_update.client_data  # the float64 one where that fixture is active

    def poisoned(spec: DataSpec, partition_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = real(spec, partition_id)
        if partition_id == poisoned_id:
            x = x.clone()
            x[:, 0, 14, 14] = math.inf
        return x, y

    monkeypatch.setattr(local_update, "client_data", poisoned)
    monkeypatch.setattr(cohort, "client_data", poisoned)


@pytest.mark.parametrize("engine", ["sequential", "vectorized"])
@pytest.mark.parametrize("case", ["dp_fedsam_client", "noisy_fedprox"])
def test_diverging_client_is_dropped_alone(
    engine: str,
    case: str,
    global_weights: list[np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """Partition 2 diverges; the others are what they are in a cohort without it.

    The sequential engine trains each client on its own, so there the others are equal bit for bit in float32; the
    vectorized engine stacks a different cohort, so it is compared in float64 (module docstring)."""
    if engine == "vectorized":
        request.getfixturevalue("float64")
    ins = CASES[case]()
    clean = train_cohort(global_weights, ins, [5, 4], ["", ""], engine)  # type: ignore[arg-type]
    _poison_partition(monkeypatch, 2)
    assert train_one([w.copy() for w in global_weights], ins, 2)[1].diverged
    result = train_cohort(global_weights, ins, PIDS, ["", "", ""], engine)  # type: ignore[arg-type]
    assert result.rejected == {"failed": [2], "nonfinite": [], "shape": []}
    assert result.accepted == clean.accepted == [4, 5]
    assert result.metrics["num_steps"] == clean.metrics["num_steps"]
    assert result.num_examples == clean.num_examples == SIZES[4] + SIZES[5]
    if engine == "sequential":
        assert all(np.array_equal(a, b) for a, b in zip(result.total, clean.total, strict=True))
        assert result.metrics == clean.metrics
    else:
        assert _max_diff(result.total, clean.total) <= ATOL
        for key in ("pre_clip_norm", "train_loss"):
            assert np.allclose(result.metrics[key], clean.metrics[key], rtol=1e-5, atol=0)


def test_fault_list_must_match_the_cohort(global_weights: list[np.ndarray]) -> None:
    with pytest.raises(ValueError, match="fault"):
        train_cohort(global_weights, _dp_fedavg(), [5, 4], [""], "sequential")


def test_sequential_clients_are_trained_and_summed_one_at_a_time_in_partition_order(
    global_weights: list[np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker holds one client's update at a time: each is privatized right after its training, in partition
    # order whatever order the message listed them in, and the sum is uniform_sum's in that order.
    calls: list[tuple[str, int]] = []
    sent: dict[int, list[np.ndarray]] = {}

    def training(parameters, ins, partition_id):
        calls.append(("train", partition_id))
        return train_one(parameters, ins, partition_id)

    def privatizing(update, ins, partition_id, shared_mask=None):
        calls.append(("privatize", partition_id))
        sent[partition_id], norm = privatize_update(update, ins, partition_id, shared_mask)
        return sent[partition_id], norm

    monkeypatch.setattr(cohort, "train_one", training)
    monkeypatch.setattr(cohort, "privatize_update", privatizing)
    result = train_cohort(global_weights, _dp_fedavg(), [5, 0, 4], [""] * 3, "sequential")
    assert calls == [("train", 0), ("privatize", 0), ("train", 4), ("privatize", 4), ("train", 5), ("privatize", 5)]
    assert result.accepted == [0, 4, 5]
    expected = mech.uniform_sum([sent[0], sent[4], sent[5]], [w.shape for w in global_weights])
    assert all(a.tobytes() == b.tobytes() for a, b in zip(result.total, expected, strict=True))


# ----- the captured engine's clip and sum on the device (clients/captured.py, fl_app/privacy/stacked.py) ------------


def _stacked_outcome(weights: list[np.ndarray], ins: TrainInstructions, pids: Sequence[int]) -> StackedOutcome:
    """The cohort trained by the vectorized engine, its final weights stacked as the captured engine leaves them
    (here on the CPU, in the caller's order)."""
    model = build_model_for_dataset("cnn", "fashion_mnist", seed=0)
    set_weights(model, weights)
    data = [local_update.client_data(ins.data, pid) for pid in pids]
    generators = [local_update.client_generator(ins, pid) for pid in pids]
    assert ins.training is not None
    regularizer = cohort._blur_regularizer(ins)[0]
    finals, results = train_stacked(model, data, ins.training, ins.server_round, generators, CPU, regularizer)
    params = {name: torch.stack([final[name] for final in finals]) for name in finals[0]}
    reference = {name: p.detach().clone() for name, p in model.named_parameters()}
    return StackedOutcome(params=params, reference=reference, order=list(range(len(pids))), results=results)


@pytest.mark.parametrize("case", ["dp_fedavg", "asam", "dp_fedavg_blur"])
def test_clip_and_sum_on_the_device_is_the_per_client_path(case: str, global_weights: list[np.ndarray]) -> None:
    """Server placement, clip-only recipes: the stacked clip and float64 sum give the worker's reply that clipping,
    screening and summing client by client gives (the same accepted clients, statistics and sum)."""
    ins = CASES[case]()
    names = weight_names(build_model_for_dataset("cnn", "fashion_mnist", seed=0))
    outcome = _stacked_outcome(global_weights, ins, PIDS)
    assert cohort.clips_on_device(ins, [""] * 3, None, names, list(outcome.params))
    got = clip_and_sum_stacked(outcome, names, ins, PIDS, started=0.0)
    want = train_cohort(global_weights, ins, PIDS, [""] * 3, "vectorized")
    assert got.accepted == want.accepted == sorted(PIDS)
    assert got.rejected == want.rejected and got.reclipped == want.reclipped == 0
    assert got.num_examples == want.num_examples
    assert all(t.dtype == np.float64 for t in got.total)
    assert _max_diff(got.total, want.total) <= 1e-8  # float32 clipped coordinates, one rounding apart at most
    for key in ("train_loss", "train_accuracy", "num_steps"):
        assert got.metrics[key] == want.metrics[key]
    np.testing.assert_allclose(got.metrics["pre_clip_norm"], want.metrics["pre_clip_norm"], rtol=1e-12)
    assert min(got.metrics["pre_clip_norm"]) > ins.clip_norm  # the clip really clipped
    assert mech.global_l2_norm(got.total) <= len(PIDS) * ins.clip_norm


def test_clip_and_sum_on_the_device_rejects_non_finite_and_diverged_clients(global_weights: list[np.ndarray]) -> None:
    ins = CASES["dp_fedavg"]()
    names = weight_names(build_model_for_dataset("cnn", "fashion_mnist", seed=0))
    outcome = _stacked_outcome(global_weights, ins, PIDS)
    outcome.params[names[0]][1].view(-1)[0] = float("inf")  # PIDS[1] = 5: non-finite weights
    outcome.results[2] = dataclasses.replace(outcome.results[2], diverged=True, loss=math.nan)  # PIDS[2] = 4
    got = clip_and_sum_stacked(outcome, names, ins, PIDS, started=0.0)
    assert got.accepted == [2] and got.rejected == {"failed": [4], "nonfinite": [5], "shape": []}
    assert len(got.metrics["pre_clip_norm"]) == 1
    alone = clip_and_sum_stacked(_stacked_outcome(global_weights, ins, [2]), names, ins, [2], 0.0)
    # The sum is the accepted client's alone (trained in a cohort of one: batched float32 kernels, ATOL apart).
    assert _max_diff(got.total, alone.total) <= ATOL


def test_the_device_clips_only_where_the_recipe_is_clip_only_with_server_noise() -> None:
    names = ["a", "b"]
    dense = CASES["dp_fedavg"]()
    assert cohort.clips_on_device(dense, ["", ""], None, names, names)
    assert not cohort.clips_on_device(dense, ["", "nan"], None, names, names)  # a fault to inject: per client
    assert not cohort.clips_on_device(dense, [""], [np.ones(2, bool)], names, names)  # a shared mask
    assert not cohort.clips_on_device(dense, [""], None, names, ["a"])  # a frozen tensor
    assert not cohort.clips_on_device(CASES["dp_fedsam_client"](), [""], None, names, names)  # clients add noise
    assert not cohort.clips_on_device(CASES["dp_fedsam_topk_client"](), [""], None, names, names)
    assert not cohort.clips_on_device(dataclasses.replace(dense, clip_norm=0.0), [""], None, names, names)


# Partitions whose clients the captured engine stacks in another order than the caller's (it sorts by step count,
# longest first: 4, 2 and 2 steps give stack positions [2, 0, 1] for these).
PERMUTED = [5, 4, 2]


#: Every recipe kind in the stack order, and a permuted cohort on both of the engine's paths after training (the
#: clip and sum on the device, the per-client recipe from the unstacked weights).
CAPTURED_CASES = [
    *((case, PIDS) for case in ("dp_fedavg", "asam", "dp_fedavg_blur", "dp_fedsam_client", "dp_fedsam_topk_client")),
    ("dp_fedavg", PERMUTED),
    ("dp_fedsam_client", PERMUTED),
]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize(("case", "pids"), CAPTURED_CASES, ids=[f"{c}-{'permuted' if p == PERMUTED else 'stacked'}"
                                                                for c, p in CAPTURED_CASES])  # fmt: skip
def test_captured_engine_matches_the_sequential_engine(
    case: str, device: str, pids: list[int], global_weights: list[np.ndarray], float64: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The captured engine (CUDA graphs on a GPU; the same step run eagerly on the same buffers on the CPU; clip and
    sum on the device where the recipe allows, the per-client path from its weights elsewhere) answers what the
    sequential engine answers, client by client, in float64."""
    real_split = cohort.resident_split
    monkeypatch.setattr(
        cohort, "resident_split", lambda split, device: _Split(real_split(split, device).x.double(), split.y.to(device))
    )
    ins = CASES[case]()
    want = train_cohort(global_weights, ins, pids, [""] * 3, "sequential")
    got = train_cohort(global_weights, dataclasses.replace(ins, device=device), pids, [""] * 3, "captured")
    assert got.accepted == want.accepted == sorted(pids) and got.rejected == want.rejected
    assert got.num_examples == want.num_examples == sum(SIZES[p] for p in pids)
    assert _max_diff(got.total, want.total) <= ATOL
    expected = {pid: {k: want.metrics[k][j] for k in want.metrics} for j, pid in enumerate(want.accepted)}
    _assert_metrics_match(got, expected, want.num_examples)


def test_the_permuted_cohort_is_stacked_in_another_order() -> None:
    """PERMUTED really exercises the engine's reordering: its stack order is not the caller's."""
    config = CASES["dp_fedavg"]().training
    assert config is not None
    schedules = [batch_schedule(SIZES[p], config, torch.Generator().manual_seed(p)) for p in PERMUTED]
    plan = step_plan([np.arange(SIZES[p]) for p in PERMUTED], schedules, config.batch_size, CPU)
    assert plan.order == [2, 0, 1]


@dataclasses.dataclass
class _Split:
    x: torch.Tensor
    y: torch.Tensor
