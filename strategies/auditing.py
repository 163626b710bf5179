"""The canary audit as the round loop uses it (docs/audit.md): one object the strategy holds, told about each round.

:class:`fl_app.audit.canaries.CanaryAudit` holds the canaries and their statistics; this module is their place in
the round: the canaries' updates join the round's sum after the path a real client's update takes, the released
model is observed, the audit is scored every ``audit.every`` rounds and after the last, ``audit.npz`` is saved when
the run ends, and ``run.json`` gets its ``audit`` section.
"""

from __future__ import annotations

from collections.abc import Callable
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from fl_app.audit.canaries import AUDIT_FILE, AuditResult, CanaryAudit
from fl_app.checkpoint import Checkpoint
from fl_app.config import AppConfig
from fl_app.instructions import STREAM_CLIENT_NOISE
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.pipeline import ClientStep, mechanisms_for, run_client_steps
from strategies.client_dp.account import PrivacyAccount
from strategies.rounds import RoundPlan


class CanaryAuditor:
    """The run's canaries (``audit``) from ``start()`` to the end of the run."""

    def __init__(self, config: AppConfig, shapes: list[tuple[int, ...]], directory: Path | None, key: int) -> None:
        """``key`` keys the canaries' draws unless ``audit.seed`` is set: secret from the clients when randomness is
        secure (strategies/client_dp/randomness.py::RunRandomness.secret_key), kept in the checkpoint for a resume."""
        p = config.privacy
        self.config = config
        self.canaries = CanaryAudit(
            config.audit,
            run_seed=key,
            clip_norm=p.clip_norm,
            delta=p.delta,
            shapes=shapes,
            directory=directory,
        )
        #: The latest evaluation of the audit.
        self.result: AuditResult | None = None

    @classmethod
    def for_run(
        cls,
        config: AppConfig,
        shapes: list[tuple[int, ...]],
        checkpoint_dir: Path | None,
        resume_from: Checkpoint | None,
        secret_key: Callable[[], int],
    ) -> CanaryAuditor:
        """The run's auditor, its files in ``checkpoint_dir``/audit: a new one keyed by ``secret_key()``, or on a
        resume the checkpoint's, with its key (checkpoints before the key was stored used the seed) and state."""
        directory = None if checkpoint_dir is None else checkpoint_dir / "audit"
        if resume_from is None:
            return cls(config, shapes, directory, secret_key())
        state = resume_from.strategy_state
        auditor = cls(config, shapes, directory, int(state.get("audit_key", config.seed)) if state else secret_key())
        auditor.canaries.load_state(state, resume_from.strategy_arrays, resume_from.round)
        return auditor

    def updates(
        self, plan: RoundPlan, sampled: np.ndarray, clip_norm: float, secure: bool, first_id: int
    ) -> list[tuple[int, list[np.ndarray]]]:
        """This round's canaries as a real client would send them: the inserted ones among ``sampled`` (the canary
        indices the strategy's sampler drew for the round), through the recipe's client mechanisms (mask, clip; no
        noise of their own, so the round's noise stays the accounted σC/m). The strategy then admits each as it
        admits a reply. Canary i has client id ``first_id + i`` (after every real client)."""
        # A canary's noise would raise the round's noise above the accounted one; the noise it "owes" in client
        # placement is covered by the top-up, which counts real clients only.
        mechanisms = mechanisms_for(plan.instructions.recipe)
        updates = []
        for index in self.canaries.join(plan.server_round, sampled):
            step = ClientStep(
                clip_norm=plan.instructions.clip_norm,
                noise_std=None,
                # The stream a client with this id would draw from (canaries add no noise of their own).
                rng=mech.random_source(
                    secure, self.config.seed, plan.server_round, STREAM_CLIENT_NOISE, first_id + index
                ),
                shared_mask=plan.mask,
            )
            sent, _ = run_client_steps(mechanisms, self.canaries.update(index, clip_norm), step)
            updates.append((index, sent))
        return updates

    def round_released(self, server_round: int, before: list[np.ndarray], after: list[np.ndarray]) -> None:
        self.canaries.observe(server_round, before, after)

    def due(self, server_round: int, num_rounds: int) -> bool:
        """Whether the audit is scored after ``server_round``: every ``audit.every`` rounds and after the last."""
        every = self.config.audit.every
        return server_round == num_rounds or bool(every and server_round % every == 0)

    def evaluate(self, server_round: int, account: PrivacyAccount | None) -> dict[str, Any]:
        """Score the canaries after ``server_round`` against ``account``'s ledger (None: a plain run's, which has
        none); a lower bound above the accountant's ε is a privacy bug. Returns the round record's ``audit_*``
        fields."""
        epsilon, epsilon_at = (None, None) if account is None else (account.epsilon(), account.ledger.epsilon_at)
        self.result = result = self.canaries.evaluate(server_round, epsilon_at)
        log(
            INFO,
            "Audit after round %d: epsilon estimate %.3g (final model), %.3g (all iterates); lower bound %.3g; "
            "accountant %s",
            server_round,
            result.estimate_final.epsilon,
            result.estimate_iterates.epsilon,
            result.lower_bound.epsilon,
            "n/a" if epsilon is None else f"{epsilon:.4g}",
        )
        if result.violation:
            log(
                ERROR,
                "PRIVACY VIOLATION: the one-run audit certifies epsilon >= %.4g (delta=%.3g) at %.0f%% confidence, "
                "above the accountant's %.4g at that delta: a mechanism leaks more than the accountant says",
                result.lower_bound.epsilon,
                result.lower_bound.delta,
                100 * self.config.audit.confidence,
                result.accountant_epsilon_at_bound_delta,
            )
        if result.alarm:
            log(
                ERROR,
                "PRIVACY ALARM: the canary audit estimates epsilon >= %.4g (the larger lower end of its two %.0f%% "
                "intervals), above the accountant's %.4g at delta=%.3g: a mechanism may leak more than the accountant "
                "says (an estimate, not a proof; docs/audit.md)",
                result.alarm_epsilon,
                100 * self.config.audit.confidence,
                result.accountant_epsilon,
                self.config.privacy.delta,
            )
        return result.record()

    def warning(self) -> str | None:
        """What the printed guarantee must carry next to it when the audit contradicts it (None when it does not)."""
        result = self.result
        if result is None:
            return None
        if result.violation:
            return (
                f"PRIVACY VIOLATION: the canary audit certifies epsilon >= {result.lower_bound.epsilon:.4g} at "
                f"delta={result.lower_bound.delta:.3g}"
            )
        if result.alarm:
            return f"PRIVACY ALARM: the canary audit estimates epsilon >= {result.alarm_epsilon:.4g}"
        return None

    def finish(self, checkpoint_dir: Path | None, account: PrivacyAccount | None) -> None:
        """Evaluate the audit once more if the run stopped early, save ``audit.npz``, drop the kept deltas."""
        if unscored := self.canaries.unscored_rounds():
            self.evaluate(unscored[-1], account)
        if checkpoint_dir is not None and self.result is not None:
            self.canaries.save(checkpoint_dir / AUDIT_FILE, self.result)
        self.canaries.finish()


def audit_report(config: AppConfig, auditor: CanaryAuditor | None) -> dict[str, Any] | None:
    """``run.json``'s ``audit`` section (None when the run has no canaries)."""
    if not config.audit.enabled:
        return None
    report: dict[str, Any] = {
        "canaries": config.audit.canaries,
        "canary_scale": config.audit.canary_scale,
        "confidence": config.audit.confidence,
    }
    if auditor is not None:
        report["inserted"] = int(auditor.canaries.inserted.sum())
        if auditor.result is not None:
            report["after_round"] = auditor.result.round
            report["accountant_epsilon"] = auditor.result.accountant_epsilon
            report.update({k.removeprefix("audit_"): v for k, v in auditor.result.record().items()})
    return report
