"""Tests for clients/recipes.py: the order in which a client applies the mechanisms to its update, per recipe kind
(docs/mechanisms.md, 2–4; docs/algorithms.md).

* ``dense`` — clip to C on the global norm, then (client placement) N(0, σ²C²/m).
* ``shared_mask`` — Fed-SMP with the server's round mask: Δ ⊙ mask [/ p] → clip → noise on the kept coordinates.
* ``topk_local`` — Fed-SMP-topk as published: the client's own per-layer top-k of |Δ| → clip → noise on the kept
  coordinates.
* ``topk_noisy`` / ``topk_clean`` — DP-FedSAM-topk in client placement: clip → noise → per-layer top-k of the noisy
  (or clean) update.
* ``lus`` — BLUR + LUS: per-layer top-k of |Δ| → clip → dense noise.
* ``noisy_model`` — Noisy-FedAvg/FedProx: absolute noise N(0, noise_std²), no update clipping.

Updates are multi-layer (one layer whose k_l = ⌈p·d_l⌉ needs the ceiling) so that per-layer and global
quantities cannot be confused; the noise-law tests use ≥ 1e5 coordinates (sample std relative error ≈ 0.2%).
"""

from __future__ import annotations

import numpy as np
import pytest

from clients.recipes import noise_rng, privatize_update
from fl_app.config import AppConfig, compose_config
from fl_app.instructions import RecipeSpec, TrainInstructions, local_training_config, make_train_instructions
from fl_app.privacy.mechanisms import clip_update, global_l2_norm, kept_count, randk_mask
from tests.helpers import flat, with_norm

SHAPES = [(1000,), (20, 30), (7,)]
# k_l = ⌈0.4 · d_l⌉ for SHAPES: 400, 240 and ⌈2.8⌉ = 3.
P = 0.4
K_EXPECTED = [400, 240, 3]
LARGE_SHAPES = [(100_000,), (20, 30), (7,)]

C, SIGMA, M = 0.2, 0.95, 10.0
CLIENT_STD = SIGMA * C / np.sqrt(M)  # per-client noise std σC/√m (docs/mechanisms.md, 4)


# ----- helpers ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def config() -> AppConfig:
    return compose_config([])


def make_ins(
    config: AppConfig,
    recipe: RecipeSpec,
    *,
    add_noise: bool,
    server_round: int = 1,
    clip_norm: float = C,
    noise_multiplier: float = SIGMA,
    expected_clients: float = M,
    secure_noise: bool = False,
) -> TrainInstructions:
    return make_train_instructions(
        config,
        server_round,
        recipe=recipe,
        training=local_training_config(config, "sgd"),
        clip_norm=clip_norm,
        add_noise=add_noise,
        noise_multiplier=noise_multiplier,
        expected_clients=expected_clients,
        secure_noise=secure_noise,
    )


def clip(update: list[np.ndarray], clip_norm: float) -> list[np.ndarray]:
    """Reference global-norm clipping Δ · min(1, C/‖Δ‖), in float64."""
    norm = global_l2_norm(update)
    factor = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    return [np.asarray(u, dtype=np.float64) * factor for u in update]


def topk_positions(layer: np.ndarray, k: int) -> np.ndarray:
    """Reference per-layer top-k of |layer| by a full sort (the tests use values without ties)."""
    magnitude = np.abs(np.asarray(layer, dtype=np.float64)).ravel()
    mask = np.zeros(magnitude.size, dtype=bool)
    mask[np.argsort(-magnitude, kind="stable")[:k]] = True
    return mask.reshape(np.shape(layer))


def reference_topk(update, shapes=SHAPES) -> list[np.ndarray]:
    return [topk_positions(u, kept_count(int(np.prod(s)), P)) for u, s in zip(update, shapes, strict=True)]


def nonzero(update) -> list[np.ndarray]:
    return [np.asarray(u) != 0 for u in update]


def assert_masks_equal(actual, expected) -> None:
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_array_equal(a, e)


def test_kept_counts_of_the_test_shapes():
    assert [kept_count(int(np.prod(s)), P) for s in SHAPES] == K_EXPECTED


