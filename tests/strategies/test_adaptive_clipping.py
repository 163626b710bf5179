"""Adaptive clipping in the round (strategies/base.py): config, C_t in every place C is used, the joint accounting,
the published C_t and noisy fraction, checkpoint state."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord

from fl_app.config import ConfigError
from fl_app.instructions import STREAM_ADAPTIVE_CLIP, TrainInstructions
from fl_app.privacy import adaptive_clipping as adaptive
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.accountants import calibrate_noise_multiplier, compute_epsilon
from strategies.statistics import CLIENT_DERIVED
from tests.helpers import FakeGrid, build, delta, flat, prime, reply, with_norm, zeros

SHAPES = [(4, 5), (5,)]
# M = 50, q = 0.2: m = 10, default σ_b = m/20 = 0.5, 2σ_b = 1 > σ = 0.95.
ADAPTIVE = ("strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2", "privacy.clipping=adaptive")
DP_STRATEGIES = (
    "dp_fedavg", "dp_fedsam", "dp_fedsam_topk", "fed_smp_randk", "fed_smp_topk", "dp_fedavg_blur", "dp_fedavg_blurs",
)  # fmt: skip


def _round(strategy, norms, server_round=1):
    plan = prime(strategy, zeros(SHAPES), sampled=len(norms), server_round=server_round)
    replies = [reply(i, with_norm(SHAPES, n, seed=i)) for i, n in enumerate(norms)]
    return strategy.aggregator.aggregate(plan, replies)


# ----- config ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("privacy.clipping=sometimes", "privacy.clipping"),
        ("privacy.target_quantile=1.0", "privacy.target_quantile"),
        ("privacy.target_quantile=0", "privacy.target_quantile"),
        ("privacy.clip_learning_rate=0", "privacy.clip_learning_rate"),
        ("privacy.clipped_count_stddev=-1", "privacy.clipped_count_stddev"),
        ("privacy.statistics_noise_multiplier=2.0", "privacy.statistics_noise_multiplier"),
    ],
)
def test_bad_adaptive_values_are_refused_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build(*ADAPTIVE, override)


@pytest.mark.parametrize("name", ["noisy_fedavg", "noisy_fedprox"])
def test_the_noisy_model_methods_refuse_adaptive_clipping(name):
    with pytest.raises(ConfigError, match=r"privacy\.clipping=.adaptive.*no update clip norm"):
        build(f"strategy={name}", "privacy.clipping=adaptive")


def test_a_count_noise_too_small_for_the_noise_multiplier_is_refused_before_any_round():
    # m = 5: default σ_b = 0.25, 2σ_b = 0.5 < σ = 0.95.
    with pytest.raises(ConfigError, match="clipped_count_stddev"):
        build(*ADAPTIVE, "privacy.sample_rate=0.1")
    assert build(*ADAPTIVE, "privacy.sample_rate=0.1", "privacy.clipped_count_stddev=2.0").clipping.count_stddev == 2.0


def test_fixed_clipping_is_the_default_and_keeps_c():
    strategy = build("strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2")
    assert strategy.config.privacy.clipping == "fixed" and not strategy.clipping.adaptive
    outcome = _round(strategy, [1.0] * 10)
    assert strategy.clipping.clip_norm == strategy.config.privacy.clip_norm == outcome.stats["clip_norm"]
    assert "fraction_clipped_noisy" not in outcome.stats
    assert strategy.account.accounted_noise_multiplier == strategy.config.privacy.noise_multiplier


# ----- the round ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", DP_STRATEGIES)
def test_every_dp_strategy_moves_c_and_uses_c_t_everywhere(name):
    """Round 1 at C_0 = 0.2 with every norm above it: C grows. Round 2 sends the clients C_1, clips at C_1 on the
    server and reports C_1 as this round's C."""
    strategy = build(*ADAPTIVE, f"strategy={name}", "privacy.clipped_count_stddev=1e-9", "privacy.noise_multiplier=0")
    first = _round(strategy, [1.0] * 10)
    c1 = 0.2 * math.exp(0.2 * (1.0 - 0.5))
    assert first.stats["clip_norm"] == 0.2
    assert first.stats["fraction_clipped_noisy"] == pytest.approx(1.0, abs=1e-9)
    assert strategy.clipping.clip_norm == pytest.approx(c1, rel=1e-8)
    c1 = strategy.clipping.clip_norm
    assert first.stats["clip_norm_next"] == c1
    grid = FakeGrid()
    strategy.population.connect(grid, 1.0)
    messages = list(strategy.configure_train(2, ArrayRecord(zeros(SHAPES)), ConfigRecord(), grid))
    sent = TrainInstructions.from_config(messages[0].content["config"])
    assert sent.clip_norm == pytest.approx(c1, rel=1e-12)
    second = _round(strategy, [5.0] * 10, server_round=2)
    assert second.stats["clip_norm"] == pytest.approx(c1, rel=1e-12)
    # No noise: the new model moved by at most C_1 (each update clipped at C_1, averaged over m).
    assert np.linalg.norm(flat(delta(second.new_weights, zeros(SHAPES)))) <= c1 * (1 + 1e-5)


