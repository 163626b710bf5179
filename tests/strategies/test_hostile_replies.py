"""Hostile replies against the server's round (strategies/base.py): pinned regressions and property-based tests.

Nothing a client sends is trusted (docs/PRIVACY.md, 4). Every reply must be bound to one of this round's train messages
(its id, from the node the message went to, once) and screened; whatever it holds, the round must go on with the other
replies, count the reply in exactly one of ``aggregated`` / ``failed`` / ``rejected_*``, and never raise. In server
placement an accepted update moves the average by at most C/m (a cohort sum of k clients by k·C/m).

The pinned tests reproduce one hostile reply each. The property tests (hypothesis) drive the real
``configure_train`` → message ids assigned as a grid does on push → ``aggregate_train`` path of a small DP-FedAvg
(M = 20, q = 0.5, so m = 10; C = 0.2; no noise) with honest replies and hostile ones in random order, and check:
no exception, every counter as an independent model of binding and screening predicts, and
‖aggregate − aggregate of the honest replies alone‖ ≤ k·C/m, k the number of hostile clients whose reply was
accepted (≤ the number of hostile clients).
"""

from __future__ import annotations

import io
import math
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fl_app.instructions import CLIENT_TIMESTAMPS, COHORT_CLIENT_METRICS
from fl_app.privacy import mechanisms as mech
from strategies.base import FederatedStrategy
from strategies.rounds import RoundOutcome, RoundPlan
from tests.helpers import (
    SCREENING_C,
    SCREENING_M,
    SCREENING_POPULATION,
    SCREENING_SHAPES,
    FakeGrid,
    build,
    flat,
    partition_of,
    push,
    reply,
    train_message,
    with_norm,
    zeros,
)

SHAPES = SCREENING_SHAPES
GLOBAL = zeros(SHAPES)
NUM_CLIENTS = 20
POP = (
    *SCREENING_POPULATION,
    # One strategy answers many unrelated rounds (hypothesis examples); a run's policy on consecutive empty rounds
    # (fl_app/empty_rounds.py, tested on its own) has no meaning across them.
    "max_empty_rounds=0",
)
C, M = SCREENING_C, SCREENING_M
COUNTERS = ("aggregated", "rejected_malformed", "rejected_nonfinite", "rejected_shape", "failed")
#: A float64 sum of squares overflows beyond this global norm.
NORM_OVERFLOW = math.sqrt(sys.float_info.max)

# Updates whose norm overflows are what these tests send: the server's norm says so with a warning.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in dot:RuntimeWarning")

Fates = tuple[dict[str, int], ...]  # the counter increments a reply may cause if it binds (more than one: ambiguous)


# ----- helpers ----------------------------------------------------------------------------------------------------


@cache
def _built(overrides: tuple[str, ...]) -> FederatedStrategy:
    return build(*overrides)


def _strategy(*extra: str, cohorts: bool = False) -> FederatedStrategy:
    """The strategy of these tests (composed once: configure_train resets all the round state a test uses)."""
    strategy = _built((*POP, *(("simulation.cohort_size=2",) if cohorts else ()), *extra))
    assert strategy.config.privacy.clip_norm == C or extra
    assert strategy.expected_clients == pytest.approx(M)
    return strategy


def _plan(strategy: FederatedStrategy, server_round: int) -> RoundPlan:
    """The real plan_round, with the message ids a grid assigns on push (unique per round)."""
    grid = FakeGrid()
    strategy.population.connect(grid, timeout=1)
    plan = strategy.plan_round(server_round, ArrayRecord(GLOBAL), ConfigRecord())
    push(plan.messages, prefix=f"round{server_round}-")
    return plan


def _configure(strategy: FederatedStrategy, server_round: int) -> list[Message]:
    """Flower's configure_train, with the message ids a grid assigns on push (unique per round)."""
    grid = FakeGrid()
    strategy.population.connect(grid, timeout=1)
    messages = list(strategy.configure_train(server_round, ArrayRecord(GLOBAL), ConfigRecord(), grid))
    return push(messages, prefix=f"round{server_round}-")


def _pid(message: Message) -> int:
    return partition_of(message)


def _ids(message: Message) -> list[int]:
    return [int(p) for p in message.content["config"]["partition_ids"]]


#: A one-client reply's fields as these tests state them: the partition and the client's statistics.
ONE_CLIENT_FIELDS = ("partition_id", "pre_clip_norm", "train_loss", "train_accuracy")
#: Where each of them goes in the reply format (fl_app.instructions.CohortReply: a cohort of one).
WIRE_KEY = {"partition_id": "cohort_ids", "pre_clip_norm": "pre_clip_norm", "train_loss": "train_loss",
            "train_accuracy": "train_accuracy"}  # fmt: skip


@dataclass(frozen=True)
class Wire:
    """A value sent exactly as given, in the reply format's own shape (not as one client's statistic)."""

    value: Any


def _metrics(partition_id: Any, update: Sequence[np.ndarray] | None = None, **changes: Any) -> dict[str, Any]:
    norm = mech.global_l2_norm(update) if update is not None else 0.0
    metrics = {"partition_id": partition_id, "pre_clip_norm": norm, "train_loss": 0.1, "train_accuracy": 0.5}
    metrics.update({"num_examples": 10, "fit_started_unix": 1.0e9, **changes})
    return metrics


def _wire(metrics: dict[str, Any]) -> dict[str, Any]:
    """A one-client reply's fields (:func:`_metrics`) in the reply format, a cohort of one: each stated value v of
    :data:`ONE_CLIENT_FIELDS` becomes the list [v]; a :class:`Wire` value goes as it is; a field left out stays
    out; the rest (``num_examples``, time stamps) are sent as stated."""
    wire: dict[str, Any] = {"num_steps": [1.0], "failed_ids": [], "nonfinite_ids": [], "shape_ids": [], "reclipped": 0}
    for key, value in metrics.items():
        name = WIRE_KEY.get(key, key)
        if isinstance(value, Wire):
            wire[name] = value.value
        else:
            wire[name] = [value] if key in WIRE_KEY else value
    return wire


