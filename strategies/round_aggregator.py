"""Steps 5-6 of the round (strategies/base.py's module docstring): bind, screen and admit the replies (the server's
re-clip), the canaries, the sum over the fixed denominator m, the noise and the server's post-processing.

:class:`RoundAggregator` is built from explicit inputs — the strategy's clip norm, noisy average, server optimizer,
randomness, statistics policy, sampler and audit as they stand when the round runs — and returns what it computed
(:class:`~strategies.rounds.RoundOutcome`); what the round changes on the strategy, the strategy sets itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.common.logger import log

from fl_app.instructions import STREAM_ADAPTIVE_CLIP, STREAM_CANARY_SAMPLING, STREAM_STATISTICS
from fl_app.privacy import mechanisms as mech
from fl_app.server_optimizers import ServerOptimizer
from strategies.aggregation import RoundReplies
from strategies.auditing import CanaryAuditor
from strategies.client_dp import NoisyAverage
from strategies.client_dp.clipping import ClipNorm
from strategies.client_dp.randomness import RunRandomness
from strategies.client_dp.sampling import ClientSampler
from strategies.flower_step import FlowerServerStep
from strategies.rounds import RoundOutcome, RoundPlan
from strategies.statistics import ClientStatistics


@dataclass(frozen=True)
class RoundAggregator:
    """Steps 5-6 over a round's replies."""

    #: M: the canaries' ids follow the real clients'.
    num_clients: int
    #: m, the fixed denominator (adaptive clipping's count is over it).
    expected_clients: float
    #: C_t (adaptive clipping moves it after the round).
    clipping: ClipNorm
    #: The private average over m with the placement's clip and noise; None: the plain mean of what arrived.
    noisy_average: NoisyAverage | None
    #: w ← step(w, average), post-processing of the released average.
    server_optimizer: ServerOptimizer | FlowerServerStep
    randomness: RunRandomness
    #: Whether a rejection may be logged (only where raw client statistics are published).
    statistics: ClientStatistics
    #: Who may join as a canary (the run's sampler).
    sampler: ClientSampler
    #: The canary audit (None without ``audit``).
    auditor: CanaryAuditor | None
    #: Whether the round record states C_t (a private run).
    states_clip_norm: bool

    def _log_rejection(self, server_round: int, kind: str, reason: str) -> None:
        # Logs are published. A reason can name a partition (an error text a client wrote, a claimed id), and each
        # line counts a client: only runs that publish raw client statistics log them; the others keep the counts
        # in the operator's own record (operator_counts.jsonl).
        if self.statistics.publishes_raw:
            log(WARNING, "Round %d: reply rejected (%s): %s", server_round, kind, reason)

    def aggregate(self, plan: RoundPlan, replies: Iterable[Message]) -> RoundOutcome:
        """Steps 5-6 over the replies to ``plan``'s messages: bind, screen, admit, sum, noise, the server step."""
        taken = self.receiver(plan)
        taken.take(replies)
        return self.aggregate_taken(taken)

    def receiver(self, plan: RoundPlan) -> RoundReplies:
        """Step 5 for ``plan``'s replies, fed as they arrive (:meth:`RoundReplies.take`: bind, screen, admit);
        :meth:`aggregate_taken` then finishes the round."""
        return RoundReplies(plan, self.admit, self._log_rejection)

    def published_statistics(self, server_round: int, stats: dict[str, Any]) -> dict[str, Any]:
        """The round's statistics as ``privacy.client_statistics`` allows them to be published (a noisy count is
        drawn from the round's statistics stream)."""
        rng = partial(self.randomness.noise_rng, server_round, STREAM_STATISTICS)  # drawn only for a noisy count
        return self.statistics.published(stats, self.expected_clients, self.clipping.adaptive, rng)

    def aggregate_taken(self, taken: RoundReplies) -> RoundOutcome:
        """Step 6 over what :meth:`receiver` took: the canaries, the sum over m, noise, the server step."""
        plan = taken.plan
        taken.add_canaries(self.num_clients, self.canary_updates(plan))
        updates, num_clients = taken.ordered()
        average = self.combine(plan, updates, num_clients)
        new_weights = self.server_optimizer.step(plan.global_weights, average)
        clip_norm = self.clipping.clip_norm
        stats = taken.statistics(clip_norm)
        if self.states_clip_norm:
            stats["clip_norm"] = clip_norm
        if self.clipping.adaptive:
            # The aggregated clients' bits only: canaries and rejected clients have no part in m.
            rng = self.randomness.noise_rng(plan.server_round, STREAM_ADAPTIVE_CLIP)
            stats.update(self.clipping.after_round(taken.norms, self.expected_clients, rng))
        return RoundOutcome(new_weights=new_weights, stats=stats)

    def admit(
        self, plan: RoundPlan, total: list[np.ndarray], clients: int = 1, norm: float = math.nan
    ) -> tuple[list[np.ndarray], int]:
        """Step 5 for a screened sum of ``clients`` updates: the round's mask, then the server's clip to clients·C
        where a private average clips (:meth:`NoisyAverage.reclip`); (sum, clients if it had to be re-clipped else
        0). ``norm`` is the sum's global L2 norm as the screening measured it (NaN: measured here)."""
        if plan.mask is not None:
            # The round's mask is public; whatever a client sent outside it is dropped.
            total = mech.apply_mask(total, plan.mask)
            norm = math.nan  # the masked sum is another vector
        if self.noisy_average is None:
            return total, 0
        return self.noisy_average.reclip(total, clients, norm)

    def canary_updates(self, plan: RoundPlan) -> list[tuple[int, list[np.ndarray]]]:
        """This round's canaries (``audit``) after the path a real client's update takes, then :meth:`admit`
        (strategies/auditing.py). Canaries are not counted in the number of clients (m, the top-up noise,
        statistics)."""
        if self.auditor is None:
            return []
        rng = self.randomness.round_rng(plan.server_round, STREAM_CANARY_SAMPLING)
        joined = self.sampler.sample(self.auditor.canaries.count, plan.server_round, rng, self.randomness)
        sent = self.auditor.updates(plan, joined, self.clipping.clip_norm, self.randomness.secure, self.num_clients)
        return [(index, self.admit(plan, update)[0]) for index, update in sent]

    @property
    def server_clips(self) -> bool:
        """Whether the server clips every reply again (a private average under server placement)."""
        return self.noisy_average is not None and self.noisy_average.placement.server_clips

    def combine(self, plan: RoundPlan, updates: list[list[np.ndarray]], num_clients: int) -> list[np.ndarray]:
        """Step 6: the released average of the round's ``updates`` (client updates or cohort sums of them) holding
        ``num_clients`` client updates: the private one over the fixed m (:class:`NoisyAverage`), or the plain mean
        of what arrived (the non-private references; Noisy-FedAvg, whose clients noise their models)."""
        if self.noisy_average is None:
            return mech.uniform_average(updates, max(num_clients, 1), plan.shapes)
        return self.noisy_average.average(plan, updates, num_clients, self.randomness.noise_rng)

    def draw_noise_ahead(self, plan: RoundPlan) -> None:
        """Start drawing the round's server noise ahead, where a private average adds it whoever answers
        (:meth:`NoisyAverage.draw_noise_ahead`)."""
        if self.noisy_average is not None:
            self.noisy_average.draw_noise_ahead(plan, self.randomness.noise_rng)
