"""Enforced participation for DP-FTRL with correlated noise (matrix factorization): the b-min-separation schema of
Choquette-Choo et al., "(Amplified) Banded Matrix Factorization: A unified approach to private training"
(NeurIPS 2023, arXiv 2306.08153), as deployed for Gboard by Xu et al., "Federated Learning of Gboard Language Models
with Differential Privacy" (2023, arXiv 2305.18465).

The rule (:class:`ParticipationRule`): each client takes part in at most ``k`` rounds, and any two of its rounds
``t`` and ``t'`` are at least ``b`` apart, ``|t − t'| ≥ b``. Rounds are numbered 1, 2, … (Flower's
``server_round``), so in ``n`` rounds a client can take part at most ``⌈n/b⌉`` times (rounds 1, 1+b, 1+2b, …).

Why the server enforces it (:class:`ParticipationRecord`): the correlated-noise accounting computes the sensitivity
of the factorized mechanism as the worst case over *every* participation pattern that (b, k) allows; a pattern
outside that set is not covered by the reported ε. So the rule is a precondition of the privacy claim, and nothing
of it is left to the clients: the server keeps its own record of who took part when, refuses an ineligible client
before the round, and :meth:`ParticipationRecord.record` never writes down a violation (it raises instead).

No amplification, so no secrecy needed: unlike Poisson or fixed-size sampling (:mod:`.sampling`), neither sampler
here is credited with privacy amplification; the accounting is the worst case over all allowed patterns, so it holds
even if the adversary knows (or chooses) who takes part when. In particular the group assignment of
:func:`cyclic_groups` need not be secret: seeded groups are fine for privacy (the noise must still come from a
secret or CSPRNG stream, which is not this module's concern). :func:`cyclic_sample` (simulation: groups = b, each
client every b rounds) and :func:`available_sample` (deployment: whoever is connected and eligible) differ only in
utility and load, not in the privacy they give.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fl_app.privacy.mechanisms.randomness import RandomSource


def _is_int(value: object) -> bool:
    """True for Python or numpy integers, never for bools (``True`` is an ``int`` but not a count or a round)."""
    return not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, np.integer))


def _check_positive_int(name: str, value: object) -> int:
    if not _is_int(value) or int(value) < 1:  # type: ignore[call-overload]
        raise ValueError(f"{name} must be an integer ≥ 1, got {value!r}")
    return int(value)  # type: ignore[call-overload]


def _check_client(client: object) -> int:
    """Client ids are non-negative integers (partition ids, or Flower's unsigned 64-bit node ids)."""
    if not _is_int(client) or int(client) < 0:  # type: ignore[call-overload]
        raise ValueError(f"a client id must be a non-negative integer, got {client!r}")
    return int(client)  # type: ignore[call-overload]


def _ceil_div(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)


@dataclass(frozen=True)
class ParticipationRule:
    """Each client at most ``max_participations`` (k) times, any two of its rounds at least ``min_separation`` (b)
    apart. The accountant is run for exactly this (b, k); the server enforces it so that the accounting's worst case
    covers what actually happened.
    """

    min_separation: int
    max_participations: int

    def __post_init__(self) -> None:
        # Normalised to plain ints so that equality, hashing and JSON never depend on numpy scalar types.
        object.__setattr__(self, "min_separation", _check_positive_int("min_separation", self.min_separation))
        object.__setattr__(
            self, "max_participations", _check_positive_int("max_participations", self.max_participations)
        )

    @classmethod
    def for_run(cls, min_separation: int, rounds: int, max_participations: int | None = None) -> ParticipationRule:
        """The rule for a run of ``rounds`` rounds: k defaults to ⌈rounds/b⌉, the most that b-separation allows in
        that many rounds, and a larger given k is capped there (a k that can never be reached would only make the
        accounting look at patterns that cannot happen, and the accountant's k must match the server's).
        """
        separation = _check_positive_int("min_separation", min_separation)
        most = _ceil_div(_check_positive_int("rounds", rounds), separation)
        if max_participations is None:
            return cls(min_separation=separation, max_participations=most)
        k = min(_check_positive_int("max_participations", max_participations), most)
        return cls(min_separation=separation, max_participations=k)

    def max_participations_in(self, rounds: int) -> int:
        """The most rounds one client can take part in within rounds 1..``rounds``: min(k, ⌈rounds/b⌉)."""
        if not _is_int(rounds) or int(rounds) < 0:
            raise ValueError(f"rounds must be a non-negative integer, got {rounds!r}")
        return min(self.max_participations, _ceil_div(int(rounds), self.min_separation))

    def refusal(self, rounds_taken: Sequence[int], server_round: int) -> str | None:
        """Why a client that took part in ``rounds_taken`` may not take part in ``server_round``, or None if it may.

        The count is reported first (it never clears); otherwise the latest round that is too close, which names the
        round to wait out. A taken round at or after ``server_round`` is refused as too close as well (b ≥ 1), so a
        round is never taken twice and histories stay strictly increasing.
        """
        current = _check_positive_int("server_round", server_round)
        taken = [_check_positive_int("a round taken", r) for r in rounds_taken]
        b, k = self.min_separation, self.max_participations
        if len(taken) >= k:
            return f"took part k={k} times already (rounds {', '.join(str(r) for r in taken)})"
        too_close = [r for r in taken if r > current - b]
        if too_close:
            return f"took part in round {max(too_close)}, fewer than b={b} rounds before round {current}"
        return None

    def allows(self, rounds_taken: Sequence[int], server_round: int) -> bool:
        """True iff fewer than k rounds were taken and every one is at most ``server_round − b``."""
        return self.refusal(rounds_taken, server_round) is None

    def describe(self) -> str:
        """One line for logs and reports, naming the (b, k) the accountant must be run for."""
        return f"each client at most k={self.max_participations} times, at least b={self.min_separation} rounds apart"


class ParticipationRecord:
    """The server's own record of which rounds each client took part in, and the gate that enforces the rule.

    Kept by the server because the accounting assumes the rule holds and nothing trusts the clients to say when
    they last took part. :meth:`record` is the only way in and never writes down a violation; a loaded state
    (:meth:`load_state_dict`, e.g. after a restart) is checked just as strictly.
    """

    __hash__ = None  # type: ignore[assignment]  # mutable: equal records may differ later

    def __init__(self, rule: ParticipationRule) -> None:
        if not isinstance(rule, ParticipationRule):
            raise TypeError(f"rule must be a ParticipationRule, got {type(rule).__name__}")
        self._rule = rule
        self._rounds: dict[int, list[int]] = {}

    @property
    def rule(self) -> ParticipationRule:
        return self._rule

    def rounds_of(self, client: int) -> tuple[int, ...]:
        """The rounds ``client`` took part in, increasing (empty if never)."""
        return tuple(self._rounds.get(_check_client(client), ()))

    def refusal(self, client: int, server_round: int) -> str | None:
        """Why ``client`` may not take part in ``server_round`` (None if it may)."""
        return self._rule.refusal(self.rounds_of(client), server_round)

    def eligible(self, client: int, server_round: int) -> bool:
        return self.refusal(client, server_round) is None

    def split(self, candidates: Iterable[int], server_round: int) -> tuple[list[int], dict[int, str]]:
        """The eligible candidates in input order, and the refused ones with why; a repeated candidate is looked at
        once (its first place), since a client takes part in a round at most once.
        """
        _check_positive_int("server_round", server_round)
        eligible: list[int] = []
        refused: dict[int, str] = {}
        seen: set[int] = set()
        for candidate in candidates:
            client = _check_client(candidate)
            if client in seen:
                continue
            seen.add(client)
            reason = self.refusal(client, server_round)
            if reason is None:
                eligible.append(client)
            else:
                refused[client] = reason
        return eligible, refused

    def record(self, clients: Iterable[int], server_round: int) -> None:
        """Write down that ``clients`` took part in ``server_round``; all or nothing.

        Raises ValueError (and records nothing) if any client is not eligible or is named twice: a violation must
        stop the round rather than end up in the record, because the accounting would not cover it.
        """
        current = _check_positive_int("server_round", server_round)
        ids = [_check_client(client) for client in clients]
        problems: list[str] = []
        seen: set[int] = set()
        for client in ids:
            if client in seen:
                problems.append(f"client {client} named twice for round {current}")
                continue
            seen.add(client)
            reason = self.refusal(client, current)
            if reason is not None:
                problems.append(f"client {client} {reason}")
        if problems:
            raise ValueError(f"cannot record round {current} under '{self._rule.describe()}': " + "; ".join(problems))
        for client in ids:
            self._rounds.setdefault(client, []).append(current)

    def violations(self) -> list[str]:
        """Every way the stored history breaks the rule (empty for a record built through :meth:`record`): each
        client's rounds are replayed in order through the rule, which also catches rounds out of order or repeated.
        """
        return _violations(self._rule, self._rounds)

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the rule and ``{str(client): [rounds]}`` (JSON object keys are strings)."""
        return {
            "rule": {
                "min_separation": self._rule.min_separation,
                "max_participations": self._rule.max_participations,
            },
            "rounds": {str(client): list(rounds) for client, rounds in sorted(self._rounds.items())},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the record with ``state`` (as written by :meth:`state_dict`), after checking it as strictly as
        :meth:`record` would have: the same rule (the accountant was run for this one), positive integer rounds,
        strictly increasing per client, and no violation. Raises ValueError, leaving the record unchanged.
        """
        if not isinstance(state, dict) or set(state) != {"rule", "rounds"}:
            raise ValueError("a participation state must be a dict with exactly the keys 'rule' and 'rounds'")
        rule_state = state["rule"]
        if not isinstance(rule_state, dict) or set(rule_state) != {"min_separation", "max_participations"}:
            raise ValueError("the state's rule must have exactly 'min_separation' and 'max_participations'")
        try:
            rule = ParticipationRule(**rule_state)
        except ValueError as error:
            raise ValueError(f"the state's rule is invalid: {error}") from error
        if rule != self._rule:
            raise ValueError(
                f"the state was kept under '{rule.describe()}', not this record's '{self._rule.describe()}'"
            )
        rounds_state = state["rounds"]
        if not isinstance(rounds_state, dict):
            raise ValueError("the state's rounds must be a dict {client id: [rounds]}")
        loaded: dict[int, list[int]] = {}
        for key, rounds in rounds_state.items():
            client = _parse_client_key(key)
            if client in loaded:
                raise ValueError(f"client {client} appears twice in the state")
            if not isinstance(rounds, list) or not rounds:
                raise ValueError(f"client {client}'s rounds must be a non-empty list, got {rounds!r}")
            for r in rounds:
                if not _is_int(r) or int(r) < 1:
                    raise ValueError(f"client {client}'s rounds must be integers ≥ 1, got {r!r}")
            as_ints = [int(r) for r in rounds]
            if any(later <= earlier for earlier, later in itertools.pairwise(as_ints)):
                raise ValueError(f"client {client}'s rounds must be strictly increasing, got {as_ints}")
            loaded[client] = as_ints
        problems = _violations(self._rule, loaded)
        if problems:
            raise ValueError("the state breaks the participation rule: " + "; ".join(problems))
        self._rounds = loaded

    def __len__(self) -> int:
        """The number of clients that took part at least once."""
        return len(self._rounds)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ParticipationRecord):
            return NotImplemented
        return self._rule == other._rule and self._rounds == other._rounds

    def __repr__(self) -> str:
        return f"ParticipationRecord({self._rule!r}, clients={len(self)})"


