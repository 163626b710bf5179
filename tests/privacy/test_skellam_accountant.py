"""The distributed Skellam mechanism's accounting: the RDP bound pinned at hand-computed points, the Gaussian limit,
the Poisson-subsampled bound against the exact sampled Gaussian, and the accountant behind Flower's interface for
either adversary."""

from __future__ import annotations

import math
from collections.abc import Callable

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod

from fl_app.privacy.accountants.interface import FlowerAccountant
from fl_app.privacy.accountants.skellam import (
    SKELLAM_ORDERS,
    SkellamAccountant,
    SkellamEvent,
    poisson_subsampled_rdp,
    skellam_rdp,
)
from fl_app.privacy.distributed.encoding import l1_sensitivity, rounded_norm_bound


def _config(method: SamplingMethod, max_epsilon: float | None = None) -> PrivacyConfig:
    return PrivacyConfig(
        target_delta=1e-5,
        population_size=1000,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=method,
        max_epsilon=max_epsilon,
    )


SERVER, MODELS = SamplingMethod.NO_AMPLIFICATION, SamplingMethod.POISSON


def test_the_skellam_bound_at_hand_computed_points() -> None:
    # α = 2, v = 100, Δ2 = 2, Δ1 = 4: 2·4/200 + min((3·4 + 24)/(4·10⁴), 3·4/200) = 0.04 + 0.0009.
    assert skellam_rdp(2, 100.0, 2.0, 4.0) == pytest.approx(0.0409)
    # A small variance: the second branch of the min. α = 3, v = 1, Δ2 = 1, Δ1 = 1: 3/2 + min(11/4, 3/2) = 3.
    assert skellam_rdp(3, 1.0, 1.0, 1.0) == pytest.approx(3.0)
    assert skellam_rdp(2, 0.0, 1.0, 1.0) == math.inf


@pytest.mark.parametrize("order", [1, 2.5, True])
def test_the_skellam_bound_is_for_integer_orders_above_one(order: object) -> None:
    with pytest.raises(ValueError, match="integer orders"):
        skellam_rdp(order, 1.0, 1.0, 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("order", [2, 8, 64])
def test_a_large_variance_gives_the_gaussian_mechanisms_rdp(order: int) -> None:
    sensitivity, sigma = 1e8, 1.3
    rdp = skellam_rdp(order, (sigma * sensitivity) ** 2, sensitivity, 1024 * sensitivity)
    assert rdp == pytest.approx(order / (2 * sigma**2), rel=1e-9)
    assert rdp > order / (2 * sigma**2)


def _gaussian(sigma: float) -> Callable[[int], float]:
    return lambda order: order / (2 * sigma**2)


def test_the_subsampled_bound_is_the_mechanism_at_q_one_and_nothing_at_q_zero() -> None:
    assert poisson_subsampled_rdp(5, _gaussian(1.0), 1.0) == pytest.approx(2.5)
    assert poisson_subsampled_rdp(5, _gaussian(1.0), 0.0) == 0.0


@pytest.mark.parametrize(("sigma", "q"), [(0.8, 0.01), (1.0, 0.05), (2.0, 0.1), (1.0, 0.5)])
def test_the_subsampled_bound_is_above_the_exact_sampled_gaussian(sigma: float, q: float) -> None:
    """Zhu & Wang's bound for any mechanism, applied to the Gaussian, must not undercut dp_accounting's exact RDP of
    the Poisson-subsampled Gaussian at the same integer orders."""
    exact = dp_rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, [float(a) for a in SKELLAM_ORDERS])
    bound = np.array([poisson_subsampled_rdp(a, _gaussian(sigma), q) for a in SKELLAM_ORDERS])
    assert np.all(bound >= exact * (1 - 1e-9))


