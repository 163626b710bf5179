"""Tests for strategies/base.py, the round skeleton every strategy shares (docs/mechanisms.md):

sampling, validation of replies, uniform fixed-denominator aggregation, noise placement (server, and client with
the server's top-up), determinism, the non-private references, accounting and the budget guard of ``start()``,
and target-ε calibration.

Aggregation is tested without Flower networking: replies are real ``flwr.app.Message`` objects built with
``reply_to`` a train message, and the strategy's round state is primed as ``configure_train`` would leave it
(see :func:`prime`).
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from clients.recipes import privatize_update
from fl_app.config import ConfigError, compose_config
from fl_app.instructions import make_train_instructions
from fl_app.metrics import MetricsWriter, read_metrics
from fl_app.privacy.accountants import compute_epsilon
from strategies.base import FederatedStrategy
from strategies.dp_fedavg import DPFedAvg
from strategies.dp_fedsam import DPFedSAM
from strategies.fedavg import FederatedAveraging, FedSAM
from tests.helpers import (
    FakeGrid,
    build,
    delta,
    end_round,
    error_reply,
    flat,
    partition_of,
    prime,
    random_update,
    reply,
    train_message,
    with_norm,
    zeros,
)

SMALL_SHAPES = [(1000,), (10, 10)]
# >= 1e5 coordinates for the noise-law tests: the sample std of n normals has relative error ~ 1/sqrt(2n) = 0.2%.
LARGE_SHAPES = [(100_000,), (10, 10)]

# A population of M = 50 with q = 0.2 gives the fixed denominator m = qM = 10.
SMALL_POP = ["dataset.num_clients=50", "privacy.sample_rate=0.2"]


# ----- helpers ------------------------------------------------------------------------------------------------


def assert_update_equal(actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-7)


# ----- 1. server placement: fixed denominator and re-clipping ----------------------------------------------------


def test_server_placement_sums_over_fixed_denominator_and_reclips():
    strategy = build("strategy=dp_fedavg", *SMALL_POP, "privacy.noise_multiplier=0")
    assert isinstance(strategy, DPFedAvg)
    C, m = 0.2, 10.0
    assert strategy.expected_clients == pytest.approx(m)
    old = random_update(SMALL_SHAPES, 0.1, seed=0)
    small_a = with_norm(SMALL_SHAPES, 0.1, seed=1)
    small_b = with_norm(SMALL_SHAPES, 0.15, seed=2)
    huge = with_norm(SMALL_SHAPES, 1e3, seed=3)
    plan = prime(strategy, old, sampled=3)  # Poisson drew 3 clients: the denominator is still m = qM = 10, not 3
    outcome = strategy.aggregator.aggregate(plan, [reply(3, small_a), reply(7, small_b), reply(11, huge)])

    huge_clipped = [h.astype(np.float64) * (C / 1e3) for h in huge]
    expected = [(a + b + h) / m for a, b, h in zip(small_a, small_b, huge_clipped, strict=True)]
    assert_update_equal(delta(outcome.new_weights, old), expected)
    stats = outcome.stats
    assert stats["reclipped"] == 1
    assert (stats["sampled"], stats["received"], stats["aggregated"], stats["failed"]) == (3, 3, 3, 0)
    assert stats["fraction_clipped"] == pytest.approx(1 / 3)
    assert stats["norm_max"] == pytest.approx(1e3, rel=1e-6)


def test_server_reclips_a_huge_update_to_c_over_m():
    strategy = build("strategy=dp_fedavg", *SMALL_POP, "privacy.noise_multiplier=0")
    old = random_update(SMALL_SHAPES, 0.1, seed=0)
    huge = with_norm(SMALL_SHAPES, 1e3, seed=4)
    plan = prime(strategy, old, sampled=1)
    outcome = strategy.aggregator.aggregate(
        plan, [reply(5, huge, pre_clip_norm=0.1)]
    )  # a client that lies about its norm
    step = flat(delta(outcome.new_weights, old))
    assert np.linalg.norm(step) <= 0.2 / 10 * (1 + 1e-5)
    assert np.linalg.norm(step) == pytest.approx(0.2 / 10, rel=1e-4)
    # Clipping scales, it does not change the direction.
    cosine = step @ flat(huge) / (np.linalg.norm(step) * np.linalg.norm(flat(huge)))
    assert cosine == pytest.approx(1.0, abs=1e-6)
    assert outcome.stats["reclipped"] == 1


def test_update_below_c_is_not_reclipped():
    strategy = build("strategy=dp_fedavg", *SMALL_POP, "privacy.noise_multiplier=0")
    old = random_update(SMALL_SHAPES, 0.1, seed=0)
    small = with_norm(SMALL_SHAPES, 0.19, seed=5)
    plan = prime(strategy, old, sampled=1)
    outcome = strategy.aggregator.aggregate(plan, [reply(2, small)])
    assert outcome.stats["reclipped"] == 0
    assert outcome.stats["fraction_clipped"] == 0.0
    assert_update_equal(delta(outcome.new_weights, old), [s.astype(np.float64) / 10 for s in small])


def test_server_learning_rate_scales_the_average():
    strategy = build("strategy=dp_fedavg", *SMALL_POP, "privacy.noise_multiplier=0", "strategy.server_lr=0.5")
    old = random_update(SMALL_SHAPES, 0.1, seed=0)
    small = with_norm(SMALL_SHAPES, 0.1, seed=6)
    plan = prime(strategy, old, sampled=1)
    outcome = strategy.aggregator.aggregate(plan, [reply(2, small)])
    assert_update_equal(delta(outcome.new_weights, old), [0.5 * s.astype(np.float64) / 10 for s in small])


# ----- 2. rejections ------------------------------------------------------------------------------------------


def test_rejected_and_failed_replies_are_counted_and_excluded():
    strategy = build("strategy=dp_fedavg", *SMALL_POP, "privacy.noise_multiplier=0")
    old = random_update(SMALL_SHAPES, 0.1, seed=0)
    good = with_norm(SMALL_SHAPES, 0.1, seed=7)
    nan_update = with_norm(SMALL_SHAPES, 0.1, seed=8)
    nan_update[1][3, 4] = np.nan
    inf_update = with_norm(SMALL_SHAPES, 0.1, seed=9)
    inf_update[0][17] = np.inf
    extra_tensor = [*with_norm(SMALL_SHAPES, 0.1, seed=10), np.zeros(3, dtype=np.float32)]
    wrong_shape = [np.zeros((1000,), np.float32), np.zeros((10, 11), np.float32)]
    replies = [
        reply(0, good),
        reply(1, nan_update, pre_clip_norm=float("nan")),
        reply(2, inf_update, pre_clip_norm=float("inf")),
        reply(3, extra_tensor),
        reply(4, wrong_shape),
        error_reply(5),
    ]
    plan = prime(strategy, old, sampled=8)  # two of the eight sampled clients never answer
    outcome = strategy.aggregator.aggregate(plan, replies)
    stats = outcome.stats
    assert stats["received"] == 6
    assert stats["aggregated"] == 1
    assert stats["rejected_nonfinite"] == 2
    assert stats["rejected_shape"] == 2
    assert stats["failed"] == 1 + 2  # the error reply + the sampled - received missing replies
    assert stats["client_norms"] == [pytest.approx(0.1, rel=1e-5)]
    assert all(np.isfinite(w).all() for w in outcome.new_weights)
    # Fixed denominator m = 10 (not the one update that was aggregated).
    assert_update_equal(delta(outcome.new_weights, old), [g.astype(np.float64) / 10 for g in good])


def test_rejections_with_noise_keep_the_model_finite():
    strategy = build("strategy=dp_fedavg", *SMALL_POP)
    old = random_update(SMALL_SHAPES, 0.1, seed=0)
    nan_update = with_norm(SMALL_SHAPES, 0.1, seed=8)
    nan_update[0][0] = np.nan
    plan = prime(strategy, old, sampled=3)
    outcome = strategy.aggregator.aggregate(
        plan, [reply(0, nan_update), error_reply(1), reply(2, with_norm(SMALL_SHAPES, 1, 3))]
    )
    assert outcome.stats["rejected_nonfinite"] == 1
    assert outcome.stats["failed"] == 1
    assert outcome.stats["aggregated"] == 1
    assert all(np.isfinite(w).all() for w in outcome.new_weights)


def test_round_with_no_usable_reply_completes():
    strategy = build("strategy=dp_fedavg", *SMALL_POP, "privacy.noise_multiplier=0")
    old = random_update(SMALL_SHAPES, 0.1, seed=0)
    plan = prime(strategy, old, sampled=4)
    outcome = strategy.aggregator.aggregate(plan, [error_reply(0), reply(1, [np.zeros(5, np.float32)])])
    assert outcome.stats["aggregated"] == 0
    assert outcome.stats["failed"] == 1 + 2
    assert outcome.stats["rejected_shape"] == 1
    assert math.isnan(outcome.stats["norm_mean"])
    for new, before in zip(outcome.new_weights, old, strict=True):
        np.testing.assert_array_equal(new, before)


@pytest.mark.parametrize(
    "case", ["missing_norm", "nan_norm", "negative_norm", "int_arrays", "unsampled_partition", "duplicate"]
)
def test_malformed_reply_is_rejected_not_fatal(case):
    strategy = build("strategy=dp_fedavg", *SMALL_POP, "privacy.noise_multiplier=0")
    old = random_update(SMALL_SHAPES, 0.1, seed=0)
    good = with_norm(SMALL_SHAPES, 0.1, seed=11)
    update = zeros(SMALL_SHAPES)
    metrics = {"partition_id": 1, "pre_clip_norm": 0.0, "train_loss": 0.1, "train_accuracy": 0.5, "num_examples": 10}
    if case == "missing_norm":
        del metrics["pre_clip_norm"]
    elif case == "nan_norm":
        metrics["pre_clip_norm"] = float("nan")
    elif case == "negative_norm":
        metrics["pre_clip_norm"] = -1.0
    elif case == "unsampled_partition":
        metrics["partition_id"] = 7
    elif case == "duplicate":
        metrics["partition_id"] = 0
    else:
        update = [np.zeros(shape, dtype=np.int32) for shape in SMALL_SHAPES]
    bad = Message(
        RecordDict({"arrays": ArrayRecord(update), "metrics": MetricRecord(metrics)}), reply_to=train_message(1)
    )
    plan = prime(strategy, old, sampled=2, partitions=range(2))
    outcome = strategy.aggregator.aggregate(plan, [reply(0, good), bad])
    assert outcome.stats["aggregated"] == 1
    assert outcome.stats["rejected_malformed"] + outcome.stats["rejected_shape"] == 1
    assert_update_equal(delta(outcome.new_weights, old), [g.astype(np.float64) / 10 for g in good])


# ----- 3. noise -------------------------------------------------------------------------------------------------


def test_server_noise_std_is_sigma_c_over_m():
    strategy = build("strategy=dp_fedavg", "dataset.num_clients=500", "privacy.sample_rate=0.1")
    sigma, C, m = 0.95, 0.2, 50.0
    assert strategy.config.privacy.placement == "server"
    old = random_update(LARGE_SHAPES, 1.0, seed=0)
    plan = prime(strategy, old, sampled=5)
    outcome = strategy.aggregator.aggregate(plan, [reply(pid, zeros(LARGE_SHAPES)) for pid in range(5)])
    noise = flat(delta(outcome.new_weights, old))
    assert noise.size >= 100_000
    assert abs(noise.mean()) < 0.02 * sigma * C / m
    assert noise.std() == pytest.approx(sigma * C / m, rel=0.02)


def test_client_placement_requires_fixed_sampling():
    with pytest.raises(ConfigError, match="sampling"):
        compose_config(["privacy.placement=client"])


def _client_placement_replies(strategy: FederatedStrategy, server_round: int, partitions) -> list[Message]:
    config = strategy.config
    p = config.privacy
    instructions = make_train_instructions(
        config,
        server_round,
        recipe=strategy.client_recipe(),
        training=strategy.local_training(),
        clip_norm=p.clip_norm,
        add_noise=True,
        noise_multiplier=strategy.noise_multiplier,
        expected_clients=strategy.expected_clients,
    )
    replies = []
    for pid in partitions:
        sent, norm = privatize_update(zeros(LARGE_SHAPES), instructions, int(pid))
        replies.append(reply(int(pid), sent, pre_clip_norm=norm))
    return replies


@pytest.mark.parametrize("missing", [0, 3])
def test_client_placement_aggregate_noise_is_sigma_c_over_m(missing):
    strategy = build(
        "strategy=dp_fedavg",
        "dataset.num_clients=500",
        "privacy.sample_rate=0.1",
        "privacy.sampling=fixed",
        "privacy.placement=client",
    )
    sigma, C, m = 0.95, 0.2, 50
    sampled = strategy.sample_clients(1)
    assert len(sampled) == m
    replies = _client_placement_replies(strategy, 1, sampled[: m - missing])
    old = random_update(LARGE_SHAPES, 1.0, seed=0)
    plan = prime(strategy, old, sampled=m)
    outcome = strategy.aggregator.aggregate(plan, replies)
    assert outcome.stats["aggregated"] == m - missing
    assert outcome.stats["failed"] == missing
    noise = flat(delta(outcome.new_weights, old))
    # Without the server's top-up, 3 missing clients would give sqrt(47/50) = 0.970 of the std: outside 2%.
    assert noise.std() == pytest.approx(sigma * C / m, rel=0.02)


# ----- 4. determinism -------------------------------------------------------------------------------------------


def test_sampling_is_a_function_of_seed_and_round():
    a = build("strategy=dp_fedavg", *SMALL_POP, "seed=3")
    b = build("strategy=dp_fedavg", *SMALL_POP, "seed=3")
    c = build("strategy=dp_fedavg", *SMALL_POP, "seed=4")
    for t in (1, 2, 7):
        np.testing.assert_array_equal(a.sample_clients(t), b.sample_clients(t))
    rounds = [tuple(a.sample_clients(t).tolist()) for t in range(1, 11)]
    assert len(set(rounds)) == 10
    assert any(tuple(c.sample_clients(t).tolist()) != rounds[t - 1] for t in range(1, 11))


def test_poisson_inclusion_frequency_is_q():
    strategy = build("strategy=dp_fedavg", *SMALL_POP)  # M = 50, q = 0.2
    rounds = 2000
    counts = np.zeros(50)
    sizes = []
    for t in range(1, rounds + 1):
        sample = strategy.sample_clients(t)
        assert np.all(np.diff(sample) > 0) and sample.min(initial=0) >= 0 and sample.max(initial=0) < 50
        counts[sample] += 1
        sizes.append(len(sample))
    assert counts.sum() / (rounds * 50) == pytest.approx(0.2, abs=0.01)  # ~8 standard errors
    assert np.all(np.abs(counts / rounds - 0.2) < 0.05)  # every client, ~5.6 standard errors
    assert len(set(sizes)) > 5  # Poisson: the round size varies


def test_fixed_sampling_draws_exactly_m():
    strategy = build("strategy=dp_fedavg", *SMALL_POP, "privacy.sampling=fixed")
    counts = np.zeros(50)
    for t in range(1, 501):
        sample = strategy.sample_clients(t)
        assert len(sample) == 10
        assert len(set(sample.tolist())) == 10
        counts[sample] += 1
    assert np.all(np.abs(counts / 500 - 0.2) < 0.1)


def test_aggregation_is_independent_of_reply_order():
    strategy = build("strategy=dp_fedavg", *SMALL_POP)
    old = random_update(SMALL_SHAPES, 0.1, seed=0)
    replies = [reply(pid, random_update(SMALL_SHAPES, 0.01 * (pid + 1), seed=pid)) for pid in (4, 9, 13, 21, 30)]
    plan = prime(strategy, old, sampled=5, server_round=2)
    reference = strategy.aggregator.aggregate(plan, replies).new_weights
    rng = np.random.default_rng(0)
    for _ in range(3):
        shuffled = [replies[i] for i in rng.permutation(len(replies))]
        plan = prime(strategy, old, sampled=5, server_round=2)
        again = strategy.aggregator.aggregate(plan, shuffled).new_weights
        for a, b in zip(reference, again, strict=True):
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize(
    "overrides",
    [
        ["strategy=fedavg"],
        # σ = 0 and a C far above the norms, so the magnitudes survive clipping.
        ["strategy=dp_fedavg", "privacy.noise_multiplier=0", "privacy.clip_norm=1e30"],
    ],
)
def test_replies_are_summed_in_partition_order(overrides):
    """2^60 + 1 - 2^60 is 0 in float64 in partition order (0, 1, 2), but 1 if the 1 comes last: any other
    summation order shows up in the result, unlike with ordinary values where float32 rounding hides it."""
    strategy = build(*overrides, *SMALL_POP)
    values = {0: 2.0**60, 1: 1.0, 2: -(2.0**60)}

    def update(value: float) -> list[np.ndarray]:
        u = zeros(SMALL_SHAPES)
        u[0][0] = value
        return u

    replies = {pid: reply(pid, update(v)) for pid, v in values.items()}
    for order in itertools.permutations(values):
        plan = prime(strategy, zeros(SMALL_SHAPES), sampled=3)
        outcome = strategy.aggregator.aggregate(plan, [replies[pid] for pid in order])
        assert outcome.new_weights[0][0] == 0.0, order


def test_same_seed_gives_identical_noise_and_other_seeds_or_rounds_do_not():
    def noisy(seed: int, server_round: int) -> np.ndarray:
        strategy = build("strategy=dp_fedavg", *SMALL_POP, f"seed={seed}")
        plan = prime(strategy, zeros(SMALL_SHAPES), sampled=1, server_round=server_round)
        return flat(strategy.aggregator.aggregate(plan, [reply(0, zeros(SMALL_SHAPES))]).new_weights)

    first = noisy(0, 1)
    assert np.array_equal(first, noisy(0, 1))
    assert np.std(first) > 0
    assert not np.array_equal(first, noisy(1, 1))
    assert not np.array_equal(first, noisy(0, 2))


def test_secure_noise_auto_follows_the_grid():
    from flwr.superlink.grid import InMemoryGrid

    class DeploymentGrid(FakeGrid):  # anything but Flower's in-memory (simulation) grid
        pass

    class SimulationGrid(FakeGrid, InMemoryGrid):
        def __init__(self) -> None:
            FakeGrid.__init__(self)

    weights = ArrayRecord(zeros(SMALL_SHAPES))
    deployed = build("strategy=dp_fedavg", *SMALL_POP, "privacy.secure_noise=auto")
    deployed.start(DeploymentGrid(), weights, num_rounds=1)
    assert deployed.randomness.secure and deployed.randomness.source() == "os-csprng"
    simulated = build("strategy=dp_fedavg", *SMALL_POP, "privacy.secure_noise=auto")
    simulated.start(SimulationGrid(), weights, num_rounds=1)
    assert not simulated.randomness.secure and simulated.randomness.source().startswith("seeded")
    forced = build("strategy=dp_fedavg", *SMALL_POP, "privacy.secure_noise=false")
    forced.start(DeploymentGrid(), weights, num_rounds=1)
    assert not forced.randomness.secure


def test_secure_noise_is_not_reproducible():
    strategy = build("strategy=dp_fedavg", *SMALL_POP, "privacy.secure_noise=true")
    assert strategy.randomness.source() == "os-csprng"
    plan = prime(strategy, zeros(SMALL_SHAPES), sampled=1)
    a = flat(strategy.aggregator.aggregate(plan, [reply(0, zeros(SMALL_SHAPES))]).new_weights)
    b = flat(strategy.aggregator.aggregate(plan, [reply(0, zeros(SMALL_SHAPES))]).new_weights)
    assert not np.array_equal(a, b)
    assert a.std() == pytest.approx(0.95 * 0.2 / 10, rel=0.15)  # 1100 coordinates


# ----- 5. non-private references and the reported guarantee --------------------------------------------------


def test_fedavg_is_the_plain_mean_without_clipping_or_noise():
    strategy = build("strategy=fedavg", *SMALL_POP)
    assert isinstance(strategy, FederatedAveraging) and strategy.privacy is None and strategy.account is None
    old = random_update(SMALL_SHAPES, 0.1, seed=0)
    big = with_norm(SMALL_SHAPES, 1e3, seed=1)
    small = with_norm(SMALL_SHAPES, 0.1, seed=2)
    plan = prime(strategy, old, sampled=3)
    outcome = strategy.aggregator.aggregate(plan, [reply(1, big), reply(2, small), error_reply(3)])
    # Denominator = the 2 aggregated updates, not m = 10 nor the 3 sampled; the big update is not clipped.
    expected = [(b.astype(np.float64) + s) / 2 for b, s in zip(big, small, strict=True)]
    # float32 rounding of the (large) average: compare relative to its size.
    for got, want in zip(delta(outcome.new_weights, old), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert outcome.stats["reclipped"] == 0
    assert outcome.stats["aggregated"] == 2
    # For references the statistics still say what clipping at C would have done.
    assert outcome.stats["fraction_clipped"] == 0.5
    # No noise: another seed and another round give the same model.
    other = build("strategy=fedavg", *SMALL_POP, "seed=9")
    plan = prime(other, old, sampled=3, server_round=5)
    again = other.aggregator.aggregate(plan, [reply(2, small), reply(1, big)])
    for a, b in zip(outcome.new_weights, again.new_weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_nonprivate_guarantee():
    for name, cls in (("fedavg", FederatedAveraging), ("fedsam", FedSAM)):
        strategy = build(f"strategy={name}")
        assert isinstance(strategy, cls)
        assert strategy.account is None
        claim = strategy.dp_guarantee()
        assert "non-private" in claim["dp_guarantee"] and "noise_source" not in claim
        assert strategy.epsilon() == math.inf


@pytest.mark.parametrize(("name", "cls"), [("dp_fedavg", DPFedAvg), ("dp_fedsam", DPFedSAM)])
def test_dp_guarantee_reports_accountant_epsilon_and_delta(name, cls):
    strategy = build(f"strategy={name}", "dataset.num_clients=200")
    assert isinstance(strategy, cls)
    g = strategy.dp_guarantee()
    assert g["accountant"] == "rdp"
    assert g["delta"] == pytest.approx(1 / 200)
    assert g["epsilon"] == 0.0
    assert g["rounds_accounted"] == 0
    assert g["noise_multiplier"] == 0.95 and g["clip_norm"] == 0.2 and g["sample_rate"] == 0.1
    assert g["expected_clients"] == pytest.approx(20.0)
    assert g["sampling_event"] == "poisson" and g["placement"] == "server"
    strategy.ledger.step(0.95, 0.1, 5)
    g = strategy.dp_guarantee()
    assert g["epsilon"] == pytest.approx(compute_epsilon(0.95, 0.1, 5, 1 / 200))
    assert g["rounds_accounted"] == 5
    assert f"{g['epsilon']:.4g}" in g["dp_guarantee"]


# ----- configure_train --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "optimizer", "clip", "add_noise", "sigma"),
    [
        (["strategy=dp_fedavg"], "sgd", 0.2, False, 0.95),
        (["strategy=dp_fedsam"], "sam", 0.2, False, 0.95),
        (["strategy=dp_fedavg", "privacy.sampling=fixed", "privacy.placement=client"], "sgd", 0.2, True, 0.95),
        (["strategy=fedavg"], "sgd", 0.0, False, 0.0),
        (["strategy=fedsam"], "sam", 0.0, False, 0.0),
    ],
)
def test_configure_train_sends_sampled_clients_their_instructions(overrides, optimizer, clip, add_noise, sigma):
    strategy = build(*overrides, *SMALL_POP)
    grid = FakeGrid()
    strategy.population.connect(grid, timeout=1)
    weights = random_update(SMALL_SHAPES, 1.0, seed=0)
    messages = list(strategy.configure_train(3, ArrayRecord(weights), ConfigRecord(), grid))
    sampled = strategy.sample_clients(3)
    assert [partition_of(m) for m in messages] == sampled.tolist()
    plan = strategy.plan_round(3, ArrayRecord(weights), ConfigRecord())  # what configure_train returned, as a plan
    assert plan.sampled == len(messages) == len(sampled) and len(plan.messages) == len(messages)
    assert [m.metadata.dst_node_id for m in messages] == [(1, 2)[i % 2] for i in range(len(messages))]
    for m in messages:
        assert m.metadata.message_type == MessageType.TRAIN
        cfg = m.content["config"]
        assert cfg["training.optimizer"] == optimizer
        assert cfg["clip_norm"] == clip
        assert cfg["add_noise"] is add_noise
        assert cfg["noise_multiplier"] == sigma
        assert cfg["expected_clients"] == pytest.approx(10.0)
        assert cfg["server_round"] == 3
        for sent, w in zip(m.content["arrays"].to_numpy_ndarrays(), weights, strict=True):
            np.testing.assert_array_equal(sent, w)
    assert plan.shapes == SMALL_SHAPES


# ----- 6. accounting and the budget guard through start() ---------------------------------------------------


FIELDS = ("round", "epsilon", "sampled", "aggregated", "norm_mean", "alpha_mean", "fraction_clipped", "wall_time_s")


def test_start_accounts_every_round_and_writes_metrics(tmp_path):
    writer = MetricsWriter(tmp_path, num_rounds=3, progress=False)
    strategy = build("strategy=dp_fedavg", *SMALL_POP, metrics=writer)
    sigma, q, delta_ = 0.95, 0.2, 1 / 50
    grid = FakeGrid()
    result = strategy.start(grid, ArrayRecord(zeros(SMALL_SHAPES)), num_rounds=3)
    writer.close()
    assert strategy.stop_reason is None
    assert strategy.ledger.rounds == 3
    assert strategy.epsilon() == pytest.approx(compute_epsilon(sigma, q, 3, delta_), rel=1e-9)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert len(result.arrays.to_numpy_ndarrays()) == 2

    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3
    records = [json.loads(line) for line in lines]
    assert records == read_metrics(tmp_path / "metrics.jsonl")
    for t, record in enumerate(records, start=1):
        assert set(FIELDS) <= set(record)
        assert record["round"] == t
        assert record["epsilon"] == pytest.approx(compute_epsilon(sigma, q, t, delta_), rel=1e-9)
        assert record["sampled"] == len(grid.sent[t - 1])
        assert record["aggregated"] == record["sampled"]
        if record["sampled"]:
            assert record["norm_mean"] == 0.0
            assert record["alpha_mean"] == 1.0
            assert record["fraction_clipped"] == 0.0
        assert record["wall_time_s"] >= 0.0
    assert records[0]["epsilon"] < records[1]["epsilon"] < records[2]["epsilon"]


def test_rounds_are_accounted_even_when_no_client_answers():
    strategy = build("strategy=dp_fedavg", *SMALL_POP)
    grid = FakeGrid(mode="errors")
    strategy.start(grid, ArrayRecord(zeros(SMALL_SHAPES)), num_rounds=2)
    assert strategy.ledger.rounds == 2
    assert strategy.epsilon() == pytest.approx(compute_epsilon(0.95, 0.2, 2, 1 / 50), rel=1e-9)


def test_budget_guard_stops_before_the_round_that_would_exceed(tmp_path):
    sigma, q, delta_ = 0.95, 0.2, 1 / 50
    eps3, eps4 = compute_epsilon(sigma, q, 3, delta_), compute_epsilon(sigma, q, 4, delta_)
    max_eps = 0.5 * (eps3 + eps4)
    writer = MetricsWriter(tmp_path, num_rounds=10, progress=False)
    strategy = build("strategy=dp_fedavg", *SMALL_POP, f"privacy.max_epsilon={max_eps!r}", metrics=writer)
    grid = FakeGrid()
    result = strategy.start(grid, ArrayRecord(zeros(SMALL_SHAPES)), num_rounds=10)
    writer.close()
    assert strategy.ledger.rounds == 3
    assert len(grid.sent) == 3
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert strategy.stop_reason is not None and "budget guard" in strategy.stop_reason
    assert strategy.epsilon() == pytest.approx(eps3, rel=1e-9)
    assert strategy.epsilon() <= max_eps
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["round"] for r in records] == [1, 2, 3]
    assert all(r["epsilon"] <= max_eps for r in records)


def test_budget_guard_with_no_noise_stops_before_the_first_round():
    strategy = build("strategy=dp_fedavg", *SMALL_POP, "privacy.noise_multiplier=0", "privacy.max_epsilon=10")
    grid = FakeGrid()
    strategy.start(grid, ArrayRecord(zeros(SMALL_SHAPES)), num_rounds=5)
    assert grid.sent == []
    assert strategy.ledger.rounds == 0
    assert "budget guard" in strategy.stop_reason


# ----- 7. target-ε calibration --------------------------------------------------------------------------------


def test_target_epsilon_calibrates_the_noise_multiplier():
    strategy = build("strategy=dp_fedavg", "privacy.target_epsilon=4", "num_rounds=50")
    sigma = strategy.noise_multiplier
    assert sigma != 0.95
    eps = compute_epsilon(sigma, 0.1, 50, 1 / 500)
    assert 0.99 * 4 <= eps <= 4
    assert strategy.dp_guarantee()["noise_multiplier"] == sigma
    # The calibrated σ is what the clients are told and what is accounted.
    strategy.ledger.step(sigma, 0.1, 50)
    assert strategy.epsilon() == pytest.approx(eps, rel=1e-9)


# ----- 8. checkpoint and resume -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dp_fedavg", "noisy_fedavg", "fed_smp_topk"])
def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(tmp_path, name):
    from fl_app.checkpoint import load_checkpoint

    overrides = [f"strategy={name}", *SMALL_POP, "checkpoint_every=2"]
    if name == "fed_smp_topk":
        overrides.append("strategy.mask_source=global")  # its mask depends on the previous global model
    initial = ArrayRecord(random_update(SMALL_SHAPES, 0.1, seed=0))

    full = build(*overrides)
    reference = full.start(FakeGrid(), initial, num_rounds=4).arrays.to_numpy_ndarrays()

    first = build(*overrides, checkpoint_dir=tmp_path)
    first.start(FakeGrid(), initial, num_rounds=2)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.round == 2

    resumed = build(*overrides, resume_from=ckpt)
    result = resumed.start(FakeGrid(), initial, num_rounds=4)
    for a, b in zip(result.arrays.to_numpy_ndarrays(), reference, strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed.epsilon() == full.epsilon()
    assert sorted(result.train_metrics_clientapp) == [3, 4]  # only the missing rounds ran


@pytest.mark.parametrize(
    ("overrides", "keeps_previous"),
    [
        (("strategy=dp_fedavg",), False),
        (("strategy=fed_smp_topk", "strategy.mask_source=global"), True),
        (("strategy=fed_smp_topk", "strategy.mask_source=local"), False),
    ],
)
def test_planning_changes_nothing_and_only_a_mask_that_needs_it_checkpoints_the_previous_global(
    overrides, keeps_previous
):
    strategy = build(*overrides, *SMALL_POP, "privacy.sampling=fixed")
    strategy.population.connect(FakeGrid(), timeout=1)
    weights = [ArrayRecord(random_update(SMALL_SHAPES, 0.1, seed=s)) for s in range(3)]
    plan = strategy.plan_round(1, weights[0], ConfigRecord())
    end_round(strategy, plan)  # the round's end: w_1 becomes the previous global
    before = strategy.state()
    strategy.plan_round(2, weights[1], ConfigRecord())  # the checkpoint of round 1 may be written after this
    after = strategy.state()
    assert before[0] == after[0] and before[1].keys() == after[1].keys()
    for name, arrays in before[1].items():
        assert all(np.array_equal(a, b) for a, b in zip(arrays, after[1][name], strict=True))
    assert ("previous_global" in after[1]) is keeps_previous
    if keeps_previous:
        previous = zip(after[1]["previous_global"], weights[0].to_numpy_ndarrays(), strict=True)
        assert all(np.array_equal(a, b) for a, b in previous)


def test_round_zero_checkpoint_is_written_before_the_first_round(tmp_path):
    from fl_app.checkpoint import load_checkpoint

    strategy = build("strategy=dp_fedavg", *SMALL_POP, "checkpoint_every=5", checkpoint_dir=tmp_path)
    weights = random_update(SMALL_SHAPES, 0.1, seed=0)

    class StopAfterSampling(FakeGrid):
        def send_and_receive(self, messages, timeout=None):
            raise KeyboardInterrupt  # the server dies during round 1

    with pytest.raises(KeyboardInterrupt):
        strategy.start(StopAfterSampling(), ArrayRecord(weights), num_rounds=3)
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.round == 0
    for a, b in zip(ckpt.weights, weights, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not list(tmp_path.glob(".*.tmp"))  # no temp file left behind


# ----- the server's noise drawn ahead (fl_app/privacy/prefetch.py) -------------------------------------------------


@pytest.mark.parametrize("secure", [False, True])
def test_noise_drawn_ahead_releases_the_model_drawn_on_demand(secure: bool):
    overrides = ["strategy=dp_fedavg", *SMALL_POP, "privacy.noise_multiplier=1.0"]
    if secure:
        overrides.append("privacy.secure_noise=true")
    old = random_update(SMALL_SHAPES, 0.1, seed=0)
    updates = {3: with_norm(SMALL_SHAPES, 0.1, seed=1), 7: with_norm(SMALL_SHAPES, 0.15, seed=2)}
    released = []
    for ahead in (False, True):
        strategy = build(*overrides)
        plan = prime(strategy, old, sampled=2)
        if ahead:
            strategy.aggregator.draw_noise_ahead(plan)
            assert plan.server_noise is not None
            strategy.aggregator.draw_noise_ahead(plan)  # idempotent: the same draws, started once
        released.append(strategy.aggregator.aggregate(plan, [reply(pid, u) for pid, u in updates.items()]).new_weights)
    if secure:  # fresh CSPRNG noise each time: the same law, not the same values
        assert all(not np.array_equal(a, b) for a, b in zip(*released, strict=True))
    else:
        assert all(np.array_equal(a, b) for a, b in zip(*released, strict=True))  # bit for bit


@pytest.mark.parametrize(
    "overrides",
    [("strategy=dp_fedavg", "privacy.placement=client", "privacy.sampling=fixed"), ("strategy=fedavg",)],
    ids=["client", "non-dp"],
)
def test_no_noise_is_drawn_ahead_where_the_server_adds_none_for_a_full_round(overrides: tuple[str, ...]):
    strategy = build(*overrides, *SMALL_POP)
    plan = prime(strategy, random_update(SMALL_SHAPES, 0.1, seed=0), sampled=2)
    strategy.aggregator.draw_noise_ahead(plan)
    assert plan.server_noise is None
