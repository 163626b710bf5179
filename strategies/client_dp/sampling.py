"""Who takes part in a round (docs/mechanisms.md, 1): the run's sampler, chosen by ``privacy.sampling``.

- :class:`AmplifiedSampler` (``poisson``, ``fixed``): each client with probability q, or m = qM of them uniformly,
  drawn from the seeded stream (seed, t, SAMPLING) or the OS CSPRNG (strategies/client_dp/randomness.py). The
  sampled-Gaussian accountants assume this draw and that it stays secret (amplification by subsampling).
- :class:`ParticipationSampler` (``cyclic``, ``available``): the participation rule that DP-FTRL's accounting rests on
  instead (Kairouz et al. 2021; Choquette-Choo et al. 2023: any two rounds of a client at least b apart, at most k of
  them). The candidates are a cyclic group (b groups of a random order taken in turn) or up to m of the clients
  available now; the server enforces the rule — a client the :class:`ParticipationRecord` refuses is never sent a
  message — and records who was sent one once the round is released. The record and the groups' key are
  checkpointed.

A sampler is handed what it draws from on each call (the run's :class:`RunRandomness`, resolved once the run knows
where it happens; the clients available now), and returns the round's :class:`ClientSample`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any, Protocol

import numpy as np
from flwr.common.logger import log

from fl_app.config import DPConfig
from fl_app.core.choices import PARTICIPATION_SAMPLINGS
from fl_app.instructions import STREAM_PARTICIPATION_GROUPS, STREAM_SAMPLING
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.mechanisms.participation import (
    ParticipationRecord,
    ParticipationRule,
    available_sample,
    cyclic_groups,
    cyclic_sample,
)
from strategies.client_dp.randomness import RunRandomness


@dataclass(frozen=True)
class ClientSample:
    """A round's clients (partition ids, sorted as drawn) and those the participation rule refused, with why."""

    clients: np.ndarray
    refused: dict[int, str] = field(default_factory=dict)


