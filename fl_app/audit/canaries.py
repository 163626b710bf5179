"""Canary clients inside a run: who is inserted, who joins which round, what each sends, what the run learns.

Andrew, Kairouz, Oh, Oprea, McMahan, Suriyakumar, "One-shot Empirical Privacy Estimation for Federated Learning"
(ICLR 2024) and Steinke, Nasr, Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023).

K canary clients own no data. Canary i has a fixed random unit direction u_i (:func:`~fl_app.privacy.audit.
canary_direction`, from the audit's own stream, never from a training stream). Each canary is *inserted* with
probability ½, independently (Steinke et al.'s randomisation; the others are Andrew et al.'s null set). Which
canaries join a round is drawn by the strategy's own sampler (the code that samples the real clients, with its rate,
its kind — Poisson or fixed size — and its randomness, seeded or CSPRNG) over the K canaries, and the inserted ones
among them join: a sampler that takes more clients than the accountant assumes takes more canaries too, and the audit
sees it. Each canary's update before the mechanism is ``canary_scale · C · u_i``. The
strategy sends it down the client mechanism path of its recipe (mask, clip) and then treats it as a reply (round
mask, server re-clip, sum) — but a canary adds no noise of its own and is not counted in m: the released round is
exactly the accounted mechanism with a few more clients in the sum.

After each round the model delta Δ_t = w_t − w_{t−1} is kept (``<run dir>/audit/delta_XXXXX.npy``: the released
models are published anyway); when the audit is evaluated the dot products ⟨u_i, Δ_t⟩ of every canary with every
round not yet scored are computed (K·d normal draws per evaluation, or K·s with sparse canaries of ``audit.support``
= s coordinates); the deltas are dropped when the run ends.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fl_app.config import AuditConfig
from fl_app.core.atomic import atomic_write
from fl_app.core.choices import GuessRule
from fl_app.privacy import audit as stats
from fl_app.privacy.mechanisms import make_rng

AUDIT_FILE = "audit.npz"
#: The audit's other draws: (seed, AUDIT_DRAWS, purpose[, round]). Not AUDIT_STREAM, whose (seed, AUDIT_STREAM, i)
#: are the canaries' directions: an insertion coin must share no bits with a direction (Steinke et al. need the
#: coins independent of everything the adversary sees).
AUDIT_DRAWS = stats.AUDIT_STREAM + 1
# (2 was the canaries' own participation coins, before the round's sampler drew them: strategies/auditing.py.)
MEMBERSHIP, BOOTSTRAP = 1, 3
_DELTA_FILE = re.compile(r"delta_(\d{5,})\.npy$")


@dataclass(frozen=True)
class AuditResult:
    """One evaluation of the audit after ``round`` rounds."""

    round: int
    #: Andrew et al.'s estimate from the final model only, and from every released iterate (with CI bounds).
    estimate_final: stats.EpsilonEstimate
    estimate_iterates: stats.EpsilonEstimate
    #: Steinke et al.'s lower bound (from the all-iterates statistic), at δ = ``lower_bound.delta``.
    lower_bound: stats.LowerBound
    #: The accountant's ε at the run's δ, and at the lower bound's δ (None for a non-private reference).
    accountant_epsilon: float | None
    accountant_epsilon_at_bound_delta: float | None

    @property
    def violation(self) -> bool:
        """A statistically valid lower bound above the accountant's ε at the same δ: a mechanism leaks more than
        the accountant says."""
        bound = self.accountant_epsilon_at_bound_delta
        return bound is not None and self.lower_bound.epsilon > bound

    @property
    def alarm_epsilon(self) -> float:
        """The larger of the two estimates' interval lower ends: with ``confidence`` = 0.95 each is a one-sided
        97.5% lower end, so the larger of the two is above a true ε with probability at most about 5% (Bonferroni),
        as far as the bootstrap describes the estimates' error."""
        return max(self.estimate_final.low, self.estimate_iterates.low)

    @property
    def alarm(self) -> bool:
        """An estimate statistically above the accountant's ε at the run's δ (:attr:`alarm_epsilon` > ε): the
        measured leak is more than the accountant allows. An estimate-based alarm, not a proof (that is
        :attr:`violation`); its false-alarm rate on correct runs is measured in docs/audit.md."""
        epsilon = self.accountant_epsilon
        return epsilon is not None and self.alarm_epsilon > epsilon

    def record(self) -> dict[str, Any]:
        """The fields a metrics.jsonl round record and run.json get (flat numbers and one bool)."""
        return {
            "audit_eps_estimate_final": self.estimate_final.epsilon,
            "audit_eps_estimate_final_low": self.estimate_final.low,
            "audit_eps_estimate_final_high": self.estimate_final.high,
            "audit_eps_estimate_iterates": self.estimate_iterates.epsilon,
            "audit_eps_estimate_iterates_low": self.estimate_iterates.low,
            "audit_eps_estimate_iterates_high": self.estimate_iterates.high,
            "audit_eps_lower_bound": self.lower_bound.epsilon,
            "audit_lower_bound_delta": self.lower_bound.delta,
            "audit_accountant_eps_at_bound_delta": self.accountant_epsilon_at_bound_delta,
            "audit_violation": self.violation,
            "audit_alarm": self.alarm,
        }