def _message(to: Message, arrays: Any, metrics: Any) -> Message:
    """A reply to ``to`` (from the node ``to`` went to); lists and dicts become Array-/MetricRecords."""
    arrays = ArrayRecord(list(arrays)) if isinstance(arrays, list) else arrays
    metrics = MetricRecord(metrics) if isinstance(metrics, dict) else metrics
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=to)


def _client_message(to: Message, arrays: Any, metrics: Any) -> Message:
    """One client's reply to ``to``: :func:`_message` with a one-client field dict (:func:`_metrics`) in the reply
    format (:func:`_wire`)."""
    return _message(to, arrays, _wire(metrics) if isinstance(metrics, dict) else metrics)


def _from_node(message: Message, node: int) -> Message:
    """``message`` as if node ``node`` had sent it (what a node answering another node's message looks like)."""
    message.metadata.__dict__["_src_node_id"] = node
    return message


def _honest_update(partition_id: int, norm: float = 0.1) -> list[np.ndarray]:
    return with_norm(SHAPES, norm, seed=partition_id)


def _honest(to: Message, norm: float = 0.1) -> Message:
    return reply(_pid(to), _honest_update(_pid(to), norm), to=to)


def _expected_average(partitions: Sequence[int]) -> list[np.ndarray]:
    """What the server's average is for the honest updates of ``partitions`` (norms ≤ C: no re-clipping)."""
    return mech.uniform_average([_honest_update(p) for p in sorted(partitions)], M, SHAPES)


def _counts(stats: Any) -> dict[str, int]:
    return {key: int(stats[key]) for key in COUNTERS}


def _assert_round(
    outcome: RoundOutcome,
    partitions: Sequence[int],
    *,
    malformed: int = 0,
    shape: int = 0,
    nonfinite: int = 0,
    failed: int = 0,
) -> None:
    """The round aggregated exactly the honest updates of ``partitions`` and counted the rest as given."""
    expected = {
        "aggregated": len(partitions),
        "rejected_malformed": malformed,
        "rejected_nonfinite": nonfinite,
        "rejected_shape": shape,
        "failed": failed,
    }
    assert _counts(outcome.stats) == expected
    for got, want in zip(outcome.new_weights, _expected_average(partitions), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _raw_array(data: bytes, stype: str = "numpy.ndarray") -> ArrayRecord:
    """An ArrayRecord whose single Array carries ``data`` as sent (a client controls every byte of it)."""
    return ArrayRecord({"0": Array(dtype="float32", shape=(12,), stype=stype, data=data)})


def _round_with_one_bad_reply(bad: Callable[[Message], Message]) -> tuple[RoundOutcome, list[int]]:
    """Round 1: the first message is answered by ``bad(message)`` (sent first), every other one honestly."""
    strategy = _strategy()
    plan = _plan(strategy, 1)
    messages = plan.messages
    assert len(messages) >= 3
    outcome = strategy.aggregator.aggregate(plan, [bad(messages[0]), *[_honest(m) for m in messages[1:]]])
    return outcome, [_pid(m) for m in messages[1:]]


# ----- (a) finite values whose norm overflows -------------------------------------------------------------------


@pytest.mark.parametrize(
    "update",
    [
        pytest.param([np.full(s, 1e200) for s in SHAPES], id="every-coordinate-1e200"),
        pytest.param([np.full(SHAPES[0], -1e200), np.zeros(SHAPES[1])], id="one-tensor-1e200"),
        pytest.param([np.full(s, 1e160) for s in SHAPES], id="every-coordinate-1e160"),
        pytest.param([np.full(s, sys.float_info.max) for s in SHAPES], id="float64-max"),
    ],
)
def test_finite_values_whose_norm_overflows_are_rejected_as_nonfinite(update: list[np.ndarray]) -> None:
    assert mech.is_finite_update(update) and not math.isfinite(mech.global_l2_norm(update))
    outcome, others = _round_with_one_bad_reply(
        lambda m: _client_message(m, update, _metrics(_pid(m), pre_clip_norm=1.0))
    )
    _assert_round(outcome, others, nonfinite=1)


def test_a_huge_but_finite_update_is_clipped_to_c_not_rejected() -> None:
    huge = [np.full(s, np.finfo(np.float32).max, dtype=np.float32) for s in SHAPES]  # norm ~1.4e39: finite
    strategy = _strategy()
    plan = _plan(strategy, 1)
    messages = plan.messages
    outcome = strategy.aggregator.aggregate(
        plan, [_client_message(messages[0], huge, _metrics(_pid(messages[0]), huge))]
    )
    assert outcome.stats["aggregated"] == 1 and outcome.stats["reclipped"] == 1
    assert mech.global_l2_norm(outcome.new_weights) <= C / M * (1 + 1e-6)
    assert mech.global_l2_norm(outcome.new_weights) == pytest.approx(C / M, rel=1e-4)


def test_a_float16_update_is_clipped_to_a_tiny_c_not_crashing_the_round() -> None:
    """Scaled towards C = 1e-6, float16 coordinates land on subnormals; the clip raised FloatingPointError there."""
    update = [np.full(SHAPES[0], 0.05, dtype=np.float16), np.zeros(SHAPES[1], dtype=np.float16)]
    strategy = _strategy("privacy.clip_norm=1e-6")
    plan = _plan(strategy, 1)
    messages = plan.messages
    outcome = strategy.aggregator.aggregate(
        plan, [_client_message(messages[0], update, _metrics(_pid(messages[0]), update))]
    )
    assert outcome.stats["aggregated"] == 1 and outcome.stats["reclipped"] == 1
    assert mech.global_l2_norm(outcome.new_weights) <= 1e-6 / M * (1 + 1e-6)


# ----- (b) partition ids ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "claim",
    ["nan", "+inf", "-inf", "fractional", "negative", "another-sampled", "unsampled", "uint64-max", "twice"],
)
def test_a_partition_id_other_than_the_one_its_message_carried_is_malformed(claim: str) -> None:
    def bad(message: Message) -> Message:
        pid = _pid(message)
        value: Any = {
            "nan": math.nan,
            "+inf": math.inf,
            "-inf": -math.inf,
            "fractional": pid + 0.5,
            "negative": -(pid + 1),
            "another-sampled": next(p for p in sampled if p != pid),
            "unsampled": NUM_CLIENTS + pid,
            "uint64-max": 2**64 - 1,
            "twice": Wire([pid, pid]),
        }[claim]
        update = _honest_update(pid)
        return _client_message(message, update, _metrics(value, update))

    sampled = [int(p) for p in _strategy().sample_clients(1)]
    outcome, others = _round_with_one_bad_reply(bad)
    _assert_round(outcome, others, malformed=1)


