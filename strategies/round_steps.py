"""Steps 5-6 of the round (strategies/base.py's module docstring): bind, screen and admit the replies (the server's
re-clip), the canaries, the sum over the fixed denominator m, the noise and the server's post-processing. A part of
:class:`strategies.base.FederatedStrategy` (a mixin over its fields)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from logging import WARNING

import numpy as np
from flwr.app import Message
from flwr.common.logger import log

from fl_app.audit.canaries import AuditResult, CanaryAudit
from fl_app.instructions import (
    STREAM_ADAPTIVE_CLIP,
    STREAM_CANARY_SAMPLING,
    STREAM_SERVER_NOISE,
)
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.pipeline import (
    GaussianNoise,
    ServerStep,
    run_server_steps,
)
from fl_app.privacy.prefetch import PrefetchedNormals
from strategies.aggregation import RoundReplies
from strategies.rounds import RoundOutcome, RoundPlan


class AggregationSteps:
    """Steps 5-6 over a round's replies (strategies/base.py's fields)."""

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

    def aggregate_taken(self, taken: RoundReplies) -> RoundOutcome:
        """Step 6 over what :meth:`receiver` took: the canaries, the sum over m, noise, the server step."""
        plan = taken.plan
        # Planning changes nothing on the strategy; the round's end does (the next round's previous global).
        self.last_round_global = plan.global_weights
        taken.add_canaries(self.num_clients, self.canary_updates(plan))
        updates, num_clients = taken.ordered()
        average = self.combine(plan, updates, num_clients)
        new_weights = self.server_optimizer.step(plan.global_weights, average)
        stats = taken.statistics(self.clip_norm)
        if self.private:
            stats["clip_norm"] = self.clip_norm
        if self.adaptive_clipping:
            # The aggregated clients' bits only: canaries and rejected clients have no part in m.
            rng = self.noise_rng(plan.server_round, STREAM_ADAPTIVE_CLIP)
            stats.update(self.clipping.after_round(taken.norms, self.expected_clients, rng))
        return RoundOutcome(new_weights=new_weights, stats=stats)

    def admit(
        self, plan: RoundPlan, total: list[np.ndarray], clients: int = 1, norm: float = math.nan
    ) -> tuple[list[np.ndarray], int]:
        """Step 5 for a screened sum of ``clients`` updates: the round's mask, the server's clip to clients·C;
        (sum, clients if it had to be re-clipped else 0). ``norm`` is the sum's global L2 norm as the screening
        measured it (NaN: measured here)."""
        if plan.mask is not None:
            # The round's mask is public; whatever a client sent outside it is dropped.
            total = mech.apply_mask(total, plan.mask)
            norm = math.nan  # the masked sum is another vector
        if not self.server_clips:
            return total, 0
        # Never trust the client's clipping: the sensitivity bound C/m must hold for any reply. A cohort's worker
        # re-clipped each client to C, so a sum of k such updates is within k·C.
        total, was_reclipped = mech.reclip(total, clients * self.clip_norm, norm=None if math.isnan(norm) else norm)
        return total, clients * int(was_reclipped)

    def canary_updates(self, plan: RoundPlan) -> list[tuple[int, list[np.ndarray]]]:
        """This round's canaries (``audit``) after the path a real client's update takes, then :meth:`admit`
        (strategies/auditing.py). Canaries are not counted in the number of clients (m, the top-up noise,
        statistics)."""
        if self.auditor is None:
            return []
        rng = self.round_rng(plan.server_round, STREAM_CANARY_SAMPLING)
        joined = self.sample(self.auditor.canaries.count, plan.server_round, rng)
        sent = self.auditor.updates(plan, joined, self.clip_norm, self.secure_noise, self.num_clients)
        return [(index, self.admit(plan, update)[0]) for index, update in sent]

    @property
    def canaries(self) -> CanaryAudit | None:
        """The run's canary clients (None without ``audit``, or before start())."""
        return None if self.auditor is None else self.auditor.canaries

    @property
    def audit_result(self) -> AuditResult | None:
        """The latest evaluation of the audit."""
        return None if self.auditor is None else self.auditor.result

    @property
    def client_clip_norm(self) -> float:
        """C the client clips its update to (0 = no update clipping)."""
        return self.clip_norm if self.private else 0.0

    @property
    def server_clips(self) -> bool:
        return self.private and self.placement.server_clips

    def combine(self, plan: RoundPlan, updates: list[list[np.ndarray]], num_clients: int) -> list[np.ndarray]:
        """Step 6: uniform sum over the fixed denominator m, then the pipeline's server steps (the server's share of
        the noise, the noise's support, post-processing: :attr:`mechanisms`).

        ``updates`` are client updates or cohort sums of them (their sum is the same); ``num_clients`` is the
        number of client updates they hold.
        """
        if not self.private:
            return mech.uniform_average(updates, max(num_clients, 1), plan.shapes)
        average = mech.uniform_average(updates, self.expected_clients, plan.shapes)
        rng = plan.server_noise
        if rng is None:
            rng = self.noise_rng(plan.server_round, STREAM_SERVER_NOISE)
        step = ServerStep(
            noise_std=self.placement.server_noise_std(
                self.noise_multiplier, self.clip_norm, self.expected_clients, num_clients
            ),
            rng=rng,
            mask=plan.mask,
            updates=updates,
        )
        return run_server_steps(self.mechanisms, average, step)

    def draw_noise_ahead(self, plan: RoundPlan) -> None:
        """Start drawing the round's server noise on a background thread (:class:`PrefetchedNormals`, the same
        stream :meth:`combine` would draw from, so the same values): the run calls this when the round's first
        reply is in, so the draw runs on the core that worker freed instead of after the last reply. Only where the
        server adds noise whoever answers (server placement); idempotent."""
        if plan.server_noise is not None or not self.private or self.placement.clients_add_noise:
            return
        if not any(isinstance(mechanism, GaussianNoise) for mechanism in self.mechanisms):
            return
        plan.server_noise = PrefetchedNormals(self.noise_rng(plan.server_round, STREAM_SERVER_NOISE), plan.shapes)
