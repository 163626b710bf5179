"""Tests for the algorithm strategies on top of the round skeleton (docs/algorithms.md):

Fed-SMP-randk (public per-round random mask), Fed-SMP-topk (local mask: not covered; global mask: covered),
DP-FedSAM-topk (top-k of the noised average in server placement; per-client masks in client placement are not
covered), DP-FedAvg-blur(s) (recipes, dense noise), Noisy-FedAvg / Noisy-FedProx (plain mean, GDP bound), and
that every strategy preset composes into the class it names.

As in tests/strategies/test_base.py, replies are real ``flwr.app.Message`` objects and the strategy's round state
is primed as ``configure_train`` would leave it (:func:`prime`), or ``configure_train`` is driven with a fake grid.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message

from clients.recipes import privatize_update
from fl_app.config import CONF_DIR, ConfigError, compose_config
from fl_app.instructions import STREAM_SERVER_NOISE, TrainInstructions
from fl_app.metrics import MetricsWriter, read_metrics
from fl_app.privacy.mechanisms import global_l2_norm, kept_count, make_rng
from strategies.base import FederatedStrategy
from strategies.blur import DPFedAvgBLUR, DPFedAvgBLURS
from strategies.client_level_dp import ClientLevelDP
from strategies.dp_fedsam_topk import DPFedSAMTopK
from strategies.fed_smp import FedSMPRandK, FedSMPTopK
from strategies.registry import build_strategy, strategy_class
from strategies.rounds import RoundPlan
from tests.helpers import (
    FakeGrid,
    build,
    delta,
    end_round,
    flat,
    partition_of,
    prime,
    push,
    random_update,
    reply,
    with_norm,
    zeros,
)

SHAPES = [(1000,), (20, 30), (7,)]
P = 0.4
K_EXPECTED = [400, 240, 3]  # ⌈0.4 · d_l⌉
# ≥ 1e5 coordinates kept by a p = 0.4 mask, for the noise-law tests (sample std relative error ≈ 0.2%).
LARGE_SHAPES = [(250_000,), (20, 30), (7,)]

# A population of M = 50 with q = 0.2 gives the fixed denominator m = qM = 10.
SMALL_POP = ["dataset.num_clients=50", "privacy.sample_rate=0.2"]
SIGMA, C, M = 0.95, 0.2, 10.0
SERVER_STD = SIGMA * C / M


# ----- helpers (the patterns of tests/strategies/test_base.py) -------------------------------------------------


def topk_positions(layer: np.ndarray, fraction: float = P) -> np.ndarray:
    """Reference per-layer top-k of |layer| by a full sort (the tests use values without ties)."""
    magnitude = np.abs(np.asarray(layer, dtype=np.float64)).ravel()
    k = kept_count(magnitude.size, fraction)
    mask = np.zeros(magnitude.size, dtype=bool)
    mask[np.argsort(-magnitude, kind="stable")[:k]] = True
    return mask.reshape(np.shape(layer))


def assert_masks_equal(actual, expected) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_array_equal(np.asarray(a, dtype=bool), np.asarray(e, dtype=bool))


def message_masks(messages: list[Message]) -> list[list[np.ndarray]]:
    return [[m.astype(bool) for m in msg.content["mask"].to_numpy_ndarrays()] for msg in messages]


def configure(strategy: FederatedStrategy, server_round: int, weights: list[np.ndarray]) -> RoundPlan:
    """The round's plan (plan_round), its messages with the ids a grid assigns on push."""
    strategy.population.connect(FakeGrid(), timeout=1)
    plan = strategy.plan_round(server_round, ArrayRecord(weights), ConfigRecord())
    push(plan.messages)
    return plan


# ----- Fed-SMP-randk ------------------------------------------------------------------------------------------


def test_fed_smp_randk_recipe():
    strategy = build("strategy=fed_smp_randk")
    assert isinstance(strategy, FedSMPRandK)
    recipe = strategy.client_recipe()
    assert (recipe.kind, recipe.sparsity, recipe.rescale) == ("shared_mask", P, True)
    assert strategy.local_optimizer == "sgd"
    assert build("strategy=fed_smp_randk", "strategy.rescale=false").client_recipe().rescale is False
    assert build("strategy=fed_smp_randk", "strategy.sparsity=0.25").client_recipe().sparsity == 0.25
    assert strategy.dp_guarantee()["dp_guarantee"].startswith("client-level")