# ----- (c) replies to a message of an earlier round ---------------------------------------------------------------


def test_a_reply_to_a_message_of_an_earlier_round_is_rejected() -> None:
    strategy = _strategy()
    earlier = _plan(strategy, 1).messages
    plan = _plan(strategy, 2)
    current = plan.messages
    assert {_pid(m) for m in earlier} & {_pid(m) for m in current}  # some partitions are sampled in both rounds
    # Well-formed replies from the nodes the round-1 messages went to, arriving in round 2 before round 2's replies.
    stale = [_honest(m) for m in earlier]
    outcome = strategy.aggregator.aggregate(plan, [*stale, *[_honest(m) for m in current]])
    _assert_round(outcome, [_pid(m) for m in current], malformed=len(earlier))
    assert outcome.stats["received"] == len(current)


# ----- (d) a node answering for a partition assigned to another node -------------------------------------------------


def test_a_node_cannot_answer_for_a_partition_assigned_to_another_node() -> None:
    strategy = _strategy()
    plan = _plan(strategy, 1)
    messages = plan.messages
    target = messages[0]
    liar_node = next(m.metadata.dst_node_id for m in messages if m.metadata.dst_node_id != target.metadata.dst_node_id)
    liars_message = next(m for m in messages if m.metadata.dst_node_id == liar_node)
    huge = with_norm(SHAPES, 1e3, seed=99)
    # 1. The liar node answers the target's message itself (its src node is not the node the message went to).
    forged = _from_node(_client_message(target, huge, _metrics(_pid(target), huge)), liar_node)
    # 2. The liar node answers its own message, claiming the target's partition.
    claimed = _client_message(liars_message, huge, _metrics(_pid(target), huge))
    genuine = [_honest(m) for m in messages if m is not liars_message]
    outcome = strategy.aggregator.aggregate(plan, [forged, claimed, *genuine])
    # The target's genuine reply, arriving after both lies, is accepted: neither lie used up its message.
    _assert_round(outcome, [_pid(m) for m in messages if m is not liars_message], malformed=2)
    assert outcome.stats["received"] == len(messages)  # the liar's message was answered (by a malformed reply)


def test_a_reply_from_an_unknown_node_or_to_an_unknown_message_is_rejected() -> None:
    strategy = _strategy()
    plan = _plan(strategy, 1)
    messages = plan.messages
    stranger = _from_node(_honest(messages[0]), 12345)
    unknown = reply(_pid(messages[1]), _honest_update(_pid(messages[1])))  # to a message never sent (id "m<pid>")
    outcome = strategy.aggregator.aggregate(plan, [stranger, unknown, *[_honest(m) for m in messages]])
    _assert_round(outcome, [_pid(m) for m in messages], malformed=2)


# ----- (e) a second answer to the same message ------------------------------------------------------------------


@pytest.mark.parametrize("second", ["identical", "different", "huge", "nan", "error", "wrong-shape"])
def test_a_second_answer_to_a_message_is_rejected_and_the_first_kept(second: str) -> None:
    strategy = _strategy()
    plan = _plan(strategy, 1)
    messages = plan.messages
    first = messages[0]
    pid = _pid(first)
    nan = _honest_update(pid)
    nan[0][0, 0] = np.nan
    again: Message = {
        "identical": lambda: _honest(first),
        "different": lambda: reply(pid, with_norm(SHAPES, 0.15, seed=7), to=first),
        "huge": lambda: reply(pid, with_norm(SHAPES, 1e6, seed=7), to=first),
        "nan": lambda: reply(pid, nan, pre_clip_norm=0.1, to=first),
        "error": lambda: Message(Error(code=1, reason="late"), reply_to=first),
        "wrong-shape": lambda: reply(pid, [np.zeros(3, np.float32)], to=first),
    }[second]()
    outcome = strategy.aggregator.aggregate(plan, [*[_honest(m) for m in messages], again])
    _assert_round(outcome, [_pid(m) for m in messages], malformed=1)


# ----- (f) metric values of wrong types, int arrays, empty array records -------------------------------------------


@pytest.mark.parametrize("key", [*ONE_CLIENT_FIELDS, *CLIENT_TIMESTAMPS])
@pytest.mark.parametrize("shape", ["empty", "two", "other-kind"])
def test_a_field_of_the_wrong_shape_is_malformed(key: str, shape: str) -> None:
    """One client's statistics are lists of one in the reply format, its time stamps scalars: an empty list, a list
    of two, or a scalar where a list belongs (a list where a scalar belongs) is malformed."""
    listed = key in WIRE_KEY
    value = {"empty": [], "two": [1.0, 1.0], "other-kind": 1.0 if listed else [1.0]}[shape]

    def bad(message: Message) -> Message:
        update = _honest_update(_pid(message))
        metrics = _metrics(_pid(message), update)
        metrics[key] = Wire(value)
        return _client_message(message, update, metrics)

    outcome, others = _round_with_one_bad_reply(bad)
    _assert_round(outcome, others, malformed=1)


@pytest.mark.parametrize("key", ONE_CLIENT_FIELDS)
def test_a_missing_metric_is_malformed(key: str) -> None:
    def bad(message: Message) -> Message:
        update = _honest_update(_pid(message))
        metrics = _metrics(_pid(message), update)
        del metrics[key]
        return _client_message(message, update, metrics)

    outcome, others = _round_with_one_bad_reply(bad)
    _assert_round(outcome, others, malformed=1)


