"""The server side of cohort mode (docs/running.md): planning cohorts, and checking and aggregating cohort replies.

Cohort replies carry the float64 sum of the accepted clients' updates plus per-client statistics and fates
(clients/cohort.py). Nothing in them is trusted: each must account for exactly the cohort its message carried, once;
its sum must have the model's shapes, be finite and (server placement) lie within k·C.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ArrayRecord, Error, Message, MetricRecord, RecordDict

from fl_app.data.partition import get_partition
from fl_app.instructions import LocalTrainingConfig, NoisyLocalConfig
from fl_app.privacy import mechanisms as mech
from strategies.cohorts import STEP_COST_SAMPLES, balance_cohorts, cohort_count, local_work
from strategies.rounds import RoundPlan
from tests.helpers import FakeGrid, build, prime, push, reply, with_norm, zeros

SHAPES = [(3, 4), (5,)]
GLOBAL = zeros(SHAPES)


def _cohort_strategy(*overrides: str, nodes: int = 2):
    strategy = build(*overrides)
    strategy.resolve_settings(simulation=True)
    strategy.population.connect(FakeGrid(nodes=nodes), timeout=1)
    return strategy


def _send(strategy, sampled: list[int]) -> RoundPlan:
    """The plan of round 1 for ``sampled`` (cohort messages), with message ids as a grid assigns them on push."""
    plan = strategy.plan_round(1, ArrayRecord(GLOBAL), sampled=sampled)
    assert plan.cohort_mode
    push(plan.messages)
    return plan


def _reply(to: Message, updates: dict[int, list[np.ndarray]], **rejected: list[int]) -> Message:
    ids = sorted(updates)
    shapes = [u.shape for u in next(iter(updates.values()))] if updates else SHAPES
    total = mech.uniform_sum([updates[i] for i in ids], shapes)
    metrics = {
        "cohort_ids": ids,
        "pre_clip_norm": [mech.global_l2_norm(updates[i]) for i in ids],
        "train_loss": [0.1] * len(ids),
        "train_accuracy": [0.5] * len(ids),
        "num_steps": [3.0] * len(ids),
        "failed_ids": rejected.get("failed", []),
        "nonfinite_ids": rejected.get("nonfinite", []),
        "shape_ids": rejected.get("shape", []),
        "reclipped": 0,
        "num_examples": 10,
    }
    return Message(RecordDict({"arrays": ArrayRecord(total), "metrics": MetricRecord(metrics)}), reply_to=to)


def _cohorts(messages: list[Message]) -> list[list[int]]:
    return [[int(p) for p in m.content["config"]["partition_ids"]] for m in messages]


def test_balance_cohorts_partitions_the_sample_and_balances_the_work():
    ids = list(range(100, 120))
    work = [(7 * i) % 13 + 1 for i in range(20)]
    cohorts = balance_cohorts(ids, work, 3)
    assert sorted(p for c in cohorts for p in c) == ids and all(c == sorted(c) for c in cohorts)
    loads = [sum(work[ids.index(p)] for p in c) for c in cohorts]
    # Longest-processing-time-first: no cohort exceeds the mean load by more than the largest single client.
    assert max(loads) <= sum(work) / 3 + max(work)
    assert balance_cohorts(ids, work, 3) == cohorts  # deterministic
    assert len(balance_cohorts([4, 2], [0, 0], 5)) == 2  # never an empty cohort, even at zero work


def test_local_work_counts_the_samples_of_the_steps_taken_and_a_fixed_cost_a_step():
    config = build("dataset.num_clients=50").config
    d = config.dataset
    sizes = {
        pid: len(get_partition(d.name, d.data_dir, d.partition, d.num_clients, d.alpha, config.seed, pid,
                               num_samples=d.max_train_samples or None))
        for pid in range(50)
    }  # fmt: skip
    pid = next(p for p, n in sizes.items() if n > 64 and n % 32)  # a client with a partial last batch
    n, steps = sizes[pid], math.ceil(sizes[pid] / 32)
    one_epoch = LocalTrainingConfig(epochs=1, batch_size=32, lr=0.1)
    assert local_work(config, one_epoch, pid) == n + STEP_COST_SAMPLES * steps
    two_epochs = LocalTrainingConfig(epochs=2, batch_size=32, lr=0.1)
    assert local_work(config, two_epochs, pid) == 2 * n + STEP_COST_SAMPLES * 2 * steps
    # Cut short inside the second epoch: one whole epoch, then full batches.
    capped = LocalTrainingConfig(epochs=2, batch_size=32, lr=0.1, max_steps=steps + 2)
    assert local_work(config, capped, pid) == n + 2 * 32 + STEP_COST_SAMPLES * (steps + 2)
    noisy = NoisyLocalConfig(steps=10, batch_size=16, lr=0.1, schedule="constant", grad_clip=1.0)
    assert local_work(config, noisy, pid) == 10 * (16 + STEP_COST_SAMPLES)


def _count(strategy, sampled: int) -> int:
    return cohort_count(strategy.cohort_size, sampled, strategy.population.num_nodes)


def test_cohort_count_follows_the_config_and_the_engine():
    assert _count(_cohort_strategy("simulation.cohort_size=auto", nodes=3), 10) == 3
    assert _count(_cohort_strategy("simulation.cohort_size=auto", nodes=3), 2) == 2
    assert _count(_cohort_strategy("simulation.cohort_size=4"), 10) == 3
    assert _count(_cohort_strategy("simulation.cohort_size=1"), 10) == 0
    deployed = build("simulation.cohort_size=auto")
    deployed.resolve_settings(simulation=False)  # a real SuperLink: every node is a client's machine
    deployed.population.connect(FakeGrid(nodes=3), timeout=1)
    assert _count(deployed, 10) == 0


def test_cohort_messages_carry_every_sampled_client_once_with_its_fault():
    strategy = _cohort_strategy("dataset.num_clients=50", "fault_injection.nan_partitions=[7]", nodes=3)
    sampled = [1, 4, 7, 9, 20, 33, 41]
    plan = _send(strategy, sampled)
    messages = plan.messages
    assert len(messages) == 3
    cohorts = _cohorts(messages)
    assert sorted(p for c in cohorts for p in c) == sampled
    for message, cohort in zip(messages, cohorts, strict=True):
        faults = list(message.content["config"]["faults"])
        assert faults == ["nan" if p == 7 else "" for p in cohort]
    work = {p: local_work(strategy.config, strategy.local_training(), p) for p in sampled}
    loads = [sum(work[p] for p in c) for c in cohorts]
    assert max(loads) <= sum(work.values()) / 3 + max(work.values())


@pytest.mark.parametrize("name", ["dp_fedavg", "fedavg"])
def test_cohort_sums_aggregate_like_the_same_updates_sent_one_by_one(name):
    overrides = (f"strategy={name}", "dataset.num_clients=50", "privacy.sample_rate=0.1")
    sampled = [1, 4, 7, 9, 20]  # updates within C, as the workers send them (each client clipped)
    updates = {p: with_norm(SHAPES, 0.03 * (i + 1), seed=p) for i, p in enumerate(sampled)}
    cohort = _cohort_strategy(*overrides)
    plan = _send(cohort, sampled)
    messages = plan.messages
    replies = [_reply(m, {p: updates[p] for p in c}) for m, c in zip(messages, _cohorts(messages), strict=True)]
    got = cohort.aggregator.aggregate(plan, replies)

    single = build(*overrides)
    plan = prime(single, GLOBAL, sampled=len(sampled), partitions=sampled)
    want = single.aggregator.aggregate(plan, [reply(p, updates[p]) for p in sampled])
    for a, b in zip(got.new_weights, want.new_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)
    assert got.stats["aggregated"] == 5 and got.stats["failed"] == 0
    assert got.stats["client_norms"] == pytest.approx(want.stats["client_norms"])


def test_a_cohort_sum_beyond_k_times_c_is_reclipped_by_the_server():
    strategy = _cohort_strategy("strategy=dp_fedavg", "dataset.num_clients=50", "privacy.noise_multiplier=0", nodes=1)
    c = strategy.config.privacy.clip_norm
    sampled = [3, 8]
    plan = _send(strategy, sampled)
    messages = plan.messages
    huge = {p: with_norm(SHAPES, 100 * c, seed=p) for p in sampled}  # a worker that did not clip
    outcome = strategy.aggregator.aggregate(plan, [_reply(messages[0], huge)])
    m = strategy.expected_clients
    assert mech.global_l2_norm(outcome.new_weights) <= 2 * c / m * (1 + 1e-5)
    assert outcome.stats["reclipped"] == 2 and outcome.stats["aggregated"] == 2


def _hostile(messages, kind: str) -> list[Message]:
    good = {p: with_norm(SHAPES, 0.01, seed=p) for p in _cohorts(messages)[0]}
    if kind == "wrong_ids":
        return [_reply(messages[0], {p + 1000: u for p, u in good.items()})]
    if kind == "missing_id":
        return [_reply(messages[0], dict(list(good.items())[1:]))]
    if kind == "nonfinite_sum":
        tampered = _reply(messages[0], good)
        tampered.content["arrays"] = ArrayRecord([np.full(s, np.inf) for s in SHAPES])
        return [tampered]
    if kind == "wrong_shape_sum":
        return [_reply(messages[0], {p: [np.zeros((2, 2), np.float32), np.zeros(5, np.float32)] for p in good})]
    if kind == "duplicate":
        return [_reply(messages[0], good), _reply(messages[0], good)]
    if kind == "unknown_message":
        stranger = Message(RecordDict({}), dst_node_id=1, message_type="train")
        stranger.metadata.__dict__["_message_id"] = "not-sent"
        return [_reply(stranger, good)]
    if kind == "error":
        return [Message(Error(code=1, reason="worker died"), reply_to=messages[0])]
    raise AssertionError(kind)


@pytest.mark.parametrize(
    ("kind", "counter", "rejected"),
    [
        ("wrong_ids", "rejected_malformed", 3),
        ("missing_id", "rejected_malformed", 3),
        ("nonfinite_sum", "rejected_nonfinite", 3),
        ("wrong_shape_sum", "rejected_shape", 3),
        ("duplicate", "rejected_malformed", 1),
        ("unknown_message", "rejected_malformed", 1),
        ("error", "failed", 3),
    ],
)
def test_a_hostile_or_broken_cohort_reply_is_rejected_and_counted(kind, counter, rejected):
    strategy = _cohort_strategy("strategy=dp_fedavg", "dataset.num_clients=50", nodes=1)
    plan = _send(strategy, [2, 5, 11])
    messages = plan.messages
    outcome = strategy.aggregator.aggregate(plan, _hostile(messages, kind))
    assert outcome.stats[counter] == rejected
    assert outcome.stats["aggregated"] == (3 if kind == "duplicate" else 0)
    assert all(np.isfinite(w).all() for w in outcome.new_weights)


def test_clients_the_worker_rejected_are_counted_and_the_rest_aggregated():
    strategy = _cohort_strategy("strategy=dp_fedavg", "dataset.num_clients=50", nodes=1)
    plan = _send(strategy, [2, 5, 11, 13])
    messages = plan.messages
    good = {5: with_norm(SHAPES, 0.01, seed=5)}
    outcome = strategy.aggregator.aggregate(plan, [_reply(messages[0], good, failed=[2], nonfinite=[11], shape=[13])])
    s = outcome.stats
    assert (s["aggregated"], s["failed"], s["rejected_nonfinite"], s["rejected_shape"]) == (1, 1, 1, 1)
    assert s["received"] == 4 and s["client_norms"] == pytest.approx([0.01])


def test_a_missing_cohort_reply_counts_all_its_clients_as_failed():
    strategy = _cohort_strategy("strategy=dp_fedavg", "dataset.num_clients=50", nodes=2)
    plan = _send(strategy, [2, 5, 11, 13])
    messages = plan.messages
    first = _cohorts(messages)[0]
    outcome = strategy.aggregator.aggregate(
        plan, [_reply(messages[0], {p: with_norm(SHAPES, 0.01, seed=p) for p in first})]
    )
    assert outcome.stats["aggregated"] == len(first)
    assert outcome.stats["failed"] == 4 - len(first)
    assert math.isfinite(outcome.stats["norm_mean"])
