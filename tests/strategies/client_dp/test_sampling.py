"""strategies/client_dp/sampling.py: the run's sampler, chosen by ``privacy.sampling``: the amplified samplers draw
what the randomness draws; the participation sampler enforces the rule, records who was sent a message once, and
checkpoints its record and key."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fl_app.config import compose_config
from fl_app.instructions import STREAM_SAMPLING
from fl_app.privacy.mechanisms.participation import ParticipationRule
from strategies.client_dp.randomness import RunRandomness
from strategies.client_dp.sampling import (
    AmplifiedSampler,
    ParticipationSampler,
    client_sampler,
)

SEEDED = RunRandomness(secure=False, seed=7, noise_key=None, sampling="poisson", sample_rate=0.25)
EVERYONE = range(20).__iter__  # never called by the amplified and cyclic samplers


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_the_amplified_sampler_draws_the_rounds_sample_from_the_sampling_stream(sampling: str) -> None:
    randomness = replace(SEEDED, sampling=sampling)
    sampler = AmplifiedSampler(20)
    for server_round in (1, 2, 9):
        sample = sampler.sample_clients(server_round, randomness, EVERYONE)
        expected = randomness.sample(20, randomness.round_rng(server_round, STREAM_SAMPLING))
        np.testing.assert_array_equal(sample.clients, expected)
        assert sample.refused == {}
    if sampling == "fixed":
        assert len(sampler.sample_clients(3, randomness, EVERYONE).clients) == 5
    assert sampler.state_dict(randomness) == {}


def test_the_cyclic_sampler_takes_each_client_every_b_rounds_and_refuses_what_the_record_forbids() -> None:
    rule = ParticipationRule(4, 2)
    sampler = ParticipationSampler(rule, "cyclic", 20, 5.0)
    seen: dict[int, list[int]] = {}
    for server_round in range(1, 13):
        sample = sampler.sample_clients(server_round, SEEDED, EVERYONE)
        sampler.round_released(server_round, [int(c) for c in sample.clients])
        for client in sample.clients.tolist():
            seen.setdefault(client, []).append(server_round)
    assert sorted(seen) == list(range(20))
    assert all(len(rounds) == 2 and rounds[1] - rounds[0] == 4 for rounds in seen.values())  # k = 2 caps the third
    assert sampler.refused_last_round == 5  # round 9: the first group again, after two rounds each
    assert sampler.groups_key == 7  # the seed, under seeded randomness


def test_a_released_round_is_recorded_once_and_the_record_and_key_round_trip() -> None:
    sampler = ParticipationSampler(ParticipationRule(2, 3), "cyclic", 10, 5.0)
    sampler.round_released(1, [3, 1, 3])
    sampler.round_released(1, [1, 3])  # a seeded repeat of a released round
    assert sampler.record.rounds_of(1) == (1,) and sampler.record.rounds_of(3) == (1,)
    state = sampler.state_dict(replace(SEEDED, secure=True))  # the key is drawn at its first use
    assert state["participation_key"] == sampler.groups_key
    restored = ParticipationSampler(ParticipationRule(2, 3), "cyclic", 10, 5.0)
    restored.load_state_dict(state)
    assert restored.record == sampler.record and restored.groups_key == sampler.groups_key
    with pytest.raises(ValueError, match="participation record and key"):
        restored.load_state_dict({"participation": state["participation"]})


def test_the_available_sampler_takes_up_to_m_eligible_clients_among_those_available() -> None:
    sampler = ParticipationSampler(ParticipationRule(3, 1), "available", 20, 4.0)
    first = sampler.sample_clients(1, SEEDED, lambda: [2, 4, 6, 8, 10, 12])
    assert len(first.clients) == 4 and set(first.clients.tolist()) <= {2, 4, 6, 8, 10, 12}
    sampler.round_released(1, first.clients.tolist())
    second = sampler.sample_clients(2, SEEDED, lambda: [2, 4, 6, 8, 10, 12])
    assert set(second.clients.tolist()).isdisjoint(first.clients.tolist())  # k = 1: the first four are done
    assert len(second.clients) == 2 and sampler.refused_last_round == 4


def test_canaries_follow_the_cyclic_groups_of_their_own_population() -> None:
    sampler = ParticipationSampler(ParticipationRule(4, 5), "cyclic", 20, 5.0)
    rounds = [set(sampler.sample(40, t, None, SEEDED).tolist()) for t in range(1, 5)]  # type: ignore[arg-type]
    assert set().union(*rounds) == set(range(40)) and sum(len(r) for r in rounds) == 40


def test_the_config_chooses_the_sampler() -> None:
    dense = compose_config(["dataset.num_clients=20"])
    assert client_sampler(dense.privacy, 20, 2.0) == AmplifiedSampler(20)
    ftrl = compose_config(["strategy=dp_ftrl_fedavg", "dataset.num_clients=20", "privacy.sample_rate=0.25"])
    sampler = client_sampler(ftrl.privacy, 20, 5.0)
    assert isinstance(sampler, ParticipationSampler) and sampler.sampling == "cyclic"
    assert sampler.rule == ParticipationRule(4, ftrl.privacy.max_participations)
    with pytest.raises(ValueError, match="not one of"):
        ParticipationSampler(ParticipationRule(4, 1), "poisson", 20, 5.0)
