"""strategies/client_dp/average.py: the server's re-clip, the sum over the fixed m, the placement's noise, drawn on
demand or ahead."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from fl_app.instructions import STREAM_SERVER_NOISE, RecipeSpec
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.pipeline import mechanisms_for
from strategies.client_dp import NoisyAverage
from strategies.client_dp.clipping import FixedClipNorm
from strategies.client_dp.placement import ClientPlacement, ServerPlacement

SEED, SIGMA, C, M = 3, 1.2, 0.5, 4.0
SHAPES = [(2, 3), (3,)]


@dataclass
class Round:
    server_round: int = 2
    mask: list[np.ndarray] | None = None
    server_noise: mech.RandomSource | None = None

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return SHAPES


def noise_source(server_round: int, purpose: int) -> mech.RandomSource:
    return mech.random_source(False, SEED, server_round, purpose)


def average(placement=None, sigma: float = SIGMA) -> NoisyAverage:
    return NoisyAverage(mechanisms_for(RecipeSpec("dense")), placement or ServerPlacement(), FixedClipNorm(C),
                        noise_multiplier=sigma, expected_clients=M)  # fmt: skip


def updates(count: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(0)
    return [[rng.normal(size=s) * 0.01 for s in SHAPES] for _ in range(count)]


def test_the_average_is_the_sum_over_the_fixed_m_plus_the_servers_noise() -> None:
    got = average().average(Round(), updates(3), num_clients=3, noise_source=noise_source)
    # Σ/m rounded to the model's float32, then N(0, (σC/m)²) from the round's server-noise stream, added in float64.
    mean = mech.uniform_average(updates(3), M, SHAPES)
    want = mech.add_gaussian_noise(mean, SIGMA * C / M, noise_source(2, STREAM_SERVER_NOISE))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_array_equal(g, w)


def test_no_noise_leaves_the_sum_over_m_whoever_answered() -> None:
    got = average(sigma=0.0).average(Round(), updates(1), num_clients=1, noise_source=noise_source)
    for g, t in zip(got, updates(1)[0], strict=True):
        np.testing.assert_array_equal(g, (t / M).astype(np.float32))  # one answer of m = 4: divided by 4, not 1


def test_the_server_reclips_a_sum_of_k_to_k_times_c_under_server_placement_only() -> None:
    big = [np.full(s, 10.0) for s in SHAPES]
    clipped, reclipped = average().reclip(big, clients=2)
    assert reclipped == 2 and mech.global_l2_norm(clipped) == pytest.approx(2 * C, rel=1e-12)
    small = [np.full(s, 0.01) for s in SHAPES]
    assert average().reclip(small, clients=1)[1] == 0
    kept, count = average(ClientPlacement()).reclip(big, clients=2)
    assert count == 0 and all(np.array_equal(k, b) for k, b in zip(kept, big, strict=True))


def test_client_placement_tops_the_noise_up_for_the_clients_that_did_not_contribute() -> None:
    got = average(ClientPlacement()).average(Round(), updates(1), num_clients=1, noise_source=noise_source)
    std = mech.client_noise_topup_std(SIGMA, C, M, 1)
    assert 0 < std < SIGMA * C / M
    mean = mech.uniform_average(updates(1), M, SHAPES)
    want = mech.add_gaussian_noise(mean, std, noise_source(2, STREAM_SERVER_NOISE))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_noise_drawn_ahead_is_the_noise_drawn_on_demand() -> None:
    ahead = Round()
    average().draw_noise_ahead(ahead, noise_source)
    assert ahead.server_noise is not None
    first = ahead.server_noise
    average().draw_noise_ahead(ahead, noise_source)  # idempotent
    assert ahead.server_noise is first
    on_demand = average().average(Round(), updates(2), num_clients=2, noise_source=noise_source)
    released = average().average(ahead, updates(2), num_clients=2, noise_source=noise_source)
    for a, b in zip(released, on_demand, strict=True):
        np.testing.assert_array_equal(a, b)


def test_nothing_is_drawn_ahead_where_the_clients_add_the_noise() -> None:
    plan = Round()
    average(ClientPlacement()).draw_noise_ahead(plan, noise_source)
    assert plan.server_noise is None