class ClientSampler(Protocol):
    """The run's sampler: the round's clients, the canaries' draw over their own population, and what it must
    remember across rounds (checkpointed)."""

    def sample_clients(
        self, server_round: int, randomness: RunRandomness, available: Callable[[], Sequence[int]]
    ) -> ClientSample: ...

    def sample(
        self, population: int, server_round: int, rng: mech.RandomSource, randomness: RunRandomness
    ) -> np.ndarray: ...

    def round_released(self, server_round: int, clients: Sequence[int]) -> None: ...

    def state_dict(self, randomness: RunRandomness) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class AmplifiedSampler:
    """Poisson(q) or fixed-size sampling of the ``num_clients`` clients (:meth:`RunRandomness.sample`), secret when the
    randomness is. The canaries are drawn by the same code over their own population."""

    num_clients: int

    def sample_clients(
        self, server_round: int, randomness: RunRandomness, available: Callable[[], Sequence[int]]
    ) -> ClientSample:
        rng = randomness.round_rng(server_round, STREAM_SAMPLING)
        return ClientSample(self.sample(self.num_clients, server_round, rng, randomness))

    def sample(
        self, population: int, server_round: int, rng: mech.RandomSource, randomness: RunRandomness
    ) -> np.ndarray:
        return randomness.sample(population, rng)

    def round_released(self, server_round: int, clients: Sequence[int]) -> None:
        """Nothing to remember: each round's draw is independent."""

    def state_dict(self, randomness: RunRandomness) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore."""


class ParticipationSampler:
    """The participation rule's sampler (``cyclic`` or ``available``) over ``num_clients`` clients, up to
    ``expected_clients`` a round under ``available``; :attr:`record` is who took part in which round."""

    def __init__(self, rule: ParticipationRule, sampling: str, num_clients: int, expected_clients: float) -> None:
        if sampling not in PARTICIPATION_SAMPLINGS:
            raise ValueError(f"ParticipationSampler: sampling={sampling!r}, not one of {PARTICIPATION_SAMPLINGS}")
        self.rule, self.sampling = rule, sampling
        self.num_clients, self.expected_clients = num_clients, expected_clients
        #: Who took part in which round (checkpointed); a client the rule refuses is never sent a message.
        self.record = ParticipationRecord(rule)
        #: Keys the cyclic groups: drawn at first use (:meth:`RunRandomness.secret_key`: the seed, or a CSPRNG draw),
        #: then checkpointed. The privacy does not need the groups secret (the bound is the worst case over every
        #: pattern the rule allows).
        self.groups_key: int | None = None
        #: Clients the rule refused in the last sampled round (published: a function of the record, not of data).
        self.refused_last_round = 0

    def groups(self, population: int, randomness: RunRandomness) -> np.ndarray:
        """Each of ``population`` clients' cyclic group (b groups, sizes within one)."""
        if self.groups_key is None:
            self.groups_key = int(randomness.secret_key())
        rng = mech.make_rng(self.groups_key, 0, STREAM_PARTICIPATION_GROUPS, population)
        return cyclic_groups(population, self.rule.min_separation, rng)

    def sample_clients(
        self, server_round: int, randomness: RunRandomness, available: Callable[[], Sequence[int]]
    ) -> ClientSample:
        """A cyclic group, or up to m of the available clients; any the record refuses are dropped (and said why)."""
        refused: dict[int, str] = {}
        if self.sampling == "cyclic":
            candidates = [int(c) for c in cyclic_sample(self.groups(self.num_clients, randomness), server_round)]
        else:
            # Every available client asks to train; the rule refuses those that took part too recently or too often.
            rng = randomness.round_rng(server_round, STREAM_SAMPLING)
            chosen, refused = available_sample(list(available()), self.record, server_round,
                                               round(self.expected_clients), rng)  # fmt: skip
            candidates = [int(c) for c in chosen]
        eligible, also_refused = self.record.split(candidates, server_round)
        refused.update(also_refused)
        self.refused_last_round = len(refused)
        return ClientSample(np.asarray(sorted(eligible), dtype=np.int64), refused)

    def sample(
        self, population: int, server_round: int, rng: mech.RandomSource, randomness: RunRandomness
    ) -> np.ndarray:
        """The canaries follow the cyclic groups of their own population: every b rounds, within the rule."""
        return cyclic_sample(self.groups(population, randomness), server_round)

    def round_released(self, server_round: int, clients: Sequence[int]) -> None:
        """Every client sent a message took part, whether or not it answered; a seeded repeat of a round recorded
        before is not recorded twice."""
        new = [pid for pid in sorted(set(clients)) if server_round not in self.record.rounds_of(pid)]
        if new:
            self.record.record(new, server_round)

    def state_dict(self, randomness: RunRandomness) -> dict[str, Any]:
        if self.groups_key is None:
            self.groups_key = int(randomness.secret_key())
        return {"participation": self.record.state_dict(), "participation_key": int(self.groups_key)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "participation" not in state or "participation_key" not in state:
            raise ValueError("a DP-FTRL checkpoint holds its participation record and key")
        self.record.load_state_dict(state["participation"])
        self.groups_key = int(state["participation_key"])


def fixed_denominator(sampling: str, sample_rate: float, num_clients: int) -> float:
    """m = qM, the fixed denominator of every round's average: not rounded (docs/mechanisms.md, 3), but the whole
    number the fixed-size sampler draws under ``sampling="fixed"``."""
    if sampling == "fixed":
        return float(round(sample_rate * num_clients))
    return mech.expected_clients(num_clients, sample_rate)


def client_sampler(privacy: DPConfig, num_clients: int, expected_clients: float) -> ClientSampler:
    """The sampler ``privacy.sampling`` names (``auto`` was resolved by the config)."""
    if privacy.sampling in PARTICIPATION_SAMPLINGS:
        assert privacy.min_separation is not None and privacy.max_participations is not None  # the config's
        rule = ParticipationRule(privacy.min_separation, privacy.max_participations)
        return ParticipationSampler(rule, privacy.sampling, num_clients, expected_clients)
    return AmplifiedSampler(num_clients)


def log_refusals(server_round: int, refused: dict[int, str], name_clients: bool) -> None:
    """Log the clients the participation rule refused: by partition where raw statistics are published, else only
    how many (docs/PRIVACY.md, 3)."""
    if refused and name_clients:
        for client, reason in list(refused.items())[:5]:
            log(WARNING, "Round %d: client %d refused by the participation rule: %s", server_round, client, reason)
    elif refused:
        log(INFO, "Round %d: %d client(s) refused by the participation rule", server_round, len(refused))
