"""docs/PRIVACY.md §4, as tests: under client placement the server trusts each client to clip and to add its own
share of the noise. It tops the noise up only for clients that did not contribute, so k noise-skipping clients of
m leave σ·√((m − k)/m) (in units of C/m) on the aggregate, and it does not re-clip (the replies carry noise), so an
unclipped update moves the model by update/m. Server placement re-clips every reply (tests/strategies/)."""

from __future__ import annotations

import numpy as np
import pytest

from fl_app.privacy import mechanisms as mech
from tests.helpers import build, delta, flat, prime, reply, zeros
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

SHAPES = [(200_000,), (7,)]
CLIENT = ["dataset.num_clients=50", "privacy.sample_rate=0.2", "privacy.sampling=fixed", "privacy.placement=client"]
SIGMA, C, M = 0.95, 0.2, 10


@pytest.mark.parametrize("skipping", [0, 3, 10])
def test_noise_skipping_clients_leave_the_honest_ones_share(skipping: int) -> None:
    strategy = build("strategy=dp_fedavg", *CLIENT)
    assert strategy.expected_clients == M and not strategy.aggregator.server_clips
    rng = np.random.default_rng(skipping)
    per_client = mech.gaussian_noise_std(SIGMA, C, M, "client")  # σC/√m
    old = zeros(SHAPES)
    plan = prime(strategy, old, sampled=M, server_round=1)
    replies = [
        reply(
            pid, zeros(SHAPES) if pid < skipping else [rng.normal(0, per_client, s).astype(np.float32) for s in SHAPES]
        )
        for pid in range(M)
    ]
    step = flat(delta(strategy.aggregator.aggregate(plan, replies).new_weights, old))
    expected = SIGMA * C / M * np.sqrt((M - skipping) / M)  # every client contributed: no top-up
    if skipping == M:
        assert np.count_nonzero(step) == 0  # nobody noised, nothing is added
    else:
        assert step.std() == pytest.approx(expected, rel=0.01)


def test_the_server_does_not_reclip_under_client_placement() -> None:
    strategy = build("strategy=dp_fedavg", *CLIENT)
    old = zeros(SHAPES)
    plan = prime(strategy, old, sampled=M, server_round=1)
    huge = [np.full(s, 1.0, dtype=np.float32) for s in SHAPES]  # norm ≈ 447 ≫ C = 0.2
    outcome = strategy.aggregator.aggregate(plan, [reply(0, huge), *[reply(pid, zeros(SHAPES)) for pid in range(1, M)]])
    np.testing.assert_allclose(flat(delta(outcome.new_weights, old)), flat(huge) / M, rtol=1e-6)
    assert outcome.stats.get("reclipped", 0) == 0