# ----- dense (DP-FedAvg / DP-FedSAM) ----------------------------------------------------------------------------


def test_dense_clips_to_c_on_the_global_norm(config):
    ins = make_ins(config, RecipeSpec(kind="dense"), add_noise=False)
    update = with_norm(SHAPES, 50.0, seed=1)
    sent, norm = privatize_update(update, ins, partition_id=3)
    assert norm == pytest.approx(50.0, rel=1e-6)
    assert global_l2_norm(sent) <= C + 1e-6
    assert global_l2_norm(sent) == pytest.approx(C, rel=1e-5)
    # Global, not per layer: the per-layer norms add up (in squares) to C², each layer below C.
    assert all(global_l2_norm([s]) < C for s in sent)
    for s, expected in zip(sent, clip(update, C), strict=True):
        np.testing.assert_allclose(s, expected, rtol=1e-5, atol=1e-9)


def test_dense_update_inside_the_ball_is_sent_unchanged(config):
    ins = make_ins(config, RecipeSpec(kind="dense"), add_noise=False)
    update = with_norm(SHAPES, 0.1, seed=2)
    sent, norm = privatize_update(update, ins, partition_id=3)
    assert norm == pytest.approx(0.1, rel=1e-6)
    for s, u in zip(sent, update, strict=True):
        np.testing.assert_array_equal(s, u)


def test_dense_client_noise_std_is_sigma_c_over_sqrt_m(config):
    ins = make_ins(config, RecipeSpec(kind="dense"), add_noise=True)
    update = with_norm(LARGE_SHAPES, 5.0, seed=3)
    sent, norm = privatize_update(update, ins, partition_id=4)
    assert norm == pytest.approx(5.0, rel=1e-6)
    noise = flat(sent) - flat(clip(update, C))
    assert noise.size >= 100_000
    assert abs(noise.mean()) < 0.02 * CLIENT_STD
    assert noise.std() == pytest.approx(CLIENT_STD, rel=0.02)
    assert np.count_nonzero(noise) == noise.size  # dense noise


# ----- shared_mask (Fed-SMP-randk, and Fed-SMP-topk with mask_source=global) -------------------------------------


def shared_mask_recipe(rescale: bool = True) -> RecipeSpec:
    return RecipeSpec(kind="shared_mask", sparsity=P, rescale=rescale)


def test_shared_mask_sends_exactly_the_mask_with_noise_on_kept_coordinates_only(config):
    mask = randk_mask(SHAPES, P, np.random.default_rng(0))
    assert [int(m.sum()) for m in mask] == K_EXPECTED
    ins = make_ins(config, shared_mask_recipe(), add_noise=True)
    update = with_norm(SHAPES, 3.0, seed=4)  # dense, nonzero everywhere
    sent, _ = privatize_update(update, ins, partition_id=5, shared_mask=mask)
    for s, m, k in zip(sent, mask, K_EXPECTED, strict=True):
        assert np.all(s[~m] == 0)  # no noise outside the mask
        assert np.count_nonzero(s) == k
        assert np.all(s[m] != 0)


def test_shared_mask_noise_on_kept_coordinates_has_client_std(config):
    mask = randk_mask(LARGE_SHAPES, P, np.random.default_rng(1))
    update = with_norm(LARGE_SHAPES, 3.0, seed=5)
    ins_clean = make_ins(config, shared_mask_recipe(), add_noise=False)
    ins_noisy = make_ins(config, shared_mask_recipe(), add_noise=True)
    clean, _ = privatize_update(update, ins_clean, partition_id=6, shared_mask=mask)
    noisy, _ = privatize_update(update, ins_noisy, partition_id=6, shared_mask=mask)
    kept = flat(mask).astype(bool)
    noise = (flat(noisy) - flat(clean))[kept]
    assert noise.size >= 40_000
    assert noise.std() == pytest.approx(CLIENT_STD, rel=0.02)
    assert np.all((flat(noisy) - flat(clean))[~kept] == 0)