@pytest.mark.parametrize("value", [True, False, "3", b"3", np.float32(1.0), [True]], ids=repr)
def test_a_metric_record_cannot_carry_bools_strings_or_numpy_scalars(value: Any) -> None:
    """Why the tests below send such values in a ConfigRecord: MetricRecord (and its wire format: doubles, sint64,
    uint64 and lists of them) has no bools or strings; a ConfigRecord under the "metrics" key has both."""
    with pytest.raises(TypeError):
        MetricRecord({"partition_id": value})


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"partition_id": "BOOL"}, id="bool-partition-id"),
        pytest.param({"train_loss": True, "train_accuracy": False}, id="bool-loss-and-accuracy"),
        pytest.param({"partition_id": "STR"}, id="string-partition-id"),
        pytest.param({"pre_clip_norm": "0.1"}, id="string-norm"),
        pytest.param({"pre_clip_norm": b"0.1"}, id="bytes-norm"),
    ],
)
def test_metrics_of_another_record_type_with_bools_or_strings_are_malformed(values: dict[str, Any]) -> None:
    """A reply whose "metrics" is a ConfigRecord holding bools, strings or bytes is malformed like any other reply
    with non-numeric metrics, even where ``float()`` would take the value (True → 1.0, "0.1" → 0.1)."""
    strategy = _strategy()
    server_round = next(t for t in range(1, 50) if {0, 1} & set(strategy.sample_clients(t).tolist()))
    plan = _plan(strategy, server_round)
    messages = plan.messages
    first = next(m for m in messages if _pid(m) in (0, 1))  # a bool can equal its partition id: False == 0, True == 1
    pid = _pid(first)
    update = _honest_update(pid)
    metrics = _metrics(pid, update)
    metrics.update({k: {"BOOL": bool(pid), "STR": str(pid)}.get(v, v) for k, v in values.items()})
    bad = _message(first, update, ConfigRecord(_wire(metrics)))
    outcome = strategy.aggregator.aggregate(plan, [bad, *[_honest(m) for m in messages if m is not first]])
    _assert_round(outcome, [_pid(m) for m in messages if m is not first], malformed=1)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_, np.complex64])
def test_arrays_of_a_non_floating_dtype_are_rejected_as_shape(dtype: type) -> None:
    def bad(message: Message) -> Message:
        update = [np.ones(s, dtype=dtype) for s in SHAPES]
        return _client_message(message, update, _metrics(_pid(message), pre_clip_norm=1.0))

    outcome, others = _round_with_one_bad_reply(bad)
    _assert_round(outcome, others, shape=1)


def test_an_empty_array_record_is_rejected_as_shape() -> None:
    outcome, others = _round_with_one_bad_reply(lambda m: _client_message(m, ArrayRecord(), _metrics(_pid(m))))
    _assert_round(outcome, others, shape=1)


@pytest.mark.parametrize(
    "arrays",
    [
        pytest.param(lambda: MetricRecord({"0": 1.0}), id="metric-record"),
        pytest.param(lambda: ConfigRecord({"0": b"\x93NUMPY"}), id="config-record"),
    ],
)
def test_an_arrays_entry_that_is_not_an_array_record_is_rejected(arrays: Callable[[], Any]) -> None:
    outcome, others = _round_with_one_bad_reply(lambda m: _client_message(m, arrays(), _metrics(_pid(m))))
    assert outcome.stats["rejected_malformed"] + outcome.stats["rejected_shape"] == 1
    assert outcome.stats["aggregated"] == len(others) and outcome.stats["failed"] == 0


def test_a_metrics_entry_that_is_an_array_record_is_malformed() -> None:
    def bad(message: Message) -> Message:
        return _client_message(message, _honest_update(_pid(message)), ArrayRecord(zeros(SHAPES)))

    outcome, others = _round_with_one_bad_reply(bad)
    _assert_round(outcome, others, malformed=1)


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(lambda: _raw_array(b""), id="no-bytes"),
        pytest.param(lambda: _raw_array(b"garbage"), id="garbage"),
        pytest.param(lambda: _raw_array(_npy(np.zeros(12, np.float32))[:-4]), id="truncated"),
        pytest.param(lambda: _raw_array(_npy(np.zeros(12, np.float32))[:6]), id="truncated-magic"),
        pytest.param(lambda: _raw_array(_npy(np.zeros(12, np.float32)), stype="torch"), id="foreign-stype"),
        # An .npy header announcing 10^11 float32 (373 GiB) in a few bytes of data.
        pytest.param(
            lambda: _raw_array(_npy(np.zeros(12, np.float32)).replace(b"(12,)", b"(99999999999,)")), id="huge-header"
        ),
    ],
)
def test_array_bytes_that_do_not_decode_are_rejected(record: Callable[[], ArrayRecord]) -> None:
    outcome, others = _round_with_one_bad_reply(lambda m: _client_message(m, record(), _metrics(_pid(m))))
    assert outcome.stats["rejected_malformed"] + outcome.stats["rejected_shape"] == 1
    assert outcome.stats["aggregated"] == len(others) and outcome.stats["failed"] == 0


@pytest.mark.parametrize("reason", [None, "", "x" * 10_000], ids=["none", "empty", "long"])
def test_an_error_reply_is_counted_as_failed_whatever_its_reason(reason: str | None) -> None:
    """Flower's wire format turns an empty error reason into ``None`` (``error_from_proto``)."""
    outcome, others = _round_with_one_bad_reply(lambda m: Message(Error(code=3, reason=reason), reply_to=m))
    _assert_round(outcome, others, failed=1)


# ----- the same in cohort mode --------------------------------------------------------------------------------


def _cohort_metrics(ids: Sequence[int], norms: Sequence[float] | None = None, **rejected: list[int]) -> dict[str, Any]:
    accepted = [p for p in ids if not any(p in v for v in rejected.values())]
    k = len(accepted)
    return {
        "cohort_ids": accepted,
        "pre_clip_norm": list(norms) if norms is not None else [0.1] * k,
        "train_loss": [0.1] * k,
        "train_accuracy": [0.5] * k,
        "num_steps": [3.0] * k,
        "failed_ids": rejected.get("failed", []),
        "nonfinite_ids": rejected.get("nonfinite", []),
        "shape_ids": rejected.get("shape", []),
        "reclipped": 0,
        "num_examples": 10 * k,
    }