class CanaryAudit:
    """The canaries of one run (see the module docstring)."""

    def __init__(
        self,
        config: AuditConfig,
        *,
        run_seed: int,
        clip_norm: float,
        delta: float,
        shapes: list[tuple[int, ...]],
        directory: Path | None = None,
    ) -> None:
        self.config = config
        self.seed = run_seed if config.seed is None else config.seed
        self.clip_norm = clip_norm
        self.delta = delta
        self.bound_delta = (
            min(delta, 0.01 / config.canaries) if config.lower_bound_delta is None else config.lower_bound_delta
        )
        self.shapes = [tuple(shape) for shape in shapes]
        self.size = int(sum(math.prod(shape) for shape in self.shapes))
        if config.support is not None and not 1 <= config.support <= self.size:
            raise ValueError(f"audit.support={config.support} must be in [1, {self.size}] (the model's size) or null")
        self.directory = directory
        k = config.canaries
        self.inserted = make_rng(self.seed, AUDIT_DRAWS, MEMBERSHIP).random(k) < 0.5
        # Dot products ⟨u_i, Δ_t⟩ (column t-1 = round t) and ‖Δ_t‖ of the rounds scored so far.
        self.dots = np.zeros((k, 0))
        self.delta_norms: list[float] = []
        #: Round -> the inserted canaries that joined it (recorded by :meth:`join`; kept in checkpoints).
        self.joined: dict[int, np.ndarray] = {}
        self._pending: dict[int, np.ndarray] = {}  # round -> flat Δ_t, when there is no directory
        self._initial: np.ndarray | None = None
        self._latest: np.ndarray | None = None

    # ----- during a round ---------------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """K, the number of canaries (inserted or not): the population the round's sampler draws canaries from."""
        return self.config.canaries

    def join(self, server_round: int, sampled: np.ndarray) -> list[int]:
        """Record and return the canaries that join round ``server_round``: the inserted ones among ``sampled``,
        the canary indices the round's sampler drew (a re-run of the round after a resume replaces its record)."""
        picked = np.zeros(self.count, dtype=bool)
        picked[np.asarray(sampled, dtype=np.int64)] = True
        joined = np.flatnonzero(self.inserted & picked).astype(np.int64)
        self.joined[server_round] = joined
        return [int(i) for i in joined]

    def participants(self, server_round: int) -> list[int]:
        """The inserted canaries that joined round ``server_round`` (none for a round not run)."""
        return [int(i) for i in self.joined.get(server_round, ())]

    def update(self, index: int, clip_norm: float | None = None) -> list[np.ndarray]:
        """Canary ``index``'s update before the mechanism: ``canary_scale · C · u_i`` in the model's shapes, with
        the round's C (adaptive clipping moves it; default: the C the audit was created with)."""
        scale = self.config.canary_scale * (self.clip_norm if clip_norm is None else clip_norm)
        if self.config.support is None:
            direction = stats.canary_direction(self.seed, index, self.size)
        else:
            direction = stats.to_dense(
                *stats.sparse_canary_direction(self.seed, index, self.size, self.config.support), self.size
            )
        flat = direction * np.float32(scale)
        return _unflatten(flat, self.shapes)

    def observe(self, server_round: int, before: list[np.ndarray], after: list[np.ndarray]) -> None:
        """Keep round ``server_round``'s model delta (until the next evaluation scores it)."""
        flat_before, flat_after = _flatten(before), _flatten(after)
        if self._initial is None:
            self._initial = flat_before
        self._latest = flat_after
        delta = (flat_after.astype(np.float64) - flat_before).astype(np.float32)
        if self.directory is None:
            self._pending[server_round] = delta
            return
        with atomic_write(self.directory / f"delta_{server_round:05d}.npy", "wb") as fh:
            np.save(fh, delta)

    # ----- evaluation -------------------------------------------------------------------------------------------

    def _pending_rounds(self) -> dict[int, Path | np.ndarray]:
        scored = len(self.delta_norms)
        found: dict[int, Path | np.ndarray] = {r: d for r, d in self._pending.items() if r > scored}
        if self.directory is not None and self.directory.is_dir():
            for path in self.directory.iterdir():
                if (match := _DELTA_FILE.match(path.name)) and int(match.group(1)) > scored:
                    found[int(match.group(1))] = path
        return dict(sorted(found.items()))

    def unscored_rounds(self) -> list[int]:
        """Rounds observed but not yet scored by an evaluation."""
        return list(self._pending_rounds())

    def _score_pending(self) -> None:
        pending = self._pending_rounds()
        rounds = list(pending)
        if rounds != list(range(len(self.delta_norms) + 1, len(self.delta_norms) + 1 + len(rounds))):
            raise RuntimeError(f"audit: model deltas of rounds {rounds} do not follow round {len(self.delta_norms)}")
        if not rounds:
            return
        deltas = [np.load(d) if isinstance(d, Path) else d for d in pending.values()]
        dots = stats.canary_dots(self.seed, range(self.config.canaries), deltas, support=self.config.support)
        self.dots = np.concatenate([self.dots, dots], axis=1)
        self.delta_norms += [float(np.linalg.norm(d.astype(np.float64))) for d in deltas]
        for server_round in pending:
            self._pending.pop(server_round, None)

    def evaluate(self, server_round: int, epsilon_at: Callable[[float], float] | None) -> AuditResult:
        """Score the rounds not yet scored and compute the estimates and the lower bound after ``server_round``;
        ``epsilon_at(δ)`` is the accountant's ε (None for a non-private reference)."""
        self._score_pending()
        return evaluate_statistics(
            self.dots, np.asarray(self.delta_norms), self.final_delta_norm(), self.inserted, self.size, self.delta,
            self.bound_delta, self.config.confidence, self.seed, server_round,
            None if epsilon_at is None else epsilon_at(self.delta),
            None if epsilon_at is None else epsilon_at(self.bound_delta), self.config.support, self.config.guess_rule,
        )  # fmt: skip

    def final_delta_norm(self) -> float:
        """‖w_T − w_0‖ over the scored rounds (the sum of their deltas when the initial model is not known)."""
        if self._initial is not None and self._latest is not None:
            return float(np.linalg.norm(self._latest.astype(np.float64) - self._initial))
        return math.nan

    def save(self, path: Path, result: AuditResult) -> None:
        """``audit.npz``: everything :func:`fl_app.audit.__main__` needs to recompute the audit."""
        with atomic_write(path, "wb") as fh:
            np.savez(
                fh,
                seed=self.seed,
                inserted=self.inserted,
                size=self.size,
                dots=self.dots,
                delta_norms=np.asarray(self.delta_norms),
                final_delta_norm=self.final_delta_norm(),
                participation=np.array([len(self.participants(r)) for r in range(1, len(self.delta_norms) + 1)]),
                delta=self.delta,
                bound_delta=self.bound_delta,
                confidence=self.config.confidence,
                accountant_epsilon=_nan_if_none(result.accountant_epsilon),
                accountant_epsilon_at_bound_delta=_nan_if_none(result.accountant_epsilon_at_bound_delta),
                round=result.round,
                support=0 if self.config.support is None else self.config.support,  # 0: dense
                guess_rule=self.config.guess_rule,
            )

    def finish(self) -> None:
        """Drop the kept deltas once the final audit is saved (the dots in ``audit.npz`` are what it needs).

        They are kept until then, scored or not: a run resumed from an earlier checkpoint scores again the rounds
        between that checkpoint and the crash."""
        self._pending.clear()
        if self.directory is not None and self.directory.is_dir():
            for path in self.directory.iterdir():
                if _DELTA_FILE.match(path.name):
                    path.unlink(missing_ok=True)

    # ----- checkpoint state -------------------------------------------------------------------------------------

    def state(self) -> tuple[dict[str, Any], dict[str, list[np.ndarray]]]:
        """What a resumed run needs: the scored dots (small), w_0 and who joined which round; later deltas are on
        disk."""
        self._score_pending_in_memory()
        rounds = sorted(self.joined)
        arrays: dict[str, list[np.ndarray]] = {
            "audit_dots": [self.dots],
            "audit_joined": [np.asarray(rounds, dtype=np.int64)] + [self.joined[r] for r in rounds],
        }
        if self._initial is not None:
            arrays["audit_initial"] = [self._initial]
        return {"audit_delta_norms": list(self.delta_norms)}, arrays

    def _score_pending_in_memory(self) -> None:
        # Without a directory nothing survives a restart; with one, pending deltas are files a resume finds.
        if self.directory is None and self._pending:
            self._score_pending()

    def load_state(self, state: dict[str, Any], arrays: dict[str, list[np.ndarray]], resumed_round: int) -> None:
        norms = list(state.get("audit_delta_norms", []))[:resumed_round]
        self.delta_norms = norms
        self.dots = np.asarray(arrays["audit_dots"][0])[:, : len(norms)] if "audit_dots" in arrays else self.dots
        if "audit_joined" in arrays:
            rounds, *members = arrays["audit_joined"]
            kept = [(int(r), m) for r, m in zip(rounds, members, strict=True) if r <= resumed_round]
            self.joined = {r: np.asarray(m, dtype=np.int64) for r, m in kept}
        if "audit_initial" in arrays:
            self._initial = np.asarray(arrays["audit_initial"][0])
        if self.directory is not None and self.directory.is_dir():
            # Deltas of rounds after the checkpoint belong to models the resumed run computes again.
            for path in self.directory.iterdir():
                if (match := _DELTA_FILE.match(path.name)) and int(match.group(1)) > resumed_round:
                    path.unlink(missing_ok=True)