def test_shared_mask_rescales_by_one_over_p_before_clipping(config):
    mask = randk_mask(SHAPES, P, np.random.default_rng(2))
    update = with_norm(SHAPES, 3.0, seed=6)
    masked = [np.where(m, u.astype(np.float64), 0.0) for u, m in zip(update, mask, strict=True)]
    rescaled = [x / P for x in masked]

    # The pre-clip norm is that of (Δ ⊙ mask)/p, and clipping acts on it.
    sent, norm = privatize_update(update, make_ins(config, shared_mask_recipe(), add_noise=False), 7, mask)
    assert norm == pytest.approx(global_l2_norm(rescaled), rel=1e-6)
    assert norm > C
    assert global_l2_norm(sent) <= C + 1e-6
    for s, expected in zip(sent, clip(rescaled, C), strict=True):
        np.testing.assert_allclose(s, expected, rtol=1e-5, atol=1e-9)

    # With a C far above the norm, the client sends exactly (Δ ⊙ mask)/p.
    big_c = make_ins(config, shared_mask_recipe(), add_noise=False, clip_norm=1e6)
    sent, norm = privatize_update(update, big_c, 7, mask)
    for s, expected in zip(sent, rescaled, strict=True):
        np.testing.assert_allclose(s, expected, rtol=1e-6, atol=0)


def test_shared_mask_without_rescale_does_not_divide_by_p(config):
    mask = randk_mask(SHAPES, P, np.random.default_rng(3))
    update = with_norm(SHAPES, 3.0, seed=7)
    masked = [np.where(m, u.astype(np.float64), 0.0) for u, m in zip(update, mask, strict=True)]
    sent, norm = privatize_update(update, make_ins(config, shared_mask_recipe(False), add_noise=False), 8, mask)
    assert norm == pytest.approx(global_l2_norm(masked), rel=1e-6)
    for s, expected in zip(sent, clip(masked, C), strict=True):
        np.testing.assert_allclose(s, expected, rtol=1e-5, atol=1e-9)
    big_c = make_ins(config, shared_mask_recipe(False), add_noise=False, clip_norm=1e6)
    sent, _ = privatize_update(update, big_c, 8, mask)
    for s, expected in zip(sent, masked, strict=True):
        np.testing.assert_array_equal(s, expected.astype(np.float32))


def test_shared_mask_without_a_mask_is_an_error(config):
    ins = make_ins(config, shared_mask_recipe(), add_noise=True)
    with pytest.raises(ValueError, match="mask"):
        privatize_update(with_norm(SHAPES, 1.0, seed=8), ins, partition_id=9)


# ----- topk_local (Fed-SMP-topk as published) ---------------------------------------------------------------------


def test_topk_local_keeps_the_top_k_of_the_clean_update_with_noise_only_there(config):
    update = with_norm(SHAPES, 3.0, seed=9)
    expected_mask = reference_topk(update)
    recipe = RecipeSpec(kind="topk_local", sparsity=P)
    sent, norm = privatize_update(update, make_ins(config, recipe, add_noise=True), partition_id=10)
    assert_masks_equal(nonzero(sent), expected_mask)
    assert [np.count_nonzero(s) for s in sent] == K_EXPECTED
    # Pre-clip norm of the sparsified update; without noise the kept values are the clipped Δ ⊙ mask.
    masked = [np.where(m, u.astype(np.float64), 0.0) for u, m in zip(update, expected_mask, strict=True)]
    assert norm == pytest.approx(global_l2_norm(masked), rel=1e-6)
    clean, _ = privatize_update(update, make_ins(config, recipe, add_noise=False), partition_id=10)
    for s, expected in zip(clean, clip(masked, C), strict=True):
        np.testing.assert_allclose(s, expected, rtol=1e-5, atol=1e-9)
    # The noise is the only difference on the kept coordinates, and there is none elsewhere.
    for s, c_, m in zip(sent, clean, expected_mask, strict=True):
        assert np.all(s[~m] == 0) and np.all(s[m] != c_[m])


# ----- topk_noisy / topk_clean (DP-FedSAM-topk, client placement) --------------------------------------------------