def test_fed_smp_randk_round_mask_keeps_exactly_k_per_layer():
    strategy = build("strategy=fed_smp_randk", *SMALL_POP)
    for t in (1, 2, 3):
        mask = strategy.round_mask(t, zeros(SHAPES), [])
        assert [m.shape for m in mask] == SHAPES
        assert all(m.dtype == bool for m in mask)
        assert [int(m.sum()) for m in mask] == K_EXPECTED


def test_fed_smp_randk_mask_is_the_same_in_every_message_of_the_round():
    strategy = build("strategy=fed_smp_randk", *SMALL_POP, "privacy.sampling=fixed")
    plan = configure(strategy, 3, random_update(SHAPES, 1.0, seed=0))
    assert len(plan.messages) == 10
    masks = message_masks(plan.messages)
    for mask in masks:
        assert_masks_equal(mask, masks[0])
    assert_masks_equal(masks[0], plan.mask)
    assert_masks_equal(masks[0], strategy.round_mask(3, zeros(SHAPES), []))
    assert [int(m.sum()) for m in masks[0]] == K_EXPECTED
    for msg in plan.messages:
        assert msg.content["config"]["recipe.kind"] == "shared_mask"


def test_fed_smp_randk_mask_is_data_independent_and_changes_across_rounds():
    a = build("strategy=fed_smp_randk", *SMALL_POP, "privacy.sampling=fixed", "seed=5")
    b = build(
        "strategy=fed_smp_randk",
        *SMALL_POP,
        "privacy.sampling=fixed",
        "seed=5",
        "dataset=emnist",
        "dataset.partition=iid",
        "dataset.alpha=0.3",
    )
    assert a.config.dataset != b.config.dataset
    mask_a = message_masks(configure(a, 4, random_update(SHAPES, 1.0, seed=1)).messages)[0]
    mask_b = message_masks(configure(b, 4, random_update(SHAPES, 5.0, seed=2)).messages)[0]
    assert_masks_equal(mask_a, mask_b)
    # Another round (same strategy, same model) or another seed draws another mask.
    mask_next = message_masks(configure(a, 5, random_update(SHAPES, 1.0, seed=1)).messages)[0]
    assert not all(np.array_equal(x, y) for x, y in zip(mask_a, mask_next, strict=True))
    c = build("strategy=fed_smp_randk", *SMALL_POP, "privacy.sampling=fixed", "seed=6")
    mask_c = message_masks(configure(c, 4, random_update(SHAPES, 1.0, seed=1)).messages)[0]
    assert not all(np.array_equal(x, y) for x, y in zip(mask_a, mask_c, strict=True))


def test_fed_smp_randk_server_noise_only_on_the_mask_with_std_sigma_c_over_m():
    strategy = build("strategy=fed_smp_randk", *SMALL_POP)
    assert strategy.config.privacy.placement == "server"
    old = zeros(LARGE_SHAPES)
    plan = prime(strategy, old, sampled=4, server_round=1)
    mask = plan.mask
    outcome = strategy.aggregator.aggregate(plan, [reply(pid, zeros(LARGE_SHAPES)) for pid in range(4)])
    step = delta(outcome.new_weights, old)
    assert_masks_equal([s != 0 for s in step], mask)
    kept = flat(step)[flat(mask).astype(bool)]
    assert kept.size >= 100_000
    assert abs(kept.mean()) < 0.02 * SERVER_STD
    assert kept.std() == pytest.approx(SERVER_STD, rel=0.02)


