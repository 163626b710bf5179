"""Tests for fl_app/privacy/pipeline.py: mechanisms as objects, recipes as their composition, and a mechanism
written in a test picked up by the client (through the real ClientApp handler and Flower's wire format) and by the
server. The recipes' outputs, bit for bit, are pinned in tests/clients/test_recipes.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from flwr.app import ArrayRecord

from fl_app.config import compose_config
from fl_app.instructions import RecipeSpec
from fl_app.models import build_model_for_dataset, get_weights
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.pipeline import (
    RECIPES,
    AbsoluteNoise,
    ClientStep,
    Clip,
    GaussianNoise,
    LocalTopK,
    Mechanism,
    NoiseOnSupport,
    ServerStep,
    ServerTopK,
    SharedMask,
    TopKOfClipped,
    TopKOfNoisy,
    mechanisms_for,
    register_recipe,
    run_client_steps,
    run_server_steps,
)
from strategies import ClientLevelDP, FederatedAveraging
from strategies.dp_fedavg import DPFedAvg
from strategies.dp_fedsam_topk import DPFedSAMTopK
from tests.helpers import InProcessGrid
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

P = 0.25


@pytest.mark.parametrize(
    ("kind", "steps"),
    [
        ("dense", (Clip, GaussianNoise)),
        ("topk_noisy", (Clip, GaussianNoise, TopKOfNoisy)),
        ("topk_clean", (Clip, GaussianNoise, TopKOfClipped)),
        ("shared_mask", (SharedMask, Clip, GaussianNoise, NoiseOnSupport)),
        ("topk_local", (LocalTopK, Clip, GaussianNoise, NoiseOnSupport)),
        ("lus", (LocalTopK, Clip, GaussianNoise)),
        ("noisy_model", (AbsoluteNoise,)),
    ],
)
def test_each_recipe_is_its_documented_composition(kind: str, steps: tuple[type, ...]) -> None:
    mechanisms = mechanisms_for(RecipeSpec(kind=kind, sparsity=P, noise_std=0.1))
    assert tuple(type(m) for m in mechanisms) == steps


def test_an_unknown_recipe_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown recipe 'nope'"):
        mechanisms_for(RecipeSpec(kind="nope"))
    with pytest.raises(ValueError, match="already registered"):
        register_recipe("dense", lambda p: ())


def _update(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(4, 5)).astype(np.float32), rng.normal(size=(7,)).astype(np.float32)]


def test_client_noise_is_the_placement_s_share_and_server_noise_the_server_s() -> None:
    update = _update(1)
    clipped, norm = mech.clip_update(update, 0.5)
    step = ClientStep(clip_norm=0.5, noise_std=0.3, rng=mech.make_rng(0, 1, 2))
    sent, reported = run_client_steps((Clip(), GaussianNoise()), update, step)
    expected = mech.add_gaussian_noise(clipped, 0.3, mech.make_rng(0, 1, 2))
    assert reported == norm and step.noised
    assert all(np.array_equal(a, b) for a, b in zip(sent, expected, strict=True))
    # Server placement: the client adds nothing.
    quiet = ClientStep(clip_norm=0.5, noise_std=None, rng=mech.make_rng(0, 1, 2))
    sent, _ = run_client_steps((Clip(), GaussianNoise()), update, quiet)
    assert all(np.array_equal(a, b) for a, b in zip(sent, clipped, strict=True)) and not quiet.noised
    average = run_server_steps((Clip(), GaussianNoise()), clipped, ServerStep(0.2, mech.make_rng(0, 1, 1)))
    expected = mech.add_gaussian_noise(clipped, 0.2, mech.make_rng(0, 1, 1))
    assert all(np.array_equal(a, b) for a, b in zip(average, expected, strict=True))


def test_without_a_clip_norm_the_update_passes_unclipped_and_unnoised() -> None:
    update = _update(2)
    step = ClientStep(clip_norm=0.0, noise_std=0.3, rng=mech.make_rng(0, 1, 2))
    sent, norm = run_client_steps(mechanisms_for(RecipeSpec(kind="topk_noisy", sparsity=P)), update, step)
    assert norm == pytest.approx(mech.global_l2_norm(update))
    assert all(np.array_equal(a, b) for a, b in zip(sent, update, strict=True))


def test_noise_on_support_restricts_the_server_s_average_to_the_union_of_what_arrived() -> None:
    a = [np.array([1.0, 0.0, 0.0]), np.array([0.0, 2.0])]
    b = [np.array([0.0, 3.0, 0.0]), np.array([0.0, 0.0])]
    noisy = [np.array([5.0, 6.0, 7.0]), np.array([8.0, 9.0])]
    out = NoiseOnSupport().server_step(noisy, ServerStep(0.0, mech.make_rng(0), updates=[a, b]))
    assert out[0].tolist() == [5.0, 6.0, 0.0] and out[1].tolist() == [0.0, 9.0]
    mask = [np.array([False, False, True]), np.array([True, False])]
    out = NoiseOnSupport().server_step(noisy, ServerStep(0.0, mech.make_rng(0), mask=mask, updates=[a, b]))
    assert out[0].tolist() == [0.0, 0.0, 7.0] and out[1].tolist() == [8.0, 0.0]


def test_dp_fedsam_topk_with_server_masks_ends_its_pipeline_with_the_server_s_top_k() -> None:
    strategy = DPFedSAMTopK(compose_config(["strategy=dp_fedsam_topk"]))
    assert [type(m) for m in strategy.mechanisms] == [Clip, GaussianNoise, ServerTopK]
    client = DPFedSAMTopK(compose_config(["strategy=dp_fedsam_topk", "privacy.placement=client",
                                          "privacy.sampling=fixed"]))  # fmt: skip
    assert [type(m) for m in client.mechanisms] == [Clip, GaussianNoise, TopKOfNoisy]


# ----- a mechanism written here, one class, picked up by both sides of a real round -------------------------------


@dataclass(frozen=True)
class Halve(Mechanism):
    """Each client sends half its clipped update; the server doubles the average back. Exact in binary floating
    point, so a round with it must give DP-FedAvg's model bit for bit."""

    calls: list[str]

    def client_step(self, update: list[np.ndarray], step: ClientStep) -> list[np.ndarray]:
        self.calls.append("client")
        return [u * np.float32(0.5) for u in update]

    def server_step(self, average: list[np.ndarray], step: ServerStep) -> list[np.ndarray]:
        self.calls.append("server")
        return [a * 2.0 for a in average]


