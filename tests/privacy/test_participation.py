"""The enforced b-min-separation participation schema for correlated-noise DP-FTRL
(fl_app/privacy/mechanisms/participation.py; Choquette-Choo et al. 2023, arXiv 2306.08153; Xu et al. 2023,
arXiv 2305.18465): the rule, the server's record (which must never hold a violation, since the accounting's worst
case only covers the patterns the rule allows), its checked state, and the two samplers.

The property tests replay the rule independently (:func:`_obeys`) instead of asking the module, so a bug in the
rule's own check cannot hide a violation. Hypothesis runs derandomized, without a database: the suite stays
deterministic.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import strategies  # noqa: F401  (registers the strategy names the configs here are validated by)
from fl_app.privacy.mechanisms.participation import (
    ParticipationRecord,
    ParticipationRule,
    available_sample,
    cyclic_groups,
    cyclic_sample,
)
from fl_app.privacy.mechanisms.randomness import SecureRandom

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None)


def _obeys(rounds: Sequence[int], b: int, k: int) -> bool:
    """The rule, written out on its own: at most k rounds, strictly increasing, consecutive ones ≥ b apart
    (consecutive suffices once the rounds increase)."""
    return len(rounds) <= k and all(later - earlier >= b for earlier, later in itertools.pairwise(rounds))


def _record_with(rule: ParticipationRule, history: dict[int, list[int]]) -> ParticipationRecord:
    """A record built round by round through ``record`` (the only way in)."""
    record = ParticipationRecord(rule)
    for server_round in sorted({r for rounds in history.values() for r in rounds}):
        record.record([c for c, rounds in history.items() if server_round in rounds], server_round)
    return record


# ----- the rule ---------------------------------------------------------------------------------------------------


def test_rule_allows_exactly_rounds_at_least_b_after_every_taken_one_and_fewer_than_k() -> None:
    rule = ParticipationRule(min_separation=5, max_participations=2)
    assert rule.allows([], 1)
    assert rule.allows([2], 7)
    assert not rule.allows([2], 6)
    assert not rule.allows([2], 2)  # the same round twice
    assert not rule.allows([9], 4)  # a recorded round after the asked one
    assert not rule.allows([1, 6], 50)  # k reached


def test_refusal_names_the_round_and_the_count() -> None:
    rule = ParticipationRule(min_separation=5, max_participations=2)
    assert rule.refusal([2], 7) is None
    too_close = rule.refusal([7], 10)
    assert too_close is not None and "round 7" in too_close and "b=5" in too_close
    too_many = rule.refusal([1, 6], 50)
    assert too_many is not None and "k=2" in too_many and "times" in too_many


def test_describe_names_b_and_k() -> None:
    text = ParticipationRule(min_separation=4, max_participations=3).describe()
    assert "3" in text and "4" in text and "at most" in text and "apart" in text


@pytest.mark.parametrize("bad", [0, -1, 1.0, 2.5, True, "3", None])
def test_rule_refuses_non_positive_or_non_integer_parameters(bad: Any) -> None:
    with pytest.raises(ValueError):
        ParticipationRule(min_separation=bad, max_participations=1)
    with pytest.raises(ValueError):
        ParticipationRule(min_separation=1, max_participations=bad)


def test_rule_normalises_numpy_integers_to_plain_ints() -> None:
    rule = ParticipationRule(min_separation=np.int64(3), max_participations=np.int32(2))  # type: ignore[arg-type]
    assert type(rule.min_separation) is int and type(rule.max_participations) is int
    assert rule == ParticipationRule(3, 2)


def test_for_run_defaults_k_to_ceil_rounds_over_b_and_caps_a_given_k() -> None:
    assert ParticipationRule.for_run(5, 20) == ParticipationRule(5, 4)
    assert ParticipationRule.for_run(5, 21) == ParticipationRule(5, 5)
    assert ParticipationRule.for_run(5, 21, max_participations=2) == ParticipationRule(5, 2)
    assert ParticipationRule.for_run(5, 21, max_participations=100) == ParticipationRule(5, 5)
    assert ParticipationRule.for_run(1, 7) == ParticipationRule(1, 7)
    with pytest.raises(ValueError):
        ParticipationRule.for_run(5, 0)
    with pytest.raises(ValueError):
        ParticipationRule.for_run(5, 10, max_participations=0)


def test_max_participations_in_is_min_of_k_and_ceil_rounds_over_b() -> None:
    rule = ParticipationRule(min_separation=3, max_participations=4)
    assert [rule.max_participations_in(n) for n in (0, 1, 3, 4, 7, 9, 10, 100)] == [0, 1, 1, 2, 3, 3, 4, 4]
    with pytest.raises(ValueError):
        rule.max_participations_in(-1)


@given(b=st.integers(1, 6), n=st.integers(1, 40))
@SETTINGS
def test_ceil_n_over_b_is_the_most_that_b_separation_allows(b: int, n: int) -> None:
    """The greedy pattern 1, 1+b, 1+2b, … takes ⌈n/b⌉ rounds and the record accepts it; one more never fits."""
    rule = ParticipationRule.for_run(b, n)
    record = ParticipationRecord(rule)
    for server_round in range(1, n + 1):
        if record.eligible(0, server_round):
            record.record([0], server_round)
    assert len(record.rounds_of(0)) == math.ceil(n / b) == rule.max_participations == rule.max_participations_in(n)


# ----- the record -------------------------------------------------------------------------------------------------


def test_record_keeps_rounds_and_refuses_a_violation_without_recording_anything() -> None:
    record = ParticipationRecord(ParticipationRule(min_separation=3, max_participations=2))
    record.record([1, 2], 1)
    assert record.rounds_of(1) == (1,) and record.rounds_of(3) == () and len(record) == 2
    with pytest.raises(ValueError, match="round 1"):
        record.record([3, 1], 2)  # client 1 is too close: nothing of round 2 is written, client 3 neither
    assert record.rounds_of(3) == () and record.rounds_of(1) == (1,)
    record.record([1, 3], 4)
    with pytest.raises(ValueError, match="k=2"):
        record.record([1], 10)
    assert record.violations() == []


def test_record_refuses_the_same_round_twice() -> None:
    record = ParticipationRecord(ParticipationRule(min_separation=1, max_participations=10))
    with pytest.raises(ValueError, match="twice"):
        record.record([4, 4], 1)
    assert len(record) == 0
    record.record([4], 1)
    with pytest.raises(ValueError, match="round 1"):
        record.record([4], 1)
    assert record.rounds_of(4) == (1,)


@pytest.mark.parametrize("bad_round", [0, -2, 1.5, True])
def test_record_refuses_bad_rounds(bad_round: Any) -> None:
    with pytest.raises(ValueError):
        ParticipationRecord(ParticipationRule(1, 1)).record([0], bad_round)


@pytest.mark.parametrize("bad_client", [-1, 2.0, "3", None, False])
def test_record_refuses_bad_client_ids(bad_client: Any) -> None:
    with pytest.raises(ValueError):
        ParticipationRecord(ParticipationRule(1, 1)).record([bad_client], 1)


def test_record_needs_a_rule() -> None:
    with pytest.raises(TypeError):
        ParticipationRecord((2, 3))  # type: ignore[arg-type]


def test_split_keeps_input_order_collapses_repeats_and_gives_reasons() -> None:
    record = _record_with(ParticipationRule(min_separation=4, max_participations=2), {5: [1, 5], 2: [3]})
    eligible, refused = record.split([9, 2, 5, 7, 9, 2], 6)
    assert eligible == [9, 7]
    assert set(refused) == {2, 5}
    assert "round 3" in refused[2] and "k=2" in refused[5]
    assert record.eligible(9, 6) and not record.eligible(2, 6) and record.refusal(2, 7) is None


def test_records_compare_by_rule_and_history() -> None:
    rule = ParticipationRule(2, 3)
    a, b = ParticipationRecord(rule), ParticipationRecord(rule)
    assert a == b
    a.record([1], 1)
    assert a != b
    b.record([1], 1)
    assert a == b
    assert ParticipationRecord(ParticipationRule(2, 2)) != ParticipationRecord(rule)
    assert a != {"rule": {}}


# ----- state ------------------------------------------------------------------------------------------------------


def _some_record() -> ParticipationRecord:
    return _record_with(ParticipationRule(min_separation=3, max_participations=2), {0: [1, 4], 7: [2], 12: [3, 9]})


def test_state_dict_is_json_and_round_trips() -> None:
    record = _some_record()
    state = json.loads(json.dumps(record.state_dict()))
    assert state == {
        "rule": {"min_separation": 3, "max_participations": 2},
        "rounds": {"0": [1, 4], "7": [2], "12": [3, 9]},
    }
    loaded = ParticipationRecord(record.rule)
    loaded.load_state_dict(state)
    assert loaded == record and loaded.violations() == []


def _tampered(change: str) -> dict[str, Any]:
    state = copy.deepcopy(_some_record().state_dict())
    rounds = state["rounds"]
    if change == "too close":
        rounds["7"] = [2, 4]
    elif change == "too many":
        rounds["0"] = [1, 4, 7]
    elif change == "wrong rule":
        state["rule"]["min_separation"] = 2
    elif change == "decreasing":
        rounds["12"] = [9, 3]
    elif change == "repeated":
        rounds["7"] = [2, 2]
    elif change == "round zero":
        rounds["7"] = [0]
    elif change == "float round":
        rounds["7"] = [2.0]
    elif change == "bool round":
        rounds["7"] = [True]
    elif change == "empty":
        rounds["7"] = []
    elif change == "not a list":
        rounds["7"] = 2
    elif change == "odd key":
        rounds["07"] = rounds.pop("7")
    elif change == "negative key":
        rounds["-7"] = rounds.pop("7")
    elif change == "extra key":
        state["version"] = 2
    elif change == "bad rule":
        state["rule"]["max_participations"] = 0
    return state


@pytest.mark.parametrize(
    "change",
    [
        "too close",
        "too many",
        "wrong rule",
        "decreasing",
        "repeated",
        "round zero",
        "float round",
        "bool round",
        "empty",
        "not a list",
        "odd key",
        "negative key",
        "extra key",
        "bad rule",
    ],
)
def test_a_tampered_state_is_refused_and_the_record_left_unchanged(change: str) -> None:
    record = _record_with(ParticipationRule(min_separation=3, max_participations=2), {1: [5]})
    before = record.state_dict()
    with pytest.raises(ValueError):
        record.load_state_dict(json.loads(json.dumps(_tampered(change))))
    assert record.state_dict() == before


def test_tampered_state_errors_say_what_is_wrong() -> None:
    record = ParticipationRecord(ParticipationRule(min_separation=3, max_participations=2))
    with pytest.raises(ValueError, match="round 2"):
        record.load_state_dict(_tampered("too close"))
    with pytest.raises(ValueError, match="k=2"):
        record.load_state_dict(_tampered("too many"))
    with pytest.raises(ValueError, match="b=2"):
        record.load_state_dict(_tampered("wrong rule"))
    with pytest.raises(ValueError, match="increasing"):
        record.load_state_dict(_tampered("decreasing"))


# ----- cyclic groups ----------------------------------------------------------------------------------------------


@given(population=st.integers(1, 60), data=st.data(), seed=st.integers(0, 2**32 - 1))
@SETTINGS
def test_cyclic_groups_partition_the_population_into_near_equal_groups(
    population: int, data: st.DataObject, seed: int
) -> None:
    groups = data.draw(st.integers(1, population))
    group_of = cyclic_groups(population, groups, np.random.default_rng(seed))
    assert group_of.dtype == np.int64 and group_of.shape == (population,)
    assert group_of.min() >= 0 and group_of.max() < groups
    sizes = np.bincount(group_of, minlength=groups)
    big, extra = -(-population // groups), population % groups
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == population
    if extra:
        assert list(sizes) == [big] * extra + [big - 1] * (groups - extra)
    else:
        assert set(sizes.tolist()) == {population // groups}
    members = np.concatenate([cyclic_sample(group_of, g + 1) for g in range(groups)])
    assert sorted(members.tolist()) == list(range(population))  # every client in exactly one group


def test_cyclic_groups_are_seeded_and_shuffled() -> None:
    first = cyclic_groups(100, 7, np.random.default_rng(3))
    assert np.array_equal(first, cyclic_groups(100, 7, np.random.default_rng(3)))
    assert not np.array_equal(first, cyclic_groups(100, 7, np.random.default_rng(4)))
    assert not np.array_equal(first, np.repeat(np.arange(7), np.bincount(first)))  # not in the clients' order


def test_cyclic_groups_work_with_the_os_csprng() -> None:
    group_of = cyclic_groups(23, 5, SecureRandom())
    assert sorted(np.bincount(group_of).tolist()) == [4, 4, 5, 5, 5]


@pytest.mark.parametrize(("population", "groups"), [(3, 4), (0, 1), (5, 0), (5, -1), (5, 2.0), (True, 1)])
def test_cyclic_groups_validate(population: Any, groups: Any) -> None:
    with pytest.raises(ValueError):
        cyclic_groups(population, groups, np.random.default_rng(0))


def test_cyclic_sample_goes_round_the_groups_from_group_zero() -> None:
    group_of = np.array([1, 0, 2, 0, 1, 2, 2], dtype=np.int64)
    assert cyclic_sample(group_of, 1).tolist() == [1, 3]
    assert cyclic_sample(group_of, 2).tolist() == [0, 4]
    assert cyclic_sample(group_of, 3).tolist() == [2, 5, 6]
    assert cyclic_sample(group_of, 4).tolist() == [1, 3]
    assert cyclic_sample(group_of, 1).dtype == np.int64
    for bad in (0, -1, 1.0):
        with pytest.raises(ValueError):
            cyclic_sample(group_of, bad)  # type: ignore[arg-type]
    for bad_groups in (np.array([], dtype=np.int64), np.array([0.0, 1.0]), np.array([[0]]), np.array([0, -1])):
        with pytest.raises(ValueError):
            cyclic_sample(bad_groups, 1)


@given(
    population=st.integers(1, 40),
    data=st.data(),
    rounds=st.integers(1, 60),
    seed=st.integers(0, 2**32 - 1),
)
@SETTINGS
def test_cyclic_runs_never_break_the_rule_with_b_groups(
    population: int, data: st.DataObject, rounds: int, seed: int
) -> None:
    """groups = b, k = ⌈n/b⌉: every round's group is eligible in full, ``record`` accepts every round, and every
    client's history obeys the rule (checked independently)."""
    b = data.draw(st.integers(1, population))
    rule = ParticipationRule.for_run(b, rounds)
    assert rule == ParticipationRule(b, math.ceil(rounds / b))
    group_of = cyclic_groups(population, b, np.random.default_rng(seed))
    record = ParticipationRecord(rule)
    for server_round in range(1, rounds + 1):
        chosen = cyclic_sample(group_of, server_round)
        eligible, refused = record.split(chosen.tolist(), server_round)
        assert refused == {} and eligible == chosen.tolist()
        record.record(chosen.tolist(), server_round)
    assert record.violations() == []
    for client in range(population):
        history = record.rounds_of(client)
        assert _obeys(history, b, rule.max_participations)
        assert history == tuple(range(int(group_of[client]) + 1, rounds + 1, b))  # exactly every b rounds