def _parse_client_key(key: object) -> int:
    """A client id from a JSON key: the canonical decimal ``str(client)`` only, so that two keys cannot name the same
    client (``"7"`` and ``"07"``) and slip a second history past the checks.
    """
    if isinstance(key, str) and key.isascii() and key.isdigit() and str(int(key)) == key:
        return int(key)
    raise ValueError(f"a client key must be str(client id) for a non-negative integer id, got {key!r}")


def _violations(rule: ParticipationRule, rounds: dict[int, list[int]]) -> list[str]:
    problems: list[str] = []
    for client, history in sorted(rounds.items()):
        for i, r in enumerate(history):
            if not _is_int(r) or int(r) < 1:
                problems.append(f"client {client}: round {r!r} is not an integer ≥ 1")
                break
            reason = rule.refusal(history[:i], r)
            if reason is not None:
                problems.append(f"client {client} in round {r}: {reason}")
    return problems


def cyclic_groups(population: int, groups: int, rng: RandomSource) -> np.ndarray:
    """``group_of[client]`` in 0..groups−1: a uniformly random permutation of the clients cut into ``groups``
    consecutive groups whose sizes differ by at most one (the first ``population mod groups`` have ⌈M/g⌉ clients).

    With groups = b and :func:`cyclic_sample`, every client takes part exactly every b rounds. The assignment need
    not be secret (the accounting gives no amplification), so a seeded ``rng`` is fine; the shuffle only keeps
    the groups from following the clients' numbering (e.g. data partitions in order).
    """
    size = _check_positive_int("population", population)
    count = _check_positive_int("groups", groups)
    if count > size:
        raise ValueError(f"groups must be at most the population ({size}), got {count}")
    # choice(M, M, replace=False) is a uniform permutation for both np.random.Generator and SecureRandom.
    order = np.asarray(rng.choice(size, size=size, replace=False), dtype=np.int64)
    base, extra = divmod(size, count)
    sizes = np.full(count, base, dtype=np.int64)
    sizes[:extra] += 1
    group_of = np.empty(size, dtype=np.int64)
    group_of[order] = np.repeat(np.arange(count, dtype=np.int64), sizes)
    return group_of