def evaluate_statistics(
    dots: np.ndarray,
    delta_norms: np.ndarray,
    final_delta_norm: float,
    inserted: np.ndarray,
    size: int,
    delta: float,
    bound_delta: float,
    confidence: float,
    seed: int,
    server_round: int,
    accountant_epsilon: float | None,
    accountant_epsilon_at_bound_delta: float | None,
    support: int | None = None,
    guess_rule: GuessRule = "one_sided",
) -> AuditResult:
    """The audit from the saved statistics (shared by the run and ``python -m fl_app.audit``); ``support`` is that of
    sparse canaries (None: dense), ``guess_rule`` the lower bound's guesses (``audit.guess_rule``)."""
    if not math.isfinite(final_delta_norm):
        final_delta_norm = float(np.linalg.norm(dots.sum(axis=1)))  # pragma: no cover - fallback only
    final = stats.final_model_statistics(dots, final_delta_norm)
    iterates = stats.all_iterates_statistics(dots, delta_norms)
    null, members = ~inserted, inserted

    def estimate(values: np.ndarray, purpose: int, known_null: tuple[float, float] | None) -> stats.EpsilonEstimate:
        rng = make_rng(seed, AUDIT_DRAWS, BOOTSTRAP, purpose)
        return stats.estimate_epsilon(
            values[null], values[members], delta, rng=rng, confidence=confidence, known_null=known_null
        )

    return AuditResult(
        round=server_round,
        # The final model is one vector independent of a never-inserted direction: the cosine of a dense (uniform)
        # direction with it is exactly N(0, 1/d) (Andrew et al. §4); a sparse one's has heavier tails, so its null is
        # fitted, as the maximum over rounds' always is (no closed form).
        estimate_final=estimate(final, 1, (0.0, 1.0 / math.sqrt(size)) if support is None else None),
        estimate_iterates=estimate(iterates, 2, None),
        lower_bound=stats.one_run_lower_bound(iterates, inserted, bound_delta, confidence=confidence, rule=guess_rule),
        accountant_epsilon=accountant_epsilon,
        accountant_epsilon_at_bound_delta=accountant_epsilon_at_bound_delta,
    )


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else value


def _flatten(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in arrays])


def _unflatten(flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    out, start = [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append(flat[start : start + size].reshape(shape))
        start += size
    return out