def test_the_subsampled_bound_costs_a_sixth_more_epsilon_than_the_exact_at_a_dp_fedavg_setting() -> None:
    """σ = 1, q = 0.01, T = 1000, δ = 1e-5: the exact sampled Gaussian is ε = 2.108; the general bound 2.450."""
    exact = dp_accounting.rdp.RdpAccountant([float(a) for a in SKELLAM_ORDERS])
    exact.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)), 1000)
    bound = 1000 * np.array([poisson_subsampled_rdp(a, _gaussian(1.0), 0.01) for a in SKELLAM_ORDERS])
    assert exact.get_epsilon(1e-5) == pytest.approx(2.1078, abs=1e-3)
    assert dp_rdp.compute_epsilon(SKELLAM_ORDERS, bound, 1e-5)[0] == pytest.approx(2.4503, abs=1e-3)


def _large_event(sigma: float = 1.0, q: float = 0.01) -> SkellamEvent:
    sensitivity = 1e8
    return SkellamEvent((sigma * sensitivity) ** 2, sensitivity, 1024 * sensitivity, sample_rate=q)


def test_against_the_server_a_release_costs_the_unsampled_mechanism() -> None:
    accountant = SkellamAccountant(_config(SERVER))
    accountant.compose(_large_event(), 1000)
    gaussian = dp_accounting.rdp.RdpAccountant([float(a) for a in SKELLAM_ORDERS])
    gaussian.compose(dp_accounting.GaussianDpEvent(1.0), 1000)
    assert accountant.get_epsilon(1e-5) == pytest.approx(gaussian.get_epsilon(1e-5), rel=1e-6)
    assert accountant.num_releases == 1000


def test_against_the_models_consumers_sampling_amplifies() -> None:
    server, models = SkellamAccountant(_config(SERVER)), SkellamAccountant(_config(MODELS))
    for accountant in (server, models):
        accountant.compose(_large_event(), 1000)
    assert models.get_epsilon(1e-5) == pytest.approx(2.4503, abs=1e-3)
    assert models.get_epsilon(1e-5) < server.get_epsilon(1e-5) / 100


def test_the_accountant_speaks_flowers_interface() -> None:
    accountant = SkellamAccountant(_config(MODELS, max_epsilon=2.0))
    assert isinstance(accountant, FlowerAccountant)
    assert accountant.get_epsilon(1e-5) == 0.0 and accountant.get_delta(1.0) == 0.0
    accountant.compose(_large_event(), 500)
    epsilon = accountant.get_epsilon(1e-5)
    assert accountant.get_delta(epsilon) == pytest.approx(1e-5, rel=0.05)
    spent = accountant.get_privacy_spent()
    assert (spent.epsilon, spent.delta, spent.num_releases) == (epsilon, 1e-5, 500)
    assert accountant.epsilon_after(_large_event(), 500) == pytest.approx(2.4503, abs=1e-3)
    assert accountant.would_exceed(_large_event(), count=500) is True
    assert accountant.would_exceed(_large_event(), max_epsilon=3.0, count=500) is False
    assert accountant.num_releases == 500


def test_the_state_round_trips_and_merges_runs_of_one_event() -> None:
    accountant = SkellamAccountant(_config(MODELS))
    accountant.compose(_large_event(), 3)
    accountant.compose(_large_event(), 2)
    accountant.compose(_large_event(sigma=2.0), 1)
    state = accountant.state_dict()
    assert [entry["count"] for entry in state["skellam"]] == [5, 1]  # type: ignore[index]
    restored = SkellamAccountant(_config(MODELS))
    restored.load_state_dict(state)
    assert restored.get_epsilon(1e-5) == accountant.get_epsilon(1e-5)
    assert restored.num_releases == 6