def cyclic_sample(group_of: np.ndarray, server_round: int) -> np.ndarray:
    """Sorted ids of the clients in group (server_round − 1) mod groups (round 1 → group 0), where groups is
    ``group_of.max() + 1``. With groups = b each client is taken exactly every b rounds, so the rule with
    min_separation b holds for any k ≥ ⌈rounds/b⌉ (the record still checks it).
    """
    current = _check_positive_int("server_round", server_round)
    groups_of = np.asarray(group_of)
    if groups_of.ndim != 1 or groups_of.size == 0 or not np.issubdtype(groups_of.dtype, np.integer):
        raise ValueError("group_of must be a non-empty 1-D integer array (from cyclic_groups)")
    if int(groups_of.min()) < 0:
        raise ValueError("group_of must hold group indices ≥ 0")
    groups = int(groups_of.max()) + 1
    return np.flatnonzero(groups_of == (current - 1) % groups).astype(np.int64)


def available_sample(
    candidates: Sequence[int],
    record: ParticipationRecord,
    server_round: int,
    size: int,
    rng: RandomSource,
) -> tuple[np.ndarray, dict[int, str]]:
    """The deployment sampler: of the clients available now (``candidates``, duplicates collapsed), those the record
    allows in ``server_round``, at most ``size`` of them uniformly at random (sorted); and the refused ones with why.

    The eligible ids are sorted before the draw so that a seeded ``rng`` gives the same choice whatever order the
    candidates arrive in. The draw is for fairness and load only (no amplification is claimed). Nothing is
    recorded here: the caller records the clients whose updates went into the released round.
    """
    current = _check_positive_int("server_round", server_round)
    if not _is_int(size) or int(size) < 0:
        raise ValueError(f"size must be a non-negative integer, got {size!r}")
    unique = sorted({_check_client(candidate) for candidate in candidates})
    eligible, refused = record.split(unique, current)
    if len(eligible) <= int(size):
        return np.asarray(eligible, dtype=np.int64), refused
    picks = np.asarray(rng.choice(len(eligible), size=int(size), replace=False), dtype=np.int64)
    chosen = np.sort(np.asarray(eligible, dtype=np.int64)[picks])
    return chosen, refused