# ----- availability-driven sampling -------------------------------------------------------------------------------


@given(
    b=st.integers(1, 5),
    k=st.integers(1, 4),
    size=st.integers(0, 8),
    seed=st.integers(0, 2**32 - 1),
    availability=st.lists(st.lists(st.integers(0, 15), max_size=20), min_size=1, max_size=30),
)
@SETTINGS
def test_available_sample_and_record_never_break_the_rule(
    b: int, k: int, size: int, seed: int, availability: list[list[int]]
) -> None:
    rule = ParticipationRule(min_separation=b, max_participations=k)
    record = ParticipationRecord(rule)
    rng = np.random.default_rng(seed)
    for server_round, candidates in enumerate(availability, start=1):
        chosen, refused = available_sample(candidates, record, server_round, size, rng)
        assert chosen.dtype == np.int64 and np.all(np.diff(chosen) > 0)  # sorted, no repeats
        picked = set(chosen.tolist())
        eligible = set(candidates) - set(refused)
        assert set(refused) <= set(candidates) and picked <= eligible
        assert len(picked) == min(size, len(eligible))
        for client, reason in refused.items():
            assert not _obeys([*record.rounds_of(client), server_round], b, k) and reason
        for client in eligible:
            assert _obeys([*record.rounds_of(client), server_round], b, k)
        record.record(chosen.tolist(), server_round)
    assert record.violations() == []
    for client in range(16):
        assert _obeys(record.rounds_of(client), b, k)
    restored = ParticipationRecord(rule)
    restored.load_state_dict(json.loads(json.dumps(record.state_dict())))
    assert restored == record