def test_what_the_accountant_refuses() -> None:
    fixed_size = PrivacyConfig(
        target_delta=1e-5,
        population_size=1000,
        neighboring_relation=NeighboringRelation.REPLACE_ONE,
        sampling_method=SamplingMethod.WITHOUT_REPLACEMENT,
    )
    with pytest.raises(ValueError, match="unamplified"):
        SkellamAccountant(fixed_size)
    accountant = SkellamAccountant(_config(SERVER))
    with pytest.raises(TypeError, match="SkellamEvent"):
        accountant.compose(dp_accounting.GaussianDpEvent(1.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count"):
        accountant.compose(_large_event(), 0)
    with pytest.raises(ValueError, match="variance"):
        SkellamEvent(-1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="sample_rate"):
        SkellamEvent(1.0, 1.0, 1.0, sample_rate=1.5)
    with pytest.raises(ValueError, match="'skellam' list"):
        accountant.load_state_dict({})


#: ε of the distributed Skellam mechanism from the authors' released accounting (google-research/federated,
#: distributed_dp/accounting_utils.py at a5af8c4, ``skellam_epsilon``: the same bound, rounding inflation, ℓ1 bound
#: and Zhu–Wang subsampling), computed by a line-by-line numpy port of it. The paper reports accuracy curves, not ε
#: tables, so these are the pins a reader can reproduce: ``skellam_epsilon(scale, central_stddev, l2, beta, dim, q,
#: steps, delta, l1)`` with β = e^(−1/2). Columns: scale s, central std σ (unscaled), clip c, ℓ1 (None: from the
#: rounding), d, q, T, δ, rounding, ε.
AUTHORS_REFERENCE = [
    (1, 10, 1, 1, 1, 1.0, 1, 1e-5, False, 0.3774237564),
    (1, 1, 1, 1, 1, 1.0, 1, 1e-5, False, 6.2527283368),
    (100, 1, 1, 10, 100, 1.0, 1, 1e-5, False, 4.7529683368),
    (1, 50, 10, 40, 16, 1.0, 1, 1e-5, False, 0.7947036325),
    (1, 10, 1, 1, 1, 0.01, 1000, 1e-5, False, 0.4847578553),
    (10, 1, 1, 1, 1, 0.01, 1000, 1e-5, False, 2.4774497595),
    (1000, 1, 1, 1, 1, 0.01, 1000, 1e-5, False, 2.4502902637),
    (10, 2, 1, 1, 1, 0.01, 1000, 1e-5, False, 0.9041995167),
    (1000, 1, 1, None, 1024, 1.0, 1, 1e-5, True, 4.75591064),
    (100, 10, 10, None, 256, 1.0, 1, 1e-5, True, 4.75541061),
    # The EMNIST settings of the authors' fl_run (N = 3400, 100 clients a round, 1500 rounds, δ = 1/N, d = 2^20).
    (1e4, 0.03, 0.03, None, 2**20, 100 / 3400, 1500, 1 / 3400, True, 69.62928922),
    (3e4, 0.033, 0.03, None, 2**20, 100 / 3400, 1500, 1 / 3400, True, 8.36390724),
]


@pytest.mark.parametrize(
    ("scale", "stddev", "clip", "l1", "dimension", "q", "steps", "delta", "rounding", "expected"), AUTHORS_REFERENCE
)
def test_epsilon_matches_the_authors_released_accounting(
    scale: float,
    stddev: float,
    clip: float,
    l1: float | None,
    dimension: int,
    q: float,
    steps: int,
    delta: float,
    rounding: bool,
    expected: float,
) -> None:
    if rounding:
        l2_integer = rounded_norm_bound(scale * clip, dimension, math.exp(-0.5))
        l1_integer = l1_sensitivity(l2_integer, dimension)
    else:
        l2_integer, l1_integer = scale * clip, scale * float(l1)  # type: ignore[arg-type]
    event = SkellamEvent((scale * stddev) ** 2, l2_integer, l1_integer, sample_rate=q)
    accountant = SkellamAccountant(_config(MODELS if q < 1 else SERVER))
    accountant.compose(event, steps)
    assert accountant.get_epsilon(delta) == pytest.approx(expected, rel=1e-7)