def _noisy_reference(ins: TrainInstructions, update, partition_id: int) -> list[np.ndarray]:
    """The noisy clipped update, redrawn from the client's own noise stream (tensor by tensor, in float64 on the
    float32 clipped values)."""
    rng = noise_rng(ins, partition_id)
    clipped, _ = clip_update(update, C)
    return [(c_.astype(np.float64) + rng.normal(0.0, CLIENT_STD, size=c_.shape)).astype(np.float32) for c_ in clipped]


def test_topk_noisy_keeps_the_top_k_of_the_noisy_update(config):
    # A clean update with norm C spread over 1607 coordinates (~0.005 each) under noise of std ~0.06: the noisy
    # and the clean top-k differ, so the test tells the two apart.
    update = with_norm(SHAPES, C, seed=10)
    ins = make_ins(config, RecipeSpec(kind="topk_noisy", sparsity=P), add_noise=True)
    sent, norm = privatize_update(update, ins, partition_id=11)
    assert norm == pytest.approx(C, rel=1e-5)
    noisy = _noisy_reference(ins, update, 11)
    noisy_mask = reference_topk(noisy)
    clean_mask = reference_topk(update)
    assert any(not np.array_equal(a, b) for a, b in zip(noisy_mask, clean_mask, strict=True))
    assert [np.count_nonzero(s) for s in sent] == K_EXPECTED
    assert_masks_equal(nonzero(sent), noisy_mask)
    for s, n, m in zip(sent, noisy, noisy_mask, strict=True):
        np.testing.assert_array_equal(s[m], n[m])


def test_topk_clean_keeps_the_top_k_of_the_clean_clipped_update(config):
    update = with_norm(SHAPES, 3.0, seed=11)
    ins = make_ins(config, RecipeSpec(kind="topk_clean", sparsity=P), add_noise=True)
    sent, _ = privatize_update(update, ins, partition_id=12)
    clean_mask = reference_topk(update)  # clipping scales every coordinate alike: same top-k
    noisy_mask = reference_topk(_noisy_reference(ins, update, 12))
    assert any(not np.array_equal(a, b) for a, b in zip(noisy_mask, clean_mask, strict=True))
    assert [np.count_nonzero(s) for s in sent] == K_EXPECTED
    assert_masks_equal(nonzero(sent), clean_mask)
    # The kept values are still the noisy ones.
    noisy = _noisy_reference(ins, update, 12)
    for s, n, m in zip(sent, noisy, clean_mask, strict=True):
        np.testing.assert_array_equal(s[m], n[m])


# ----- lus (BLUR + LUS) -------------------------------------------------------------------------------------------


def test_lus_sparsifies_before_clipping_and_adds_dense_noise(config):
    update = with_norm(SHAPES, 3.0, seed=12)
    recipe = RecipeSpec(kind="lus", sparsity=P, blur_coef=1.0)
    expected_mask = reference_topk(update)
    masked = [np.where(m, u.astype(np.float64), 0.0) for u, m in zip(update, expected_mask, strict=True)]

    before_noise, norm = privatize_update(update, make_ins(config, recipe, add_noise=False), partition_id=13)
    assert [np.count_nonzero(s) for s in before_noise] == K_EXPECTED
    assert_masks_equal(nonzero(before_noise), expected_mask)
    assert norm == pytest.approx(global_l2_norm(masked), rel=1e-6)  # the sparsified update's norm
    assert norm < global_l2_norm(update)
    assert global_l2_norm(before_noise) <= C + 1e-6
    for s, expected in zip(before_noise, clip(masked, C), strict=True):
        np.testing.assert_allclose(s, expected, rtol=1e-5, atol=1e-9)

    after_noise, norm_noisy = privatize_update(update, make_ins(config, recipe, add_noise=True), partition_id=13)
    assert norm_noisy == norm
    for s in after_noise:
        assert np.count_nonzero(s) == s.size  # noise on every coordinate