def test_server_noise_uses_the_c_the_updates_were_clipped_at():
    """Round 2 after C moved: the server's noise std is σ_Δ·C_t/m with C_t the round's C (not C_{t+1})."""
    shapes = [(400, 500)]
    strategy = build(*ADAPTIVE)
    sigma_update = strategy.noise_multiplier
    plan = prime(strategy, [np.zeros(s, dtype=np.float32) for s in shapes], sampled=10, server_round=1)
    strategy.aggregator.aggregate(plan, [reply(i, with_norm(shapes, 3.0, seed=i)) for i in range(10)])
    c_t = strategy.clipping.clip_norm
    assert c_t != 0.2
    plan = prime(strategy, [np.zeros(s, dtype=np.float32) for s in shapes], sampled=10, server_round=2)
    outcome = strategy.aggregator.aggregate(plan, [reply(i, zeros(shapes), pre_clip_norm=0.0) for i in range(10)])
    assert strategy.clipping.clip_norm != c_t
    assert outcome.new_weights[0].std() == pytest.approx(sigma_update * c_t / 10, rel=0.01)  # 200k draws: ~0.2%


def test_the_released_fraction_comes_from_its_own_stream_over_the_fixed_denominator():
    strategy = build(*ADAPTIVE, "privacy.clipped_count_stddev=0.7")
    outcome = _round(strategy, [0.1, 0.1, 0.5, 1.0, 2.0, 0.05])  # 3 of 6 above C = 0.2
    rng = mech.make_rng(strategy.config.seed, 1, STREAM_ADAPTIVE_CLIP)
    expected = adaptive.noisy_clipped_fraction([0, 0, 1, 1, 1, 0], 10.0, 0.7, rng)
    assert outcome.stats["fraction_clipped_noisy"] == pytest.approx(expected, rel=1e-12)
    assert strategy.clipping.clip_norm == pytest.approx(0.2 * math.exp(-0.2 * ((1 - expected) - 0.5)), rel=1e-12)


def test_a_clients_reported_norm_sets_only_its_own_bit():
    """The server computes each bit from the reported norm: a lying client moves the count by at most ½ (centred),
    like any client's true bit; rejected clients have no bit."""
    strategy = build(*ADAPTIVE, "privacy.clipped_count_stddev=1e-12", "privacy.noise_multiplier=0")
    plan = prime(strategy, zeros(SHAPES), sampled=3)
    honest = [reply(i, with_norm(SHAPES, 0.1, seed=i)) for i in range(2)]
    liar = reply(2, with_norm(SHAPES, 0.1, seed=2), pre_clip_norm=1e30)
    stats = strategy.aggregator.aggregate(plan, [*honest, liar]).stats
    assert stats["fraction_clipped_noisy"] == pytest.approx((-0.5 - 0.5 + 0.5) / 10 + 0.5, abs=1e-9)


