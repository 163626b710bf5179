"""Adaptive clipping's mechanism math (fl_app/privacy/adaptive_clipping.py; Andrew et al., NeurIPS 2021), pinned,
and compared with Flower's own ``DifferentialPrivacyServerSideAdaptiveClipping`` wrapper."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import DifferentialPrivacyServerSideAdaptiveClipping, FedAvg
from hypothesis import given
from hypothesis import strategies as st
from opacus.accountants import RDPAccountant

from fl_app.privacy import adaptive_clipping as adaptive
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.accountants import compute_epsilon
from tests.helpers import train_message, with_norm
from tests.strategies.conftest import task_identity  # flwr's Message() needs a task identity

__all__ = ["task_identity"]

SHAPES = [(6, 5), (5,)]


# ----- the geometric update ---------------------------------------------------------------------------------------


def test_without_noise_c_follows_the_closed_form_geometric_update():
    """σ_b = 0, every norm above C for the whole run: f̃ = 1 each round, so C_t = C_0 · exp(η (1 − γ) t)."""
    c0, gamma, eta, norms = 0.05, 0.5, 0.2, [5.0, 6.0, 7.0, 8.0]
    clip = c0
    for t in range(1, 31):
        fraction = adaptive.noisy_clipped_fraction(adaptive.clipped_bits(norms, clip), 4.0, 0.0, rng=None)  # type: ignore[arg-type]
        assert fraction == 1.0
        clip = adaptive.next_clip_norm(clip, fraction, gamma, eta)
        assert clip == pytest.approx(c0 * math.exp(eta * (1 - gamma) * t), rel=1e-12)
    # Every norm below C: f̃ = 0 and C shrinks by exp(−η γ) a round.
    assert adaptive.next_clip_norm(2.0, 0.0, 0.3, 0.2) == pytest.approx(2.0 * math.exp(-0.2 * 0.7), rel=1e-15)
    # On target (f̃ = 1 − γ) C stays.
    assert adaptive.next_clip_norm(2.0, 0.7, 0.3, 0.2) == pytest.approx(2.0, rel=1e-15)


@pytest.mark.parametrize("gamma", [0.5, 0.9, 0.2])
def test_c_converges_to_the_target_quantile_of_a_fixed_norm_distribution(gamma):
    """No noise, a fixed population of 200 norms (log-normal, spread over two decades) all reporting every round,
    C_0 a hundredth of the median, the paper's η = 0.2: within 120 rounds C_t sits at the γ-quantile — the fraction
    of norms at or below it stays within γ ± 0.03 for the next 80 rounds."""
    norms = np.exp(np.random.default_rng(7).normal(0.0, 1.0, 200))
    clip = 0.01 * float(np.median(norms))
    unclipped = []
    for _ in range(200):
        bits = adaptive.clipped_bits(norms, clip)
        unclipped.append(1.0 - bits.mean())
        clip = adaptive.next_clip_norm(clip, adaptive.noisy_clipped_fraction(bits, 200, 0.0, None), gamma, 0.2)  # type: ignore[arg-type]
    assert np.all(np.abs(np.array(unclipped[120:]) - gamma) <= 0.03), unclipped[120:]
    assert abs(clip / np.quantile(norms, gamma) - 1) < 0.1


# ----- the noisy count -----------------------------------------------------------------------------------------------


def test_released_fraction_is_unbiased_with_std_sigma_b_over_m():
    m, sigma_b = 20.0, 1.5
    bits = np.array([1.0] * 7 + [0.0] * 13)  # 7 of 20 clipped
    rng = np.random.default_rng(3)
    draws = np.array([adaptive.noisy_clipped_fraction(bits, m, sigma_b, rng) for _ in range(20_000)])
    assert abs(draws.mean() - 7 / 20) < 5 * (sigma_b / m) / math.sqrt(len(draws))
    assert draws.std() == pytest.approx(sigma_b / m, rel=0.02)  # the std estimate's own error: ~0.5%


def test_centred_count_over_the_fixed_denominator():
    """Under Poisson sampling n ≠ m: the release is Σ(c_i − ½)/m + ½, which shifts by at most ½/m per client."""
    fraction = adaptive.noisy_clipped_fraction([1.0, 1.0, 0.0], 4.0, 0.0, None)  # type: ignore[arg-type]
    assert fraction == pytest.approx((1.5 - 1.5 + 0.5) / 4 + 0.5)
    with_one_more = adaptive.noisy_clipped_fraction([1.0, 1.0, 0.0, 1.0], 4.0, 0.0, None)  # type: ignore[arg-type]
    assert abs(with_one_more - fraction) == pytest.approx(0.5 / 4)


@given(st.lists(st.sampled_from([0.0, 1.0]), max_size=40), st.sampled_from([0.0, 1.0]))
def test_one_client_moves_the_centred_count_by_exactly_a_half(bits, extra):
    m = 10.0
    without = adaptive.noisy_clipped_fraction(bits, m, 0.0, None)  # type: ignore[arg-type]
    with_client = adaptive.noisy_clipped_fraction([*bits, extra], m, 0.0, None)  # type: ignore[arg-type]
    assert abs(with_client - without) * m == pytest.approx(0.5)


def test_bits_are_computed_from_norms_and_must_be_binary():
    assert adaptive.clipped_bits([0.1, 0.2, 0.3], 0.2).tolist() == [0.0, 0.0, 1.0]  # ‖Δ‖ = C is not clipped
    with pytest.raises(ValueError, match="0 or 1"):
        adaptive.noisy_clipped_fraction([0.5], 4.0, 1.0, np.random.default_rng(0))


# ----- accounting (Thm. 1) -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("z", "sigma_b", "sigma_update"),
    [(0.95, 0.5, 3.0424349222966542), (1.0, 5.0, 1.005037815259212), (0.95, 2.5, 0.9676261913075563)],
)
def test_update_share_of_joint_at_pinned_points(z, sigma_b, sigma_update):
    assert adaptive.update_share_of_joint(z, sigma_b) == pytest.approx(sigma_update, rel=1e-12)
    assert adaptive.joint_noise_multiplier(sigma_update, sigma_b) == pytest.approx(z, rel=1e-12)


def test_the_joint_multiplier_is_that_of_one_gaussian_mechanism_on_the_pair():
    """A client moves (sum/C, centred count) by at most (1, ½); with noise stds (σ_Δ, σ_b) that is a shift of
    ‖(1/σ_Δ, ½/σ_b)‖ against unit noise — a single Gaussian mechanism with multiplier 1/‖·‖ (its Rényi divergence
    α‖v‖²/2 depends on the shift's norm only)."""
    sigma_update, sigma_b = 1.3, 0.8
    shift = math.hypot(1.0 / sigma_update, 0.5 / sigma_b)
    assert adaptive.joint_noise_multiplier(sigma_update, sigma_b) == pytest.approx(1.0 / shift, rel=1e-14)


def test_a_count_noise_too_small_for_the_joint_multiplier_is_refused():
    with pytest.raises(ValueError, match="too small"):
        adaptive.update_share_of_joint(1.0, 0.5)  # 2σ_b = z: nothing left for the update
    assert adaptive.update_share_of_joint(0.0, 0.5) == 0.0  # no privacy asked for


def test_epsilon_of_the_joint_release_is_opacus_at_the_joint_multiplier():
    """(z = 1.0, σ_b = 5, q = 0.1, T = 100, δ = 1e-5): the accountant composes z, and ε is Opacus' 7.8993."""
    sigma_update = adaptive.update_share_of_joint(1.0, 5.0)
    joint = adaptive.joint_noise_multiplier(sigma_update, 5.0)
    opacus = RDPAccountant()
    for _ in range(100):
        opacus.step(noise_multiplier=1.0, sample_rate=0.1)
    assert opacus.get_epsilon(1e-5) == pytest.approx(7.899255002434629, rel=1e-9)
    assert compute_epsilon(joint, 0.1, 100, 1e-5) == pytest.approx(opacus.get_epsilon(1e-5), rel=1e-9)


# ----- against Flower's DifferentialPrivacyServerSideAdaptiveClipping -------------------------------------------------


def _flower(z: float, m: int, c0: float, gamma: float, eta: float, sigma_b: float):
    return DifferentialPrivacyServerSideAdaptiveClipping(
        FedAvg(), z, m, initial_clipping_norm=c0, target_clipped_quantile=gamma, clip_norm_lr=eta,
        clipped_count_stddev=sigma_b,
    )  # fmt: skip


def _flower_round(wrapper, global_weights, updates, seed, monkeypatch):
    """One aggregate_train of Flower's wrapper; returns (aggregate before Flower's noise, Flower's noise std)."""
    captured = {}

    def capture_noise(arrays, std_dev):
        captured["std"] = std_dev
        captured["aggregate"] = [np.array(a, copy=True) for a in arrays]

    monkeypatch.setattr("flwr.serverapp.strategy.dp_adaptive_clipping.add_gaussian_noise_inplace", capture_noise)
    wrapper.current_arrays = ArrayRecord([np.array(w, copy=True) for w in global_weights])
    replies = [
        Message(
            RecordDict({
                "arrays": ArrayRecord([w + u for w, u in zip(global_weights, update, strict=True)]),
                "metrics": MetricRecord({"num-examples": 1}),
            }),
            reply_to=train_message(i),
        )
        for i, update in enumerate(updates)
    ]  # fmt: skip
    np.random.seed(seed)  # Flower draws its count noise from NumPy's global generator
    wrapper.aggregate_train(1, replies)
    return captured["aggregate"], captured["std"]


@pytest.mark.usefixtures("task_identity")
def test_same_release_opposite_step_and_post_update_noise_against_flower(monkeypatch):
    """Fixed client updates, the count noise drawn from the same generator (NumPy's legacy stream, seeded alike):

    * agree: σ_Δ from (z, σ_b), σ_b = m/20 as default, the clipped updates and their mean, and the released noisy
      clipped fraction, draw for draw;
    * differ (1): Flower counts *clipped* updates but applies the paper's step for *unclipped* ones,
      C·exp(−η(f − γ)): its step in log C is exactly the negative of ours for γ = ½ (below, it drives C away from
      the target instead of towards it);
    * differ (2): Flower's server noise uses the clip norm *after* the update, σ_Δ·C_{t+1}/m, while the updates
      were clipped at C_t — under-noised whenever C shrinks; ours adds σ_Δ·C_t/m.
    """
    z, m, c0, gamma, eta = 0.9, 10, 0.5, 0.5, 0.2
    sigma_b = adaptive.default_clipped_count_stddev(m)
    flower = _flower(z, m, c0, gamma, eta, None)  # type: ignore[arg-type]
    assert flower.clipped_count_stddev == pytest.approx(sigma_b, rel=1e-15)
    assert flower.noise_multiplier == pytest.approx(adaptive.update_share_of_joint(z, sigma_b), rel=1e-12)

    global_weights = [np.zeros(s, dtype=np.float32) for s in SHAPES]
    norm_law = np.random.default_rng(11)
    clip = c0
    for t in range(1, 9):
        norms = norm_law.lognormal(np.log(0.5), 0.8, m)
        updates = [with_norm(SHAPES, float(n), seed=100 * t + i) for i, n in enumerate(norms)]
        flower.clipping_norm = clip  # both start the round at our C_t
        flower_aggregate, flower_std = _flower_round(flower, global_weights, updates, 1000 + t, monkeypatch)
        flower_clip = flower.clipping_norm

        ours = mech.uniform_average([mech.clip_update(u, clip)[0] for u in updates], m, SHAPES)
        for a, b in zip(ours, flower_aggregate, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        bits = adaptive.clipped_bits([mech.global_l2_norm(u) for u in updates], clip)
        fraction = adaptive.noisy_clipped_fraction(bits, m, sigma_b, np.random.RandomState(1000 + t))
        flower_fraction = gamma - math.log(flower_clip / clip) / eta
        assert fraction == pytest.approx(flower_fraction, abs=1e-12)
        new_clip = adaptive.next_clip_norm(clip, fraction, gamma, eta)
        assert math.log(new_clip / clip) == pytest.approx(-math.log(flower_clip / clip), abs=1e-12)
        our_std = mech.gaussian_noise_std(adaptive.update_share_of_joint(z, sigma_b), clip, m, "server")
        assert flower_std == pytest.approx(flower.noise_multiplier * flower_clip / m, rel=1e-12)
        assert flower_std / our_std == pytest.approx(flower_clip / clip, rel=1e-12)
        clip = new_clip


@pytest.mark.usefixtures("task_identity")
def test_flowers_step_runs_away_from_the_quantile_where_ours_converges(monkeypatch):
    """No noise (Flower: z = 0, σ_b = 0), the same 20 fixed norms every round from C_0 = the 0.6-quantile: our C
    settles at the median, Flower's leaves it geometrically (every update ends up clipped: C → 0)."""
    norms = np.exp(np.random.default_rng(5).normal(0.0, 0.5, 20))
    updates = [with_norm(SHAPES, float(n), seed=i) for i, n in enumerate(norms)]
    global_weights = [np.zeros(s, dtype=np.float32) for s in SHAPES]
    c0 = float(np.quantile(norms, 0.4))
    flower = _flower(0.0, 20, c0, 0.5, 0.2, 0.0)
    ours = c0
    for t in range(60):
        _flower_round(flower, global_weights, updates, t, monkeypatch)
        bits = adaptive.clipped_bits(norms, ours)
        ours = adaptive.next_clip_norm(ours, adaptive.noisy_clipped_fraction(bits, 20, 0.0, None), 0.5, 0.2)  # type: ignore[arg-type]
    assert abs(np.mean(norms <= ours) - 0.5) <= 0.05
    assert flower.clipping_norm < 0.01 * norms.min()
    assert np.mean(norms <= flower.clipping_norm) == 0.0