def test_fed_smp_randk_server_drops_what_a_client_sends_outside_the_mask():
    strategy = build("strategy=fed_smp_randk", *SMALL_POP, "privacy.noise_multiplier=0")
    old = random_update(SHAPES, 0.1, seed=0)
    plan = prime(strategy, old, sampled=2, server_round=1)
    mask = plan.mask
    dense = with_norm(SHAPES, 0.1, seed=3)  # below C: no clipping, so the kept values are exact
    outside = [np.where(m, 0.0, u).astype(np.float32) for u, m in zip(with_norm(SHAPES, 0.1, 4), mask, strict=True)]
    outcome = strategy.aggregator.aggregate(plan, [reply(0, dense), reply(1, outside)])
    expected = [np.where(m, u.astype(np.float64), 0.0) / M for u, m in zip(dense, mask, strict=True)]
    for got, want in zip(delta(outcome.new_weights, old), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)

    # Dropped before the server's re-clipping: huge values outside the mask must not shrink the kept ones.
    inside = [np.where(m, u, 0.0) for u, m in zip(with_norm(SHAPES, 0.05, seed=5), mask, strict=True)]
    junk = [np.where(m, 0.0, u) for u, m in zip(with_norm(SHAPES, 100.0, seed=6), mask, strict=True)]
    poisoned = [(a + b).astype(np.float32) for a, b in zip(inside, junk, strict=True)]
    assert global_l2_norm(poisoned) > 100 * C
    plan = prime(strategy, old, sampled=1, server_round=1)
    outcome = strategy.aggregator.aggregate(plan, [reply(0, poisoned)])
    assert outcome.stats["reclipped"] == 0
    for got, want in zip(delta(outcome.new_weights, old), inside, strict=True):
        np.testing.assert_allclose(got, want / M, rtol=1e-5, atol=1e-7)


def test_fed_smp_randk_round_trip_through_client_recipe():
    """configure_train → the client's recipe with the message's mask → aggregate: only masked coordinates move."""
    strategy = build("strategy=fed_smp_randk", *SMALL_POP, "privacy.sampling=fixed")
    old = zeros(SHAPES)
    plan = configure(strategy, 2, old)
    messages = plan.messages
    replies = []
    for msg in messages:
        config = msg.content["config"]
        pid = partition_of(msg)
        ins = TrainInstructions.from_config(dict(config))
        mask = [m.astype(bool) for m in msg.content["mask"].to_numpy_ndarrays()]
        sent, norm = privatize_update(with_norm(SHAPES, 1.0, seed=pid), ins, pid, mask)
        replies.append(reply(pid, sent, pre_clip_norm=norm, to=msg))
    outcome = strategy.aggregator.aggregate(plan, replies)
    assert outcome.stats["aggregated"] == len(messages) == 10
    assert_masks_equal([s != 0 for s in delta(outcome.new_weights, old)], plan.mask)
    # The pre-clip norms are those of the rescaled sparse updates, ‖(Δ ⊙ mask)/p‖ ≈ √p · ‖Δ‖ / p.
    assert outcome.stats["norm_mean"] == pytest.approx(1.0 / math.sqrt(P), rel=0.1)


# ----- Fed-SMP-topk -------------------------------------------------------------------------------------------


def test_fed_smp_topk_local_is_not_covered():
    strategy = build("strategy=fed_smp_topk")
    assert isinstance(strategy, FedSMPTopK)
    assert strategy.config.strategy.mask_source == "local"
    assert strategy.dp_guarantee()["dp_guarantee"] == "not covered: data-dependent top-k support"
    recipe = strategy.client_recipe()
    assert (recipe.kind, recipe.sparsity) == ("topk_local", P)
    messages = configure(strategy, 1, zeros(SHAPES)).messages
    assert messages and all("mask" not in msg.content for msg in messages)


def test_fed_smp_topk_local_noise_on_the_union_of_the_client_supports():
    strategy = build("strategy=fed_smp_topk", *SMALL_POP)
    old = zeros(SHAPES)
    plan = prime(strategy, old, sampled=2, server_round=1)
    assert plan.mask is None
    a = [np.where(topk_positions(u), u, 0).astype(np.float32) for u in with_norm(SHAPES, 0.1, seed=1)]
    b = [np.where(topk_positions(u), u, 0).astype(np.float32) for u in with_norm(SHAPES, 0.1, seed=2)]
    outcome = strategy.aggregator.aggregate(plan, [reply(0, a), reply(1, b)])
    union = [(x != 0) | (y != 0) for x, y in zip(a, b, strict=True)]
    assert any(not u.all() for u in union)
    assert_masks_equal([s != 0 for s in delta(outcome.new_weights, old)], union)