def _honest_cohort(to: Message, norms: dict[int, float] | None = None) -> Message:
    """An honest worker's reply: the float64 sum of its clients' updates, each of norm ≤ C, all accepted."""
    ids = _ids(to)
    updates = [_honest_update(p, 0.1 if norms is None else norms[p]) for p in ids]
    total = mech.uniform_sum(updates, SHAPES)
    return _message(to, total, _cohort_metrics(ids, [mech.global_l2_norm(u) for u in updates]))


@pytest.mark.parametrize(
    ("bad", "unbound"),
    [
        pytest.param(lambda m: Message(Error(code=3, reason=None), reply_to=m), 0, id="error-without-reason"),
        pytest.param(
            lambda m: _message(m, MetricRecord({"0": 1.0}), _cohort_metrics(_ids(m))), 0, id="arrays-not-arrays"
        ),
        pytest.param(lambda m: _message(m, _raw_array(b""), _cohort_metrics(_ids(m))), 0, id="array-without-bytes"),
        pytest.param(lambda m: _message(m, zeros(SHAPES), ConfigRecord({"cohort_ids": "x"})), 0, id="config-record"),
        pytest.param(lambda m: _from_node(_honest_cohort(m), 777), 1, id="foreign-node"),
        pytest.param(
            lambda m: _message(m, zeros(SHAPES), {**_cohort_metrics(_ids(m)), "reclipped": 10**6}),
            0,
            id="more-reclipped-than-clients",
        ),
        pytest.param(
            lambda m: _message(m, zeros(SHAPES), {**_cohort_metrics(_ids(m)), "reclipped": -1}),
            0,
            id="negative-reclipped",
        ),
    ],
)
def test_a_broken_cohort_reply_is_rejected_and_the_round_goes_on(
    bad: Callable[[Message], Message], unbound: int
) -> None:
    strategy = _strategy(cohorts=True)
    plan = _plan(strategy, 1)
    messages = plan.messages
    assert len(messages) >= 2 and plan.cohort_mode
    outcome = strategy.aggregator.aggregate(plan, [bad(messages[0]), *[_honest_cohort(m) for m in messages[1:]]])
    others = [p for m in messages[1:] for p in _ids(m)]
    assert outcome.stats["aggregated"] == len(others)
    assert sum(_counts(outcome.stats).values()) == plan.sampled + unbound
    for got, want in zip(outcome.new_weights, _expected_average(others), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


# ----- property-based tests ---------------------------------------------------------------------------------------

SETTINGS = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

SPECIAL_VALUES = (
    0.0, -0.0, 5e-324, 1e-310, 1e-30, 1e-6, 0.05, -0.3, 1.0, 1e4, 65504.0, 7e4, 3.4e38, 1e39, 1e150, 1.3e154, 1.4e154,
    1e200, -1e200, sys.float_info.max, math.nan, math.inf, -math.inf,
)  # fmt: skip
VALUES = st.one_of(st.sampled_from(SPECIAL_VALUES), st.floats(), st.floats(-1.0, 1.0))
DTYPES = (np.float32, np.float32, np.float64, np.float64, np.float16, np.int32, np.int64)
LAYOUTS: dict[str, list[tuple[int, ...]]] = {
    "model": SHAPES,
    "extra-tensor": [*SHAPES, (2,)],
    "missing-tensor": SHAPES[:1],
    "no-tensor": [],
    "transposed": [(4, 3), (5,)],
    "scalar": [(), (5,)],
}
LAYOUT_CHOICES = ("model", "model", "model", "model", *LAYOUTS)


@st.composite
def hostile_arrays(draw: st.DrawFn) -> list[np.ndarray]:
    """Tensors of any layout, dtype and values (NaN, ±Inf, 1e200, float64 max, subnormals, ...)."""
    arrays = []
    for shape in LAYOUTS[draw(st.sampled_from(LAYOUT_CHOICES))]:
        dtype = draw(st.sampled_from(DTYPES))
        size = math.prod(shape)
        if draw(st.booleans()):  # one magnitude with random signs: reaches the norm overflow with finite values
            value = draw(VALUES)
            signs = draw(st.lists(st.sampled_from((1.0, -1.0)), min_size=size, max_size=size))
            values = [value * sign for sign in signs]
        else:
            values = draw(st.lists(VALUES, min_size=size, max_size=size))
        with np.errstate(over="ignore", invalid="ignore"):
            arrays.append(np.array(values, dtype=np.float64).reshape(shape).astype(dtype))
    return arrays


FLOAT_BOUNDS: dict[type, float] = {np.float16: 6e4, np.float32: 3e38, np.float64: 1e150}


@st.composite
def finite_arrays(draw: st.DrawFn) -> list[np.ndarray]:
    """Tensors of the model's shapes in floating dtypes with finite values of any size (norms up to ~1e150): the
    server must accept them and clip them to C."""
    arrays = []
    for shape in SHAPES:
        dtype = draw(st.sampled_from(tuple(FLOAT_BOUNDS)))
        bound = FLOAT_BOUNDS[dtype]
        values = draw(st.lists(st.floats(-bound, bound), min_size=math.prod(shape), max_size=math.prod(shape)))
        arrays.append(np.array(values, dtype=np.float64).reshape(shape).astype(dtype))
    return arrays


@st.composite
def overflowing_arrays(draw: st.DrawFn) -> list[np.ndarray]:
    """Float64 tensors of the model's shapes, every value finite, whose global norm overflows (values ≥ 1e155)."""
    magnitude = st.one_of(st.floats(1e155, sys.float_info.max), st.sampled_from((1e200, sys.float_info.max)))
    value = st.builds(lambda m, sign: m * sign, magnitude, st.sampled_from((1.0, -1.0)))
    return [np.array(draw(st.lists(value, min_size=math.prod(s), max_size=math.prod(s)))).reshape(s) for s in SHAPES]


UPDATES = st.one_of(finite_arrays(), hostile_arrays(), overflowing_arrays())


def array_fates(arrays: Sequence[np.ndarray]) -> tuple[str, ...]:
    """What screening must make of an update (independent of fl_app.privacy): "aggregated" (clipped to C),
    "rejected_shape" or "rejected_nonfinite"; two answers only for a norm within 1e-9 of the overflow."""
    if len(arrays) != len(SHAPES) or any(
        a.shape != s or a.dtype.kind != "f" for a, s in zip(arrays, SHAPES, strict=True)
    ):
        return ("rejected_shape",)
    values = [float(v) for a in arrays for v in a.ravel()]
    if not all(math.isfinite(v) for v in values):
        return ("rejected_nonfinite",)
    norm = math.hypot(*values)
    if norm > NORM_OVERFLOW * (1 + 1e-9):
        return ("rejected_nonfinite",)
    if norm < NORM_OVERFLOW * (1 - 1e-9):
        return ("aggregated",)
    return ("aggregated", "rejected_nonfinite")


@dataclass
class Sent:
    """A reply the test sends and what the server must make of it."""

    message: Message
    #: The id of this round's message it binds to (from that message's node), None if it binds to none.
    target: str | None
    #: How many clients that message carries (received, or failed when no reply binds to it).
    clients: int
    #: The counter increments if it is the first reply bound to its message; several = ambiguous.
    fates: Fates


def _expected(sent: Sequence[Sent], sampled: int) -> tuple[dict[str, int] | None, int, int]:
    """(exact counters or None if ambiguous, clients received, replies bound) under the binding rule: a reply counts
    for the message it answers, from that message's node, first come; anything else is malformed."""
    answered: set[str] = set()
    totals: Counter[str] = Counter()
    exact = True
    received = 0
    for s in sent:
        if s.target is None or s.target in answered:
            totals["rejected_malformed"] += 1
            continue
        answered.add(s.target)
        received += s.clients
        exact = exact and len(s.fates) == 1
        totals.update(s.fates[0])
    totals["failed"] += sampled - received
    return ({k: totals[k] for k in COUNTERS} if exact else None), received, len(answered)


def _other_nodes(message: Message) -> list[int]:
    return [n for n in (0, 1, 2, 3, 999) if n != message.metadata.dst_node_id]


@cache
def _pair(cohorts: bool) -> tuple[FederatedStrategy, FederatedStrategy]:
    """A strategy under attack and a reference that sees the honest replies only (configure_train resets both)."""
    reference = build(*POP, *(("simulation.cohort_size=2",) if cohorts else ()))
    return _strategy(cohorts=cohorts), reference


def _check_round(
    strategy: FederatedStrategy,
    reference: FederatedStrategy,
    server_round: int,
    sent: list[Sent],
    honest: list[Message],
    hostile_clients: int,
    sampled: int,
) -> None:
    """Run both rounds through aggregate_train and check the properties (``sampled``: clients in the messages)."""
    arrays, metrics = strategy.aggregate_train(server_round, [s.message for s in sent])
    ref_arrays, ref_metrics = reference.aggregate_train(server_round, honest)
    assert arrays is not None and metrics is not None and ref_arrays is not None and ref_metrics is not None

    expected, received, bound = _expected(sent, sampled)
    counts = _counts(metrics)
    event("counters predicted exactly" if expected is not None else "a norm at the overflow edge: totals only")
    for key, value in counts.items():
        event(f"{key} > 0" if value else f"{key} == 0")
    assert metrics["received"] == received
    # Every sampled client and every reply that answers no message (or one already answered) is counted once.
    assert sum(counts.values()) == sampled + len(sent) - bound
    if expected is not None:
        assert counts == expected

    new = flat(arrays.to_numpy_ndarrays())
    ref = flat(ref_arrays.to_numpy_ndarrays())
    assert np.isfinite(new).all()
    accepted_hostile = counts["aggregated"] - int(ref_metrics["aggregated"])
    assert 0 <= accepted_hostile <= hostile_clients
    event(f"hostile clients accepted: {min(accepted_hostile, 3)}{'+' if accepted_hostile >= 3 else ''}")
    difference = float(np.linalg.norm(new - ref))
    if accepted_hostile == 0:
        assert difference == 0.0  # the same updates, summed in the same (partition) order
    budget = accepted_hostile * C / M
    assert difference <= budget * (1 + 1e-6) + 1e-6 * (float(np.linalg.norm(ref)) + budget)
    assert difference <= hostile_clients * C / M * (1 + 1e-6) + 1e-6 * (float(np.linalg.norm(ref)) + budget)


# ----- one message per client -------------------------------------------------------------------------------


def _client_payload(draw: st.DrawFn, to: Message, sampled: Sequence[int]) -> tuple[Message, Fates]:
    """A reply to ``to`` from its node by a hostile client: any update, lying metrics, or an error."""
    pid = _pid(to)
    kind = draw(st.sampled_from(("update", "update", "metrics", "error")))
    event(f"hostile client reply: {kind}")
    if kind == "error":
        reason = draw(st.text(min_size=1, max_size=400))
        return Message(Error(code=draw(st.integers(0, 2**31)), reason=reason), reply_to=to), ({"failed": 1},)
    if kind == "update":
        arrays = draw(UPDATES)
        claimed = draw(st.one_of(st.just(0.0), st.floats(0.0, 1e300)))  # a lie about the norm changes nothing
        return _client_message(to, arrays, _metrics(pid, pre_clip_norm=claimed)), tuple(
            {f: 1} for f in array_fates(arrays)
        )
    update = with_norm(SHAPES, draw(st.sampled_from((0.0, 0.1, 1.0, 1e3, 1e30))), seed=pid)
    metrics = _metrics(pid, update)
    corruption = draw(st.sampled_from(("partition_id", "pre_clip_norm", "missing", "list")))
    if corruption == "partition_id":
        others = [p for p in sampled if p != pid]
        choices = (math.nan, math.inf, -math.inf, pid + 0.5, -(pid + 1), pid + NUM_CLIENTS, 2**64 - 1, *others)
        metrics["partition_id"] = draw(st.sampled_from(choices))
    elif corruption == "pre_clip_norm":
        metrics["pre_clip_norm"] = draw(st.sampled_from((math.nan, math.inf, -math.inf, -1.0, -1e-300)))
    elif corruption == "missing":
        del metrics[draw(st.sampled_from(ONE_CLIENT_FIELDS))]
    else:  # a field of the wrong shape (a statistic is a list of one, a time stamp a scalar)
        key = draw(st.sampled_from((*ONE_CLIENT_FIELDS, *CLIENT_TIMESTAMPS)))
        wrong = ([], [float(pid), float(pid)], float(pid)) if key in WIRE_KEY else ([], [1.0], [float(pid)])
        metrics[key] = Wire(draw(st.sampled_from(wrong)))
    return _client_message(to, update, metrics), ({"rejected_malformed": 1},)


@SETTINGS
@given(data=st.data())
def test_hostile_client_replies_never_raise_are_counted_and_move_the_average_by_at_most_k_c_over_m(
    data: st.DataObject,
) -> None:
    strategy, reference = _pair(False)
    server_round = data.draw(st.integers(2, 8), label="round")
    earlier = _configure(strategy, server_round - 1)
    messages = _configure(strategy, server_round)
    _configure(reference, server_round)
    assert all(len(m.content["config"]["partition_ids"]) == 1 for m in messages)  # one client per message
    sampled = [_pid(m) for m in messages]
    roles = data.draw(
        st.lists(st.sampled_from(("honest", "honest", "hostile", "hostile", "silent")), min_size=len(messages),
                 max_size=len(messages)),
        label="roles",
    )  # fmt: skip
    hostile = [m for m, r in zip(messages, roles, strict=True) if r == "hostile"]
    honest_norms = {
        m.metadata.message_id: data.draw(st.floats(0.0, 0.999 * C), label="honest norm")
        for m, r in zip(messages, roles, strict=True)
        if r == "honest"
    }
    honest_messages = [m for m in messages if m.metadata.message_id in honest_norms]
    honest = [_honest(m, honest_norms[m.metadata.message_id]) for m in honest_messages]
    sent = [
        Sent(r, m.metadata.message_id, 1, ({"aggregated": 1},)) for m, r in zip(honest_messages, honest, strict=True)
    ]

    for to in hostile:  # every hostile client answers its message at least once
        message, fates = _client_payload(data.draw, to, sampled)
        sent.append(Sent(message, to.metadata.message_id, 1, fates))
    attacks = ["forged-node", "unknown-message"]
    attacks += ["hostile"] * 4 if hostile else []
    attacks += ["stale"] if earlier else []
    attacks += ["duplicate-honest"] if honest else []
    for attack in data.draw(st.lists(st.sampled_from(attacks), max_size=8), label="attacks"):
        if attack == "hostile":  # its own message, possibly more than once: the first answer counts
            to = data.draw(st.sampled_from(hostile))
            message, fates = _client_payload(data.draw, to, sampled)
            sent.append(Sent(message, to.metadata.message_id, 1, fates))
        elif attack == "forged-node":  # any message of this round, answered from another node
            to = data.draw(st.sampled_from(messages)) if messages else train_message(0)
            message, _ = _client_payload(data.draw, to, sampled)
            sent.append(Sent(_from_node(message, data.draw(st.sampled_from(_other_nodes(to)))), None, 1, ()))
        elif attack == "stale":  # a message of the previous round, from its node
            to = data.draw(st.sampled_from(earlier))
            message = _honest(to) if data.draw(st.booleans()) else _client_payload(data.draw, to, sampled)[0]
            sent.append(Sent(message, None, 1, ()))
        elif attack == "unknown-message":
            sent.append(Sent(_client_payload(data.draw, train_message(data.draw(st.sampled_from(sampled or [0]))),
                                             sampled)[0], None, 1, ()))  # fmt: skip
        else:  # the same honest reply once more: whichever copy comes first is the same update
            index = data.draw(st.integers(0, len(honest_messages) - 1))
            to = honest_messages[index]
            sent.append(Sent(_honest(to, honest_norms[to.metadata.message_id]), to.metadata.message_id, 1,
                             ({"aggregated": 1},)))  # fmt: skip
    order = data.draw(st.permutations(range(len(sent))), label="order")
    _check_round(strategy, reference, server_round, [sent[i] for i in order], honest, len(hostile), len(messages))


# ----- cohort mode ------------------------------------------------------------------------------------------------

GROUPS = ("cohort_ids", "failed_ids", "nonfinite_ids", "shape_ids")
GROUP_COUNTER = {
    "cohort_ids": "aggregated",
    "failed_ids": "failed",
    "nonfinite_ids": "rejected_nonfinite",
    "shape_ids": "rejected_shape",
}
COHORT_LIES = (
    "extra-id", "missing-id", "foreign-id", "duplicate-id", "fractional-id", "nan-id", "misaligned",
    "bad-norm", "bad-reclipped", "missing-key", "scalar-for-list", "list-for-scalar",
)  # fmt: skip


def _homogeneous(values: list[Any]) -> list[Any]:
    """MetricRecord lists hold ints or floats, not both."""
    return [float(v) for v in values] if any(isinstance(v, float) for v in values) else values


def _cohort_payload(draw: st.DrawFn, to: Message) -> tuple[Message, Fates]:
    """A reply to cohort message ``to`` from its node by a hostile worker: it may lie about its ids, fates, sum and
    per-client statistics, or send an error."""
    ids = _ids(to)
    if draw(st.integers(0, 9)) == 0:
        error = Error(code=1, reason=draw(st.text(min_size=1, max_size=50)))
        return Message(error, reply_to=to), ({"failed": len(ids)},)
    groups: dict[str, list[Any]] = {g: [] for g in GROUPS}
    for pid in ids:
        groups[draw(st.sampled_from(("cohort_ids", "cohort_ids", *GROUPS)))].append(pid)
    k = len(groups["cohort_ids"])
    metrics: dict[str, Any] = dict(groups)
    metrics["pre_clip_norm"] = draw(st.lists(st.floats(0.0, 1e300), min_size=k, max_size=k))
    for key in ("train_loss", "train_accuracy", "num_steps"):
        metrics[key] = draw(st.lists(VALUES, min_size=k, max_size=k))  # NaN losses are averaged out, not fatal
    metrics["reclipped"] = draw(st.integers(0, k))
    total = draw(UPDATES)
    lie = draw(st.one_of(st.just("none"), st.sampled_from(COHORT_LIES)))
    event(f"hostile cohort reply: lie={lie}")
    outsiders = [p for p in (*range(NUM_CLIENTS), NUM_CLIENTS + 3, -1) if p not in ids]
    group = draw(st.sampled_from(GROUPS))
    if lie == "extra-id":
        metrics[group] = [*metrics[group], draw(st.sampled_from(outsiders))]
    elif lie in ("missing-id", "foreign-id", "fractional-id", "nan-id", "duplicate-id"):
        victim = draw(st.sampled_from(ids))
        where = next(g for g in GROUPS if victim in metrics[g])
        replacement: list[Any] = {
            "missing-id": [],
            "foreign-id": [draw(st.sampled_from(outsiders))],
            "fractional-id": [victim + 0.5],
            "nan-id": [math.nan],
            "duplicate-id": [victim, victim],
        }[lie]
        members = list(metrics[where])
        position = members.index(victim)
        metrics[where] = members[:position] + replacement + members[position + 1 :]
    elif lie == "misaligned":
        key = draw(st.sampled_from(COHORT_CLIENT_METRICS))
        metrics[key] = metrics[key][:-1] if metrics[key] and draw(st.booleans()) else [*metrics[key], 1.0]
    elif lie == "bad-norm":
        bad = draw(st.sampled_from((math.nan, math.inf, -math.inf, -1.0)))
        if k:
            metrics["pre_clip_norm"][draw(st.integers(0, k - 1))] = bad
        else:
            metrics["reclipped"] = bad if math.isnan(bad) or math.isinf(bad) else math.nan
    elif lie == "bad-reclipped":  # a count of re-clipped clients outside [0, k], fractional or not finite
        metrics["reclipped"] = draw(
            st.one_of(st.integers(k + 1, 10**9), st.integers(-(10**9), -1), st.sampled_from((0.5, math.nan, math.inf)))
        )
    elif lie == "missing-key":
        del metrics[draw(st.sampled_from((*GROUPS, *COHORT_CLIENT_METRICS, "reclipped")))]
    elif lie == "scalar-for-list":
        metrics[draw(st.sampled_from((*GROUPS, *COHORT_CLIENT_METRICS)))] = 1.0
    elif lie == "list-for-scalar":
        metrics["reclipped"] = [0.0]
    metrics = {key: _homogeneous(v) if isinstance(v, list) else v for key, v in metrics.items()}
    message = _message(to, total, metrics)
    if lie in ("bad-norm", "bad-reclipped"):
        # Lies about the statistics' values are screened after the sum (strategies/screening.py: structure, then the
        # sum, then the values), so a sum that is rejected on its own is counted as what it is.
        fates_of_sum = array_fates(total)
        return message, tuple({"rejected_malformed" if f == "aggregated" else f: len(ids)} for f in fates_of_sum)
    if lie != "none":
        return message, ({"rejected_malformed": len(ids)},)
    fates: list[dict[str, int]] = []
    for fate in array_fates(total):
        if fate == "aggregated":
            fates.append({GROUP_COUNTER[g]: len(groups[g]) for g in GROUPS})
        else:
            fates.append({fate: len(ids)})
    return message, tuple(fates)


@SETTINGS
@given(data=st.data())
def test_hostile_cohort_replies_never_raise_are_counted_and_move_the_average_by_at_most_k_c_over_m(
    data: st.DataObject,
) -> None:
    strategy, reference = _pair(True)
    server_round = data.draw(st.integers(2, 8), label="round")
    earlier = _configure(strategy, server_round - 1)
    messages = _configure(strategy, server_round)
    _configure(reference, server_round)
    assert all("partition_ids" in m.content["config"] for m in messages)  # cohorts
    roles = data.draw(
        st.lists(st.sampled_from(("honest", "honest", "hostile", "hostile", "silent")), min_size=len(messages),
                 max_size=len(messages)),
        label="roles",
    )  # fmt: skip
    hostile = [m for m, r in zip(messages, roles, strict=True) if r == "hostile"]
    honest_messages = [m for m, r in zip(messages, roles, strict=True) if r == "honest"]
    norms = {p: data.draw(st.floats(0.0, 0.999 * C), label="honest norm") for m in honest_messages for p in _ids(m)}
    honest = [_honest_cohort(m, norms) for m in honest_messages]
    sent = [
        Sent(r, m.metadata.message_id, len(_ids(m)), ({"aggregated": len(_ids(m))},))
        for m, r in zip(honest_messages, honest, strict=True)
    ]
    for to in hostile:  # every hostile worker answers its message at least once
        message, fates = _cohort_payload(data.draw, to)
        sent.append(Sent(message, to.metadata.message_id, len(_ids(to)), fates))
    attacks = ["forged-node"] if messages else []
    attacks += ["hostile"] * 4 if hostile else []
    attacks += ["stale"] if earlier else []
    attacks += ["duplicate-honest"] if honest else []
    for attack in data.draw(st.lists(st.sampled_from(attacks), max_size=6), label="attacks") if attacks else []:
        if attack == "hostile":
            to = data.draw(st.sampled_from(hostile))
            message, fates = _cohort_payload(data.draw, to)
            sent.append(Sent(message, to.metadata.message_id, len(_ids(to)), fates))
        elif attack == "forged-node":
            to = data.draw(st.sampled_from(messages))
            message, _ = _cohort_payload(data.draw, to)
            sent.append(Sent(_from_node(message, data.draw(st.sampled_from(_other_nodes(to)))), None, 0, ()))
        elif attack == "stale":
            to = data.draw(st.sampled_from(earlier))
            message = _honest_cohort(to) if data.draw(st.booleans()) else _cohort_payload(data.draw, to)[0]
            sent.append(Sent(message, None, 0, ()))
        else:
            to = honest_messages[data.draw(st.integers(0, len(honest_messages) - 1))]
            sent.append(Sent(_honest_cohort(to, norms), to.metadata.message_id, len(_ids(to)),
                             ({"aggregated": len(_ids(to))},)))  # fmt: skip
    order = data.draw(st.permutations(range(len(sent))), label="order")
    hostile_clients = sum(len(_ids(m)) for m in hostile)
    sampled = sum(len(_ids(m)) for m in messages)
    _check_round(strategy, reference, server_round, [sent[i] for i in order], honest, hostile_clients, sampled)
