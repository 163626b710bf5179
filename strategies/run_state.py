"""What a run carries across rounds and checkpoints: :class:`RunState`, the state a checkpoint stores and a resume
restores, with the releases logged after the checkpoint accounted before anything reads the guarantee.

Built once by the strategy from the objects whose state it is (the account, the release log, the clip norm
policy, the sampler, the server optimizer, the privacy pipeline), each an explicit input; what changes while the
run is prepared (where its randomness comes from, the canary audit) is handed to :meth:`RunState.state` when a
checkpoint is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from fl_app.checkpoint import Checkpoint
from fl_app.config import ConfigError
from fl_app.privacy.pipeline import Mechanism
from fl_app.releases import randomness_name
from fl_app.server_optimizers import ServerOptimizer
from strategies.auditing import CanaryAuditor
from strategies.client_dp.account import PrivacyAccount
from strategies.client_dp.clipping import ClipNorm
from strategies.client_dp.randomness import RunRandomness
from strategies.client_dp.releasing import RunReleases
from strategies.client_dp.sampling import ClientSampler
from strategies.flower_step import FlowerServerStep

#: The arrays of a checkpoint's strategy state, by name.
StateArrays = dict[str, list[np.ndarray]]


@dataclass
class RunState:
    """The state of one run beyond its global model, and how a checkpoint stores it and a resume restores it."""

    #: What the releases spent (None: a plain algorithm's run, which accounts nothing).
    account: PrivacyAccount | None
    releases: RunReleases
    clipping: ClipNorm
    sampler: ClientSampler
    server_optimizer: ServerOptimizer | FlowerServerStep
    mechanisms: tuple[Mechanism, ...]
    #: Whether the round's mask reads the global model the previous round started from (then a checkpoint stores it,
    #: for the resumed run's first mask: Fed-SMP-topk).
    keeps_previous_global: bool = False
    #: The global model the last aggregated round started from: the next round's "previous global" ([] before it).
    previous_global: list[np.ndarray] = field(default_factory=list)

    def state(self, randomness: RunRandomness, auditor: CanaryAuditor | None) -> tuple[dict[str, Any], StateArrays]:
        """What a resumed run needs beyond the global model: the accountant, the server optimizer's state, the
        previous global model where the mask needs it, the canaries' scored statistics and every stateful
        mechanism's state. The arrays are snapshots nobody changes in place afterwards (a checkpoint is written from
        them while the next round runs: strategies/observers.py)."""
        ledger = {"accountant": None} if self.account is None else self.account.ledger.state_dict()
        optimizer_state, optimizer_arrays = self.server_optimizer.state()
        state = {**ledger, **optimizer_state, **self.clipping.state_dict(), "releases_logged": self.releases.logged,
                 "randomness": randomness_name(randomness.secure)}  # fmt: skip
        state.update(self.sampler.state_dict(randomness))  # the participation rule's record and groups' key
        arrays = dict(optimizer_arrays)
        if self.keeps_previous_global:  # a second copy of the model in every checkpoint, only where a mask needs it
            arrays["previous_global"] = list(self.previous_global)
        if auditor is not None:
            audit_state, audit_arrays = auditor.canaries.state()
            state.update(audit_state, audit_key=int(auditor.canaries.seed))
            arrays.update(audit_arrays)
        mechanisms = [mechanism.state_dict() for mechanism in self.mechanisms]
        if any(mechanisms):  # only stateful pipelines add the key (checkpoints of stateless ones are unchanged)
            state["mechanisms"] = mechanisms
        for index, mechanism in enumerate(self.mechanisms):
            if mechanism_arrays := mechanism.state_arrays():
                arrays[f"mechanism_{index}"] = list(mechanism_arrays)
        return state, arrays

    def load_state(self, state: dict[str, Any], arrays: StateArrays) -> None:
        """Restore what :meth:`state` returned (the canaries' part is the audit's own: strategies/auditing.py)."""
        if self.account is not None:
            self.account.ledger.load_state_dict(state)
        self.server_optimizer.load_state(state, arrays)
        # Adaptive clipping's C for the round after the checkpoint (older checkpoints: the fixed C).
        self.clipping.load_state_dict(state)
        self.sampler.load_state_dict(state)  # the participation rule's record and groups' key
        self.previous_global = list(arrays.get("previous_global", []))
        stored = state.get("mechanisms", [{} for _ in self.mechanisms])
        if len(stored) != len(self.mechanisms):
            raise ValueError(
                f"checkpoint holds the state of {len(stored)} mechanisms, the pipeline has {len(self.mechanisms)}"
            )
        for index, (mechanism, mechanism_state) in enumerate(zip(self.mechanisms, stored, strict=True)):
            mechanism.load_state_dict(mechanism_state)
            mechanism.load_state_arrays(list(arrays.get(f"mechanism_{index}", [])))

    def restore(self, checkpoint: Checkpoint) -> None:
        """Restore the checkpoint's state and account every release logged after it (each left the server, and the
        ledger restored from the checkpoint has not counted it). Refused where a mechanism of the pipeline cannot
        release a round again with fresh noise and a round after the checkpoint was released with CSPRNG noise."""
        logged = int(checkpoint.strategy_state.get("releases_logged", 0))
        fresh = [release.round for release in self.releases.owed_after(logged) if release.randomness != "seeded"]
        for mechanism in self.mechanisms if fresh else ():
            if reason := mechanism.rerelease_refusal():
                raise ConfigError(
                    f"resume: rounds after the checkpoint (round {checkpoint.round}) were released with CSPRNG "
                    f"noise; {reason}. Resume from a checkpoint of the last released round (checkpoint_every=1)"
                )
        self.load_state(checkpoint.strategy_state, checkpoint.strategy_arrays)
        if self.account is not None:
            released = int(checkpoint.strategy_state.get("releases_logged", checkpoint.round))
            self.releases.resume(self.account.budget, released, logged)
        epsilon = float("inf") if self.account is None else self.account.epsilon()
        log(INFO, "Resuming after round %d (epsilon so far %.4g)", checkpoint.round, epsilon)

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
        if self.account is None:
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