def test_fed_smp_topk_global_is_covered_and_masks_with_last_rounds_global_update():
    strategy = build("strategy=fed_smp_topk", *SMALL_POP, "privacy.sampling=fixed", "strategy.mask_source=global")
    assert strategy.not_covered_reason() is None
    assert strategy.dp_guarantee()["dp_guarantee"].startswith("client-level")
    recipe = strategy.client_recipe()
    assert (recipe.kind, recipe.sparsity, recipe.rescale) == ("shared_mask", P, False)

    # Round 1: no previous global update yet, a public random-k mask.
    w1 = random_update(SHAPES, 1.0, seed=0)
    first_plan = configure(strategy, 1, w1)
    first = message_masks(first_plan.messages)
    assert [int(m.sum()) for m in first[0]] == K_EXPECTED
    for mask in first:
        assert_masks_equal(mask, first[0])
    assert not all(np.array_equal(m, topk_positions(w)) for m, w in zip(first[0], w1, strict=True))

    # Round 1 ends (planning alone records nothing on the strategy: the round's end, aggregate_train, makes w_1 the
    # previous global).
    end_round(strategy, first_plan)
    # Round 2: the per-layer top-k of |w_2 − w_1|, the same for every client.
    w2 = [w + u for w, u in zip(w1, random_update(SHAPES, 0.01, seed=1), strict=True)]
    second_plan = configure(strategy, 2, w2)
    second = message_masks(second_plan.messages)
    expected = [topk_positions(b.astype(np.float64) - a) for a, b in zip(w1, w2, strict=True)]
    assert [int(m.sum()) for m in expected] == K_EXPECTED
    for mask in second:
        assert_masks_equal(mask, expected)
    assert_masks_equal(second_plan.mask, expected)


def test_fed_smp_topk_rejects_an_unknown_mask_source():
    with pytest.raises(ConfigError, match=r"strategy\.mask_source"):
        compose_config(["strategy=fed_smp_topk", "strategy.mask_source=noisy"])


# ----- DP-FedSAM-topk -----------------------------------------------------------------------------------------


def test_dp_fedsam_topk_server_placement_keeps_the_top_k_of_the_noised_average():
    strategy = build("strategy=dp_fedsam_topk", *SMALL_POP)
    assert isinstance(strategy, DPFedSAMTopK)
    assert strategy.local_optimizer == "sam"
    assert strategy.client_recipe().kind == "dense"  # clients send dense clipped updates
    assert strategy.dp_guarantee()["dp_guarantee"].startswith("client-level")
    old = zeros(SHAPES)
    updates = {pid: with_norm(SHAPES, 0.15, seed=pid) for pid in (2, 5, 9)}  # below C: not re-clipped
    plan = prime(strategy, old, sampled=3, server_round=1)
    outcome = strategy.aggregator.aggregate(plan, [reply(pid, u) for pid, u in updates.items()])
    step = delta(outcome.new_weights, old)
    assert [int(np.count_nonzero(s)) for s in step] == K_EXPECTED

    # Reference: the noised average (server stream of round 1), then its per-layer top-k.
    rng = make_rng(strategy.config.seed, 1, STREAM_SERVER_NOISE)
    average = [sum(updates[pid][i].astype(np.float64) for pid in sorted(updates)) / M for i in range(len(SHAPES))]
    noisy = [
        (a.astype(np.float32).astype(np.float64) + rng.normal(0.0, SERVER_STD, size=a.shape)).astype(np.float32)
        for a in average
    ]
    expected_mask = [topk_positions(n) for n in noisy]
    assert_masks_equal([s != 0 for s in step], expected_mask)
    for s, n, m in zip(step, noisy, expected_mask, strict=True):
        np.testing.assert_allclose(s[m], n[m], rtol=1e-6)
    # The mask is not the top-k of the clean average (the noise dominates it here).
    assert not all(np.array_equal(m, topk_positions(a)) for m, a in zip(expected_mask, average, strict=True))


def test_dp_fedsam_topk_client_placement_is_the_papers_form_and_not_covered():
    strategy = build("strategy=dp_fedsam_topk", "privacy.placement=client", "privacy.sampling=fixed", *SMALL_POP)
    recipe = strategy.client_recipe()
    assert (recipe.kind, recipe.sparsity) == ("topk_noisy", P)
    assert strategy.dp_guarantee()["dp_guarantee"].startswith("not covered")
    messages = configure(strategy, 1, zeros(SHAPES)).messages
    assert messages
    for msg in messages:
        config = msg.content["config"]
        assert config["recipe.kind"] == "topk_noisy"
        assert config["add_noise"] is True
        assert config["training.optimizer"] == "sam"


