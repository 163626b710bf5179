"""Replies of per-partition models (fl_app/partition_models.py): a cohort message answered with one Flower-convention
trained model per partition, as clients.numpy_mod's mod answers it for a ``NumPyClient``.

The server screens each partition's model as the Flower-convention reply to a message of that partition alone
(strategies/screening.py: Δ = trained − global computed by the server, re-clipped to C under server placement, one
partition at a time), so a cohort's aggregate is, bit for bit, that of one message per partition. Entries for a
partition its message did not carry, or for one already answered, are rejected, all of a reply's together, like one
reply bound to no message (malformed, not received); a partition without a result, or whose client failed, is counted
as failed; under client placement every partition's model is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fl_app.partition_models import PARTITION_MODELS_KEY, PartitionModelsReply, is_partition_models_reply, model_key
from fl_app.privacy import mechanisms as mech
from strategies.base import FederatedStrategy
from strategies.rounds import RoundOutcome, RoundPlan
from strategies.screening import screen_each
from tests.helpers import SCREENING_C, SCREENING_M, SCREENING_POPULATION, SCREENING_SHAPES, build, prime, with_norm

SHAPES, POP, C, M = SCREENING_SHAPES, SCREENING_POPULATION, SCREENING_C, SCREENING_M
COHORT = [2, 5, 7]
COUNTERS = ("sampled", "received", "aggregated", "failed", "rejected_malformed", "rejected_shape", "reclipped")


def _global() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]


def _trained(old: list[np.ndarray], update: list[np.ndarray]) -> list[np.ndarray]:
    """The model a client trained: global + update, in float32 as a client sends it."""
    return [(o + u).astype(np.float32) for o, u in zip(old, update, strict=True)]


def _answer(trained: list[np.ndarray], loss: float = 0.5) -> RecordDict:
    """One partition's reply in Flower's convention."""
    return RecordDict(
        {"arrays": ArrayRecord(trained), "metrics": MetricRecord({"num-examples": 12, "train_loss": loss})}
    )


def _cohort_plan(strategy: FederatedStrategy, old: list[np.ndarray], ids: list[int]) -> RoundPlan:
    """A round whose one train message carries the cohort ``ids`` (sent to node 1, message id ``cohort``)."""
    base = prime(strategy, old, sampled=len(ids), partitions=[])
    message = Message(
        RecordDict({"config": ConfigRecord({"partition_ids": ids, "faults": [""] * len(ids)})}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )
    message.metadata.__dict__["_message_id"] = "cohort"  # what Flower's grids do on push
    return RoundPlan(base.server_round, base.global_weights, base.instructions, len(ids), sent=[(message, ids)],
                     mask=base.mask)  # fmt: skip


def _reply(plan: RoundPlan, answers: list[tuple[int, RecordDict]], failures: Any = ()) -> Message:
    content = PartitionModelsReply(answers=answers, failures=list(failures)).to_record()
    return Message(content, reply_to=plan.messages[0])


def _taken(strategy: FederatedStrategy, plan: RoundPlan, replies: list[Message]) -> tuple[RoundOutcome, list]:
    """The round's outcome and every rejection it reported, (kind, reason)."""
    reasons: list[tuple[str, str]] = []
    taken = strategy.aggregator.receiver(plan)
    taken.reject = lambda server_round, kind, reason: reasons.append((kind, reason))
    taken.take(replies)
    return strategy.aggregator.aggregate_taken(taken), reasons


def _counts(stats: dict[str, Any]) -> dict[str, int]:
    return {key: int(stats[key]) for key in COUNTERS}


def test_the_record_layout_round_trips() -> None:
    old = _global()
    content = PartitionModelsReply(answers=[(3, _answer(old)), (1, _answer(old))], failures=[(4, "boom")]).to_record()
    assert is_partition_models_reply(content)
    assert sorted(content.keys()) == ["arrays.1", "arrays.3", "metrics.1", "metrics.3", PARTITION_MODELS_KEY]
    assert dict(content[PARTITION_MODELS_KEY]) == {"partition_ids": [3, 1], "failed_ids": [4], "failures": ["boom"]}
    parsed = PartitionModelsReply.from_record(content)
    assert [pid for pid, _ in parsed.answers] == [3, 1] and parsed.failures == [(4, "boom")]
    assert all(sorted(answer.keys()) == ["arrays", "metrics"] for _, answer in parsed.answers)


