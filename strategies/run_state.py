"""What a run carries across rounds and checkpoints: the state a checkpoint stores and a resume restores (with the
releases logged after it, accounted before anything reads the guarantee), and the canary audit's evaluation. A part
of :class:`strategies.base.FederatedStrategy` (a mixin over its fields)."""

from __future__ import annotations

from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common.logger import log

from fl_app.audit.canaries import AuditResult, CanaryAudit
from fl_app.checkpoint import Checkpoint
from fl_app.config import ConfigError
from fl_app.releases import randomness_name
from strategies.auditing import audit_report


class RunState:
    """Checkpoint state, resume and the audit's evaluation (strategies/base.py's fields)."""

    def _restore(self, checkpoint: Checkpoint) -> None:
        """Restore the checkpoint's state and account every release logged after it (each left the server, and the
        ledger restored from the checkpoint has not counted it)."""
        self.load_state(checkpoint.strategy_state, checkpoint.strategy_arrays)
        logged = int(checkpoint.strategy_state.get("releases_logged", 0))
        if self.budget is not None:
            released = int(checkpoint.strategy_state.get("releases_logged", checkpoint.round))
            self.releases.resume(self.budget, released, logged)
        log(INFO, "Resuming after round %d (epsilon so far %.4g)", checkpoint.round, self.epsilon())

    def check_resume_randomness(self, checkpoint: Checkpoint, secure: bool) -> None:
        """Refuse a resume whose randomness (``secure``: the OS CSPRNG, else seeded streams) is not the one the
        checkpoint and the releases logged after it were made with (docs/PRIVACY.md, resumes).

        A resume re-runs the rounds released after the checkpoint. Under the randomness they were released with, a
        seeded re-run repeats its logged release (no new ε) and a CSPRNG re-run is a new release the ledger counts.
        Under other randomness, a seeded release is re-released with noise independent of its own: for DP-FTRL that
        is one row of the factorization twice, outside its analysis (the ledger would state the ε of T rows while
        the released models have that of T + 1). ``privacy.secure_noise=auto`` resolves by where the run happens
        (seeded on the simulation engine, the CSPRNG against a real SuperLink), so a run checkpointed on one and
        resumed on the other is refused here, before any message."""
        if self.budget is None:
            return
        logged = int(checkpoint.strategy_state.get("releases_logged", 0))
        made_with = {release.randomness for release in self.releases.log_since(logged)}
        if "randomness" in checkpoint.strategy_state:  # checkpoints written before it was stored: the log alone
            made_with.add(str(checkpoint.strategy_state["randomness"]))
        now = randomness_name(secure)
        if made_with - {now}:
            raise ConfigError(
                f"resume: the checkpoint (round {checkpoint.round}) and the releases logged after it were made with "
                f"{' and '.join(sorted(made_with))} randomness; this run would draw from {now} "
                "(privacy.secure_noise=auto is seeded on the simulation engine and the OS CSPRNG against a real "
                "SuperLink). Its re-run rounds would release their models again with noise independent of the logged "
                "releases, which the accounting does not cover. Resume where the run was checkpointed (the same "
                "privacy.secure_noise resolved the same way), or start a new run"
            )

    @property
    def canaries(self) -> CanaryAudit | None:
        """The run's canary clients (None without ``audit``, or before start())."""
        return None if self.auditor is None else self.auditor.canaries

    @property
    def audit_result(self) -> AuditResult | None:
        """The latest evaluation of the audit."""
        return None if self.auditor is None else self.auditor.result

    def evaluate_audit(self, server_round: int) -> dict[str, Any]:
        """Score the canaries after ``server_round`` against the ledger (strategies/auditing.py)."""
        assert self.auditor is not None
        return self.auditor.evaluate(server_round, *self._audit_epsilons())

    def _audit_epsilons(self) -> tuple[float | None, Any]:
        epsilon = None if self.budget is None else self.epsilon()
        return epsilon, (self.ledger.epsilon_at if self.ledger is not None else None)

    def finish_audit(self, checkpoint_dir: Path | None, num_rounds: int) -> None:
        """Evaluate the audit once more if the run stopped early, save ``audit.npz``, drop the kept deltas."""
        if self.auditor is not None:
            self.auditor.finish(checkpoint_dir, *self._audit_epsilons())

    def audit_report(self) -> dict[str, Any] | None:
        """``run.json``'s ``audit`` section (None when the run has no canaries)."""
        return audit_report(self.config, self.auditor)

    def state(self) -> tuple[dict[str, Any], dict[str, list[np.ndarray]]]:
        """What a resumed run needs beyond the global model: the accountant, the server optimizer's state, the
        previous global model where the round mask needs it (:attr:`uses_previous_global`) and the canaries' scored
        statistics. The arrays are snapshots the strategy never changes in place afterwards (a checkpoint is written
        from them while the next round runs: strategies/observers.py)."""
        ledger = self.ledger.state_dict() if self.ledger is not None else {"accountant": None}
        optimizer_state, optimizer_arrays = self.server_optimizer.state()
        state = {**ledger, **optimizer_state, **self.clipping.state_dict(), "releases_logged": self.releases.logged,
                 "randomness": randomness_name(self.secure_noise)}  # fmt: skip
        state.update(self.sampler.state_dict(self.randomness))  # the participation rule's record and groups' key
        arrays = dict(optimizer_arrays)
        if self.uses_previous_global:  # a second copy of the model in every checkpoint, only where a mask needs it
            arrays["previous_global"] = list(self.last_round_global)
        if self.auditor is not None:
            audit_state, audit_arrays = self.auditor.canaries.state()
            state.update(audit_state, audit_key=int(self.auditor.canaries.seed))
            arrays.update(audit_arrays)
        mechanisms = [mechanism.state_dict() for mechanism in self.mechanisms]
        if any(mechanisms):  # only stateful pipelines add the key (checkpoints of stateless ones are unchanged)
            state["mechanisms"] = mechanisms
        for index, mechanism in enumerate(self.mechanisms):
            if mechanism_arrays := mechanism.state_arrays():
                arrays[f"mechanism_{index}"] = list(mechanism_arrays)
        return state, arrays

    def load_state(self, state: dict[str, Any], arrays: dict[str, list[np.ndarray]]) -> None:
        if self.ledger is not None:
            self.ledger.load_state_dict(state)
        self.server_optimizer.load_state(state, arrays)
        # Adaptive clipping's C for the round after the checkpoint (older checkpoints: the fixed C).
        self.clipping.load_state_dict(state)
        self.sampler.load_state_dict(state)  # the participation rule's record and groups' key
        # The global model the checkpointed round started from: the "previous global" of the next round.
        self.last_round_global = list(arrays.get("previous_global", []))
        stored = state.get("mechanisms", [{} for _ in self.mechanisms])
        if len(stored) != len(self.mechanisms):
            raise ValueError(
                f"checkpoint holds the state of {len(stored)} mechanisms, the pipeline has {len(self.mechanisms)}"
            )
        for index, (mechanism, mechanism_state) in enumerate(zip(self.mechanisms, stored, strict=True)):
            mechanism.load_state_dict(mechanism_state)
            mechanism.load_state_arrays(list(arrays.get(f"mechanism_{index}", [])))