def test_dp_fedsam_topk_clean_mask_is_not_covered():
    strategy = build("strategy=dp_fedsam_topk", "strategy.mask_source=clean")
    assert strategy.client_recipe().kind == "topk_clean"
    assert strategy.dp_guarantee()["dp_guarantee"].startswith("not covered")
    assert "clean" in strategy.not_covered_reason()


def test_dp_fedsam_topk_rejects_mask_source_local():
    with pytest.raises(ConfigError, match=r"strategy\.mask_source"):
        compose_config(["strategy=dp_fedsam_topk", "strategy.mask_source=local"])


# ----- DP-FedAvg-blur / DP-FedAvg-blurs --------------------------------------------------------------------------


def test_dp_fedavg_blurs_recipe_is_lus_with_blur_and_server_noise_is_dense():
    strategy = build("strategy=dp_fedavg_blurs", *SMALL_POP)
    assert isinstance(strategy, DPFedAvgBLURS)
    recipe = strategy.client_recipe()
    assert (recipe.kind, recipe.sparsity, recipe.blur_coef) == ("lus", P, 1.0)
    assert strategy.dp_guarantee()["dp_guarantee"].startswith("client-level")
    old = zeros(LARGE_SHAPES)
    plan = prime(strategy, old, sampled=3, server_round=1)
    assert plan.mask is None
    outcome = strategy.aggregator.aggregate(plan, [reply(pid, zeros(LARGE_SHAPES)) for pid in range(3)])
    noise = flat(delta(outcome.new_weights, old))
    assert np.count_nonzero(noise) == noise.size
    assert noise.std() == pytest.approx(SERVER_STD, rel=0.02)


def test_dp_fedavg_blur_recipe_is_dense_with_blur_coef_from_config():
    strategy = build("strategy=dp_fedavg_blur")
    assert isinstance(strategy, DPFedAvgBLUR)
    recipe = strategy.client_recipe()
    assert (recipe.kind, recipe.blur_coef) == ("dense", 1.0)
    assert strategy.dp_guarantee()["dp_guarantee"].startswith("client-level")


@pytest.mark.parametrize(("name", "kind"), [("dp_fedavg_blur", "dense"), ("dp_fedavg_blurs", "lus")])
def test_blur_coef_flows_into_the_clients_instructions(name, kind):
    strategy = build(f"strategy={name}", "strategy.blur_coef=0.5", *SMALL_POP, "privacy.sampling=fixed")
    assert strategy.client_recipe().blur_coef == 0.5
    messages = configure(strategy, 1, zeros(SHAPES)).messages
    assert messages
    for msg in messages:
        ins = TrainInstructions.from_config(dict(msg.content["config"]))
        assert ins.recipe.kind == kind
        assert ins.recipe.blur_coef == 0.5
        assert ins.clip_norm == C  # the BLUR term uses the fixed C


# ----- Noisy-FedAvg / Noisy-FedProx -------------------------------------------------------------------------------


def noisy_bound_fn():
    fdp = pytest.importorskip("fl_app.privacy.fdp")
    if not hasattr(fdp, "noisy_bound"):
        pytest.skip("fl_app.privacy.fdp has no noisy_bound yet")
    return fdp.noisy_bound