# ----- accounting and publication ----------------------------------------------------------------------------------


def test_the_joint_release_is_accounted_at_the_configured_multiplier():
    sigma, sigma_b, q, delta_ = 0.95, 0.8, 0.2, 1 / 50
    strategy = build(*ADAPTIVE, f"privacy.clipped_count_stddev={sigma_b}")
    assert strategy.noise_multiplier == pytest.approx(adaptive.update_share_of_joint(sigma, sigma_b), rel=1e-12)
    assert strategy.account.accounted_noise_multiplier == pytest.approx(sigma, rel=1e-12)
    strategy.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=3)
    assert strategy.epsilon() == pytest.approx(compute_epsilon(sigma, q, 3, delta_), rel=1e-9)
    claim = strategy.dp_guarantee()
    assert claim["accounted_noise_multiplier"] == pytest.approx(sigma, rel=1e-12)
    assert claim["clipping"]["clipped_count_stddev"] == sigma_b
    assert claim["clipping"]["update_noise_multiplier"] == pytest.approx(strategy.noise_multiplier)


def test_target_epsilon_calibrates_the_joint_multiplier():
    strategy = build(*ADAPTIVE, "num_rounds=20", "privacy.target_epsilon=4.0")
    joint = calibrate_noise_multiplier(4.0, 1 / 50, 0.2, 20, accountant="rdp", sampling="poisson", population=50)
    assert strategy.account.accounted_noise_multiplier == pytest.approx(joint, rel=1e-9)
    assert strategy.noise_multiplier == pytest.approx(adaptive.update_share_of_joint(joint, 0.5), rel=1e-12)


def test_fixed_size_sampling_accounts_the_same_joint_multiplier():
    strategy = build(*ADAPTIVE, "privacy.sampling=fixed", "privacy.placement=client")
    strategy.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=2)
    expected = compute_epsilon(0.95, 0.2, 2, 1 / 50, sampling="fixed", population=50)
    assert strategy.epsilon() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("mode", ["none", "noisy", "raw"])
def test_c_t_and_the_noisy_fraction_are_published_whatever_client_statistics_says(mode):
    strategy = build(*ADAPTIVE, f"privacy.client_statistics={mode}")
    stats = _round(strategy, [0.1, 0.5, 1.0, 0.05]).stats
    published = strategy.aggregator.published_statistics(1, stats)
    for key in ("clip_norm", "clip_norm_next", "fraction_clipped_noisy"):
        assert published[key] == stats[key]
    if mode != "raw":
        assert not set(CLIENT_DERIVED) & set(published)


def test_checkpoint_state_carries_c():
    strategy = build(*ADAPTIVE)
    _round(strategy, [1.0] * 10)
    state, arrays = strategy.state()
    assert state["clip_norm"] == strategy.clipping.clip_norm != 0.2
    resumed = build(*ADAPTIVE)
    resumed.run_state.load_state(state, arrays)
    assert resumed.clipping.clip_norm == strategy.clipping.clip_norm


def test_canaries_are_scaled_to_the_rounds_c():
    """Two rounds of zero updates shrink C; round 3's canaries reach the server at C_2, like its real clients."""
    strategy = build(*ADAPTIVE, "audit=canaries", "audit.canaries=40")
    grid = FakeGrid()
    strategy.start(grid, ArrayRecord(zeros(SHAPES)), num_rounds=2)
    c2 = strategy.clipping.clip_norm
    assert c2 < 0.2
    canaries = strategy.aggregator.canary_updates(strategy.plan_round(3, ArrayRecord(zeros(SHAPES)), ConfigRecord()))
    assert canaries
    for _, update in canaries:
        assert mech.global_l2_norm(update) == pytest.approx(c2, rel=1e-5)
