"""A run's releases as the round loop sees them: the write-ahead log, what a resumed run owes its ledger, and the
rounds a seeded re-run must repeat bit for bit (fl_app/releases.py has the log and the reasoning).

Every noisy model that leaves the server is a release the ledger must count. :class:`RunReleases` is the round
loop's one object for them: the log line is written before the model can leave (:meth:`record`), a resumed run
learns which logged releases its restored ledger has not seen (:meth:`owed_after`), and a seeded re-run of a
released round either repeats that release (no new ε: :meth:`repeats`) or is refused before anything leaves.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from fl_app.releases import Release, ReleaseLog, ReleaseMismatchError, releases_to_account
from strategies.client_dp.budget import PrivacyBudget


class RunReleases:
    """The releases of one run: logged in ``directory`` (None: not logged; a plain algorithm's run releases nothing
    the log is for)."""

    def __init__(self, directory: Path | None, seeded: bool) -> None:
        self.seeded = seeded
        self.log = None
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self.log = ReleaseLog(directory)
        #: Lines in the log: a checkpoint stores it, and resuming from that checkpoint accounts every line after it.
        self.logged = self.log.count() if self.log is not None else 0
        # Rounds a resumed seeded run re-runs after they were released: {round: digests it may release again}.
        self._repeatable: dict[int, set[str]] = {}

    def owed_after(self, logged_at_checkpoint: int) -> list[Release]:
        """The releases logged after the checkpoint a run resumes from: each left the server, and the ledger
        restored from the checkpoint has not counted it. A CSPRNG re-run releases a new model (counted again); a
        seeded re-run must repeat its logged model (same noise) or is refused (:meth:`record`)."""
        if self.log is None:
            return []
        owed, self._repeatable = releases_to_account(self.log.since(logged_at_checkpoint))
        return owed

    def log_since(self, logged_at_checkpoint: int) -> list[Release]:
        """Every release logged after the checkpoint, as logged (repeats included)."""
        return [] if self.log is None else self.log.since(logged_at_checkpoint)

    def repeats(self, server_round: int) -> bool:
        """Whether ``server_round`` is a seeded re-run of a logged release: it repeats that release, already counted,
        and takes no new ε (nor the budget guard's)."""
        return self.seeded and server_round in self._repeatable  # filled from the log by owed_after()

    # ----- one policy for both of ClientLevelDP's layers: guard, release, resume ------------------------------------

    def guard(self, budget: PrivacyBudget, server_round: int) -> str | None:
        """Why round ``server_round`` may not start (``budget``'s guard), or None: a seeded re-run of a logged release
        repeats it (already counted) and is never stopped."""
        return None if self.repeats(server_round) else budget.over_budget(server_round)

    def release(self, budget: PrivacyBudget, server_round: int, weights: Iterable[np.ndarray], secure: bool) -> None:
        """Step 7: the round's model logged as released (write-ahead, durable: :meth:`record`), then accounted by
        ``budget``, unless it repeats a logged release (a seeded re-run: no new ε); all before it can leave."""
        repeat = self.repeats(server_round)
        self.record(budget.release(server_round, weights, secure))
        if not repeat:
            budget.account()

    def resume(self, budget: PrivacyBudget, released: int, logged_at_checkpoint: int) -> list[Release]:
        """Account into ``budget`` (restored with ``released`` releases) every release logged after the checkpoint
        (:meth:`owed_after`); the owed releases."""
        owed = self.owed_after(logged_at_checkpoint)
        budget.resume(released, owed)
        return owed

    def record(self, release: Release) -> None:
        """Write-ahead, before the model can leave the server (next broadcast, checkpoint): the release's log line,
        durable. A seeded re-run's model must be the one released for its round before the crash."""
        if self.repeats(release.round) and release.digest not in self._repeatable.pop(release.round):
            raise ReleaseMismatchError(
                f"resumed run: re-run round {release.round} produced a model other than the one released for it "
                "before the crash, with the same seeded noise (the accepted replies differ); releasing it would "
                "publish a noise-free difference. Refused: nothing of it has left the server. Start a new run, or "
                "use privacy.secure_noise=true, under which a re-run draws fresh noise"
            )
        if self.log is not None:
            self.log.append(release)
            self.logged += 1