def test_noisy_fedavg_plain_mean_without_clipping_or_noise():
    noisy_bound_fn()
    strategy = build("strategy=noisy_fedavg", *SMALL_POP)
    assert type(strategy).__name__ == "NoisyFedAvg"
    assert strategy.client_recipe().kind == "noisy_model"
    assert strategy.client_recipe().noise_std == strategy.config.strategy.noise_std
    old = random_update(SHAPES, 0.1, seed=0)
    huge = with_norm(SHAPES, 1e3, seed=1)
    small = with_norm(SHAPES, 0.1, seed=2)
    plan = prime(strategy, old, sampled=5)  # 5 sampled, 2 arrive: the mean is over the 2
    outcome = strategy.aggregator.aggregate(plan, [reply(1, huge), reply(2, small)])
    expected = [(h.astype(np.float64) + s) / 2 for h, s in zip(huge, small, strict=True)]
    for got, want in zip(delta(outcome.new_weights, old), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert outcome.stats["reclipped"] == 0
    # No server noise: zero updates leave the model unchanged.
    plan = prime(strategy, old, sampled=3)
    outcome = strategy.aggregator.aggregate(plan, [reply(pid, zeros(SHAPES)) for pid in range(3)])
    for new, before in zip(outcome.new_weights, old, strict=True):
        np.testing.assert_array_equal(new, before)


def test_noisy_fedavg_configure_train_sends_the_noisy_local_procedure():
    noisy_bound_fn()
    strategy = build("strategy=noisy_fedavg", *SMALL_POP, "privacy.sampling=fixed")
    messages = configure(strategy, 1, zeros(SHAPES)).messages
    assert messages
    for msg in messages:
        ins = TrainInstructions.from_config(dict(msg.content["config"]))
        assert ins.recipe.kind == "noisy_model" and ins.recipe.noise_std == strategy.config.strategy.noise_std
        assert ins.clip_norm == 0.0 and ins.add_noise is False
        assert ins.training is None and ins.noisy_training is not None
        assert ins.noisy_training.steps == strategy.config.strategy.local_steps


def test_noisy_fedavg_epsilon_is_the_gdp_bound_after_the_rounds_run(tmp_path):
    noisy_bound = noisy_bound_fn()
    writer = MetricsWriter(tmp_path, num_rounds=3, progress=False)
    strategy = build("strategy=noisy_fedavg", *SMALL_POP, metrics=writer)
    s = strategy.config.strategy
    rounds = 3

    def bound(t: int):
        return noisy_bound(
            "noisy_fedavg",
            s.lr_schedule,
            lr=s.noisy_lr,
            V=s.grad_clip,
            K=s.local_steps,
            m=max(1, round(strategy.expected_clients)),
            sigma=s.noise_std,
            L=s.smoothness,
            T=t,
            delta=1 / 50,
            alpha=None,
        )

    assert strategy.epsilon() == 0.0
    strategy.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=rounds)
    writer.close()
    assert strategy.epsilon() == pytest.approx(bound(rounds).epsilon, rel=1e-9)
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["round"] for r in records] == [1, 2, 3]
    for t, record in enumerate(records, start=1):
        assert record["gdp_mu"] == pytest.approx(bound(t).mu, rel=1e-9)
        assert record["epsilon"] == pytest.approx(bound(t).epsilon, rel=1e-9)
    g = strategy.dp_guarantee()
    assert g["gdp_mu"] == pytest.approx(bound(rounds).mu, rel=1e-9)
    assert g["rounds_accounted"] == rounds


def test_noisy_fedprox_needs_prox_coef_above_smoothness():
    noisy_bound_fn()
    strategy = build("strategy=noisy_fedprox")
    assert type(strategy).__name__ == "NoisyFedProx"
    assert strategy.prox_coef == 2.0
    assert strategy.local_training().prox_coef == 2.0
    config = compose_config(["strategy=noisy_fedprox", "strategy.prox_coef=0.5"])  # α = 0.5 ≤ L = 1
    with pytest.raises(ValueError):
        build_strategy(config)


# ----- every preset -----------------------------------------------------------------------------------------------


PRESETS = sorted(path.stem for path in (Path(CONF_DIR) / "strategy").glob("*.yaml"))


def test_presets_found():
    assert {"fed_smp_randk", "fed_smp_topk", "dp_fedsam_topk", "dp_fedavg_blur", "dp_fedavg_blurs"} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_every_strategy_preset_composes_into_the_class_it_names(name):
    if name.startswith("noisy_"):
        noisy_bound_fn()
    config = compose_config([f"strategy={name}"])
    assert config.strategy.name == name
    cls = strategy_class(name)
    strategy = build_strategy(config)
    assert type(strategy) is cls
    # A plain strategy, one private by its own mechanism, or the client-level DP layer over a plain one.
    assert isinstance(strategy, (FederatedStrategy, ClientLevelDP))
    if isinstance(strategy, ClientLevelDP):
        assert type(strategy.strategy) is cls.algorithm and strategy.strategy.privacy is not None
    assert isinstance(strategy.dp_guarantee()["dp_guarantee"], str)