@pytest.mark.parametrize("norms", [(0.05, 0.1, 0.15), (50 * C, 0.1, 3 * C)], ids=["within-c", "beyond-c"])
def test_a_cohorts_models_aggregate_bit_for_bit_as_one_message_per_partition(norms: tuple[float, ...]) -> None:
    old = _global()
    trained = [_trained(old, with_norm(SHAPES, norm, seed=i)) for i, norm in enumerate(norms)]
    answers = [(pid, _answer(t, loss=0.1 * i)) for i, (pid, t) in enumerate(zip(COHORT, trained, strict=True))]

    cohort_strategy = build(*POP)
    cohort_plan = _cohort_plan(cohort_strategy, old, COHORT)
    cohort, reasons = _taken(cohort_strategy, cohort_plan, [_reply(cohort_plan, answers[::-1])])
    assert reasons == []

    single_strategy = build(*POP)
    single_plan = prime(single_strategy, old, sampled=len(COHORT), partitions=COHORT)
    messages = single_plan.messages
    replies = [Message(answer, reply_to=message) for message, (_, answer) in zip(messages, answers, strict=True)]
    single, _ = _taken(single_strategy, single_plan, replies)

    assert _counts(cohort.stats) == _counts(single.stats)
    assert cohort.stats["aggregated"] == len(COHORT) and cohort.stats["failed"] == 0
    assert cohort.stats["reclipped"] == sum(norm > C for norm in norms)
    assert all(np.array_equal(a, b) for a, b in zip(cohort.new_weights, single.new_weights, strict=True))
    assert cohort.stats["client_norms"] == single.stats["client_norms"]
    assert cohort.stats["client_norms"] == [pytest.approx(norm, rel=1e-5) for norm in norms]


def test_each_partition_is_clipped_to_c_on_its_own_not_the_cohorts_sum_to_kc() -> None:
    strategy = build(*POP)
    old = _global()
    big, small = with_norm(SHAPES, 50 * C, seed=1), with_norm(SHAPES, 0.1, seed=2)
    plan = _cohort_plan(strategy, old, [0, 1])
    trained = [_trained(old, big), _trained(old, small)]
    outcome, _ = _taken(strategy, plan, [_reply(plan, [(0, _answer(trained[0])), (1, _answer(trained[1]))])])
    assert outcome.stats["aggregated"] == 2 and outcome.stats["reclipped"] == 1
    deltas = [[np.subtract(t, o, dtype=np.float64) for t, o in zip(tr, old, strict=True)] for tr in trained]
    clipped_big = [d * (C / mech.global_l2_norm(deltas[0])) for d in deltas[0]]
    moved = [np.subtract(n, o, dtype=np.float64) for n, o in zip(outcome.new_weights, old, strict=True)]
    for move, b, s in zip(moved, clipped_big, deltas[1], strict=True):
        np.testing.assert_allclose(move, (b + s) / M, rtol=1e-5, atol=1e-7)
    # The partition beyond C moved the model by C/m exactly; clipping the sum to 2C instead would have let it move
    # the model by far more than C/m.
    assert mech.global_l2_norm(moved) <= (C + 0.1) / M * (1 + 1e-6)
    summed = [a + b for a, b in zip(*deltas, strict=True)]
    assert mech.global_l2_norm(summed) > 2 * C