def test_lus_noise_is_dense_with_client_std(config):
    update = with_norm(LARGE_SHAPES, 3.0, seed=13)
    recipe = RecipeSpec(kind="lus", sparsity=P)
    clean, _ = privatize_update(update, make_ins(config, recipe, add_noise=False), partition_id=14)
    noisy, _ = privatize_update(update, make_ins(config, recipe, add_noise=True), partition_id=14)
    noise = flat(noisy) - flat(clean)
    dropped = flat(clean) == 0
    assert dropped.sum() >= 60_000
    # The dropped coordinates carry the same noise law as the kept ones.
    assert noise[dropped].std() == pytest.approx(CLIENT_STD, rel=0.02)
    assert noise.std() == pytest.approx(CLIENT_STD, rel=0.02)


# ----- noisy_model (Noisy-FedAvg / Noisy-FedProx) -----------------------------------------------------------------


@pytest.mark.parametrize("clip_norm", [0.0, C])
def test_noisy_model_adds_absolute_noise_and_never_clips(config, clip_norm):
    noise_std = 0.01
    recipe = RecipeSpec(kind="noisy_model", noise_std=noise_std)
    ins = make_ins(config, recipe, add_noise=False, clip_norm=clip_norm, noise_multiplier=0.0)
    update = with_norm(LARGE_SHAPES, 3.0, seed=14)
    sent, norm = privatize_update(update, ins, partition_id=15)
    assert norm == pytest.approx(3.0, rel=1e-6)
    noise = flat(sent) - flat(update)
    assert abs(noise.mean()) < 0.02 * noise_std
    assert noise.std() == pytest.approx(noise_std, rel=0.02)  # absolute, not σ·C/√m

    huge = with_norm(SHAPES, 1e4, seed=15)
    sent, norm = privatize_update(huge, ins, partition_id=15)
    assert norm == pytest.approx(1e4, rel=1e-6)
    assert global_l2_norm(sent) == pytest.approx(1e4, rel=1e-3)  # not clipped to C
    for s, h in zip(sent, huge, strict=True):
        assert np.abs(s.astype(np.float64) - h).max() < 10 * noise_std


# ----- determinism of the noise -----------------------------------------------------------------------------------


RECIPES = {
    "dense": RecipeSpec(kind="dense"),
    "shared_mask": RecipeSpec(kind="shared_mask", sparsity=P, rescale=True),
    "topk_local": RecipeSpec(kind="topk_local", sparsity=P),
    "topk_noisy": RecipeSpec(kind="topk_noisy", sparsity=P),
    "topk_clean": RecipeSpec(kind="topk_clean", sparsity=P),
    "lus": RecipeSpec(kind="lus", sparsity=P, blur_coef=1.0),
    "noisy_model": RecipeSpec(kind="noisy_model", noise_std=0.01),
}


@pytest.mark.parametrize("kind", sorted(RECIPES))
def test_noise_is_a_function_of_seed_round_and_partition(config, kind):
    mask = randk_mask(SHAPES, P, np.random.default_rng(4))
    update = with_norm(SHAPES, 3.0, seed=16)
    seed1 = compose_config(["seed=1"])

    def run(cfg, server_round: int, partition_id: int) -> np.ndarray:
        ins = make_ins(cfg, RECIPES[kind], add_noise=kind != "noisy_model", server_round=server_round)
        sent, _ = privatize_update(update, ins, partition_id, shared_mask=mask)
        return flat(sent)

    first = run(config, 2, 5)
    assert np.array_equal(first, run(config, 2, 5))
    assert not np.array_equal(first, run(config, 2, 6))
    assert not np.array_equal(first, run(config, 3, 5))
    assert not np.array_equal(first, run(seed1, 2, 5))


def test_secure_noise_is_not_reproducible():
    config = compose_config(["privacy.secure_noise=true"])
    ins = make_ins(config, RecipeSpec(kind="dense"), add_noise=True, secure_noise=True)
    assert ins.secure_noise
    update = with_norm(SHAPES, 3.0, seed=17)
    a, _ = privatize_update(update, ins, partition_id=1)
    b, _ = privatize_update(update, ins, partition_id=1)
    assert not np.array_equal(flat(a), flat(b))
    assert (flat(a) - flat(clip(update, C))).std() == pytest.approx(CLIENT_STD, rel=0.1)