def test_available_sample_ignores_candidate_order_and_repeats_and_does_not_record() -> None:
    record = _record_with(ParticipationRule(min_separation=2, max_participations=3), {3: [4]})
    candidates = [8, 3, 1, 6, 9, 2, 7, 5]
    a, refused_a = available_sample(candidates, record, 5, 3, np.random.default_rng(11))
    b, refused_b = available_sample([*candidates[::-1], 8, 1], record, 5, 3, np.random.default_rng(11))
    assert np.array_equal(a, b) and refused_a == refused_b and set(refused_a) == {3}
    assert "round 4" in refused_a[3]
    assert len(a) == 3 and 3 not in a.tolist()
    assert record.rounds_of(8) == () and len(record) == 1


def test_available_sample_takes_everyone_eligible_when_they_fit_and_works_with_the_os_csprng() -> None:
    record = ParticipationRecord(ParticipationRule(1, 1))
    chosen, refused = available_sample([4, 2, 2, 9], record, 1, 10, SecureRandom())
    assert chosen.tolist() == [2, 4, 9] and refused == {}
    chosen, _ = available_sample(list(range(50)), record, 1, 7, SecureRandom())
    assert len(set(chosen.tolist())) == 7 and np.all(np.diff(chosen) > 0)
    empty, _ = available_sample([], record, 1, 3, SecureRandom())
    assert empty.dtype == np.int64 and empty.size == 0


@pytest.mark.parametrize(("server_round", "size"), [(0, 1), (1, -1), (1, 1.5), (True, 1)])
def test_available_sample_validates(server_round: Any, size: Any) -> None:
    with pytest.raises(ValueError):
        available_sample(
            [1], ParticipationRecord(ParticipationRule(1, 1)), server_round, size, np.random.default_rng(0)
        )