def test_a_partition_not_in_the_message_or_answered_twice_is_rejected_with_a_reason() -> None:
    """However many such entries a reply lists, they count as one extra reply: a reply cannot inflate the counts."""
    strategy = build(*POP)
    old = _global()
    plan = _cohort_plan(strategy, old, COHORT)
    good = [_trained(old, with_norm(SHAPES, 0.1, seed=i)) for i in range(3)]
    # The layout holds one model per partition (``arrays.2``): partition 2 named twice names that model twice.
    answers = [(2, _answer(good[0])), (9, _answer(good[2])), (5, _answer(good[1])), (2, _answer(good[0]))]
    outcome, reasons = _taken(strategy, plan, [_reply(plan, answers, failures=[(5, "again")])])
    # 2 and 5 accepted (their first entries); 9 (not carried), the second 2 and the failure of 5 (answered already)
    # are rejected together, like one reply bound to no message: malformed once, not received; 7, without a result,
    # failed.
    assert _counts(outcome.stats) == {"sampled": 3, "received": 3, "aggregated": 2, "failed": 1,
                                      "rejected_malformed": 1, "rejected_shape": 0, "reclipped": 0}  # fmt: skip
    assert reasons == [
        ("malformed", "per-partition models reply: 3 entries rejected, ['partition 9 not one its message carried', "
                      "'partition 2 answered twice', 'partition 5 answered twice']"),
        ("failed", "per-partition models reply has no result for partition 7"),
    ]  # fmt: skip
    updates = [[np.subtract(t, o, dtype=np.float64) for t, o in zip(g, old, strict=True)] for g in good[:2]]
    expected = [o + (a + b) / M for o, a, b in zip(old, *updates, strict=True)]
    for new, want in zip(outcome.new_weights, expected, strict=True):
        np.testing.assert_allclose(new, want, rtol=1e-6, atol=1e-7)


def test_a_failed_partition_or_a_bad_model_counts_as_that_partitions_own_rejection() -> None:
    strategy = build(*POP)
    old = _global()
    plan = _cohort_plan(strategy, old, COHORT)
    good = _trained(old, with_norm(SHAPES, 0.1, seed=0))
    wrong_shape = [np.zeros((4, 3), np.float32), good[1]]
    answers = [(2, _answer(good)), (5, _answer(wrong_shape))]
    outcome, reasons = _taken(strategy, plan, [_reply(plan, answers, failures=[(7, "ValueError: diverged")])])
    assert _counts(outcome.stats) == {"sampled": 3, "received": 3, "aggregated": 1, "failed": 1,
                                      "rejected_malformed": 0, "rejected_shape": 1, "reclipped": 0}  # fmt: skip
    assert [kind for kind, _ in reasons] == ["shape", "failed"]
    assert "partition 5" in reasons[0][1] and reasons[1][1] == "partition 7: ValueError: diverged"


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(
            lambda c: c.__setitem__(PARTITION_MODELS_KEY, MetricRecord({"partition_ids": [2.0]})), id="named-as-metrics"
        ),
        pytest.param(lambda c: c[PARTITION_MODELS_KEY].__setitem__("partition_ids", [True]), id="bool-ids"),
        pytest.param(lambda c: c[PARTITION_MODELS_KEY].__setitem__("failures", ["a", "b"]), id="unaligned-failures"),
        pytest.param(lambda c: c.__setitem__("arrays.9", ArrayRecord()), id="stray-record"),
        pytest.param(lambda c: c.__delitem__(model_key(5)), id="missing-model"),
    ],
)
def test_a_reply_whose_layout_is_broken_is_malformed_for_every_partition_of_its_message(spoil) -> None:
    strategy = build(*POP)
    old = _global()
    plan = _cohort_plan(strategy, old, COHORT)
    reply = _reply(plan, [(pid, _answer(old)) for pid in COHORT])
    spoil(reply.content)
    ((ids, kind, reason),) = screen_each(plan, reply, COHORT)
    assert ids == COHORT and kind == "malformed" and "per-partition models reply" in str(reason)
    outcome, _ = _taken(strategy, plan, [reply])
    assert outcome.stats["rejected_malformed"] == 3 and outcome.stats["aggregated"] == 0


def test_under_client_placement_every_partitions_model_is_refused() -> None:
    strategy = build("strategy=dp_fedavg", "privacy.placement=client", "privacy.sampling=fixed",
                     "dataset.num_clients=20", "privacy.sample_rate=0.5")  # fmt: skip
    old = _global()
    plan = _cohort_plan(strategy, old, COHORT)
    answers = [(pid, _answer(_trained(old, with_norm(SHAPES, 0.1, seed=pid)))) for pid in COHORT]
    results = screen_each(plan, _reply(plan, answers), COHORT)
    assert [(ids, kind) for ids, kind, _ in results] == [([pid], "malformed") for pid in COHORT]
    assert all("carries no client noise" in str(reason) for _, _, reason in results)
    outcome, reasons = _taken(strategy, plan, [_reply(plan, answers)])
    assert outcome.stats["rejected_malformed"] == 3 and outcome.stats["aggregated"] == 0 and len(reasons) == 3