class HalvedFedAvg(FederatedAveraging):
    def client_recipe(self) -> RecipeSpec:
        return RecipeSpec(kind="halved")


SMALL = [
    "strategy=dp_fedavg",
    "dataset.num_clients=20",
    "dataset.max_train_samples=600",
    "dataset.max_test_samples=200",
    "privacy.sample_rate=0.2",
    "privacy.noise_multiplier=0",
]


def test_a_mechanism_added_as_one_class_runs_on_the_clients_and_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setitem(RECIPES, "halved", lambda p: (Clip(), Halve(calls), GaussianNoise()))
    config = compose_config(SMALL)
    initial = ArrayRecord(get_weights(build_model_for_dataset("cnn", "fashion_mnist", seed=0)))
    halved = ClientLevelDP(HalvedFedAvg(config)).start(InProcessGrid(nodes=2), initial, num_rounds=1)
    plain = DPFedAvg(config).start(InProcessGrid(nodes=2), initial, num_rounds=1)
    sampled = calls.count("client")
    assert sampled >= 1 and calls.count("server") == 1  # every sampled client, then the server once
    moved = [a - b for a, b in zip(plain.arrays.to_numpy_ndarrays(), initial.to_numpy_ndarrays(), strict=True)]
    assert max(float(np.abs(m).max()) for m in moved) > 0
    for a, b in zip(halved.arrays.to_numpy_ndarrays(), plain.arrays.to_numpy_ndarrays(), strict=True):
        assert np.array_equal(a, b)
