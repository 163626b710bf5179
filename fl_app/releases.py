"""Write-ahead log of the noisy models a run releases, so that ε counts every one of them across crashes.

Threat model (docs/PRIVACY.md): every noisy global model that leaves the server — broadcast to the next round's
clients, or written to a checkpoint or the final model — is a release the accountant must count. A run killed
between checkpoints has already released the rounds after its last checkpoint; on resume those rounds run again
and, with secure (CSPRNG) noise, release *new* models with fresh noise. The accountant restored from the
checkpoint knows neither, so :class:`ReleaseLog` records each release before the model can leave the server:
one JSON line, appended and ``fsync``-ed, in ``<output_dir>/releases.jsonl``. A checkpoint stores how many lines
the log had when it was written; resuming accounts every line after that (:meth:`ReleaseLog.since`).

With seeded noise (simulation) a re-run round draws exactly the same noise as the logged release of that round.
That is the same release only if the model is the same: if the accepted replies differ between the two attempts
(a timeout, a failed worker — possibly the crash's cause) the two models share their noise, and their difference
(S₁ − S₂)/m carries no noise at all, which no accountant can cover (composition assumes fresh noise). Each record
therefore carries a digest of the released model (:func:`model_digest`); a resumed seeded run accounts the logged
releases once each at resume (:func:`releases_to_account`) and then refuses to release a re-run round whose model
differs from the logged one (:class:`ReleaseMismatchError`, raised before the model leaves the server). A re-run
that repeats its logged release adds nothing: the resumed run's ε and model equal an uninterrupted run's (the log
still shows the repeated rounds).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

RELEASES_FILE = "releases.jsonl"
#: A release's (and a checkpoint's) randomness: the OS CSPRNG, or the seeded streams of a simulation.
CSPRNG, SEEDED = "os-csprng", "seeded"


def randomness_name(secure: bool) -> str:
    """The name a release log and a checkpoint give a run's randomness."""
    return CSPRNG if secure else SEEDED


@dataclass(frozen=True)
class Release:
    """One noisy model released after ``round``, by a mechanism with these parameters."""

    round: int
    noise_multiplier: float
    sample_rate: float
    randomness: str  # "os-csprng" or "seeded"
    #: :func:`model_digest` of the released model (None in logs written before digests were recorded).
    digest: str | None = None


class ReleaseMismatchError(RuntimeError):
    """A re-run seeded round produced a model other than the one logged for it: releasing it would publish two
    models with the same noise, whose difference is noise-free."""


def model_digest(weights: Iterable[np.ndarray]) -> str:
    """SHA-256 over each tensor's dtype, shape and bytes, in order: equal iff the released models are equal."""
    digest = hashlib.sha256()
    for w in weights:
        array = np.ascontiguousarray(w)
        digest.update(f"{array.dtype.str}{array.shape};".encode())
        digest.update(array)  # the buffer itself: no copy
    return digest.hexdigest()


def releases_to_account(logged: list[Release]) -> tuple[list[Release], dict[int, set[str]]]:
    """What a resumed run owes for the releases logged after its checkpoint, and what its re-runs may repeat.

    Returns (releases to account now, {round: digests a seeded re-run of that round may release again}). CSPRNG
    releases are each a release of their own. Seeded releases are counted once per distinct (round, model): a
    round released twice with the same digest (an earlier resume that repeated it) is one release. A seeded record
    without a digest cannot be checked against its re-run, so the resume is refused.
    """
    owed: list[Release] = []
    repeatable: dict[int, set[str]] = {}
    for release in logged:
        if release.randomness != SEEDED:
            owed.append(release)
            continue
        if release.digest is None:
            raise ReleaseMismatchError(
                f"releases.jsonl has a seeded release of round {release.round} without a model digest (written "
                "by an older version): a re-run of that round cannot be checked against it; start a new run"
            )
        if release.digest not in repeatable.setdefault(release.round, set()):
            repeatable[release.round].add(release.digest)
            owed.append(release)
    return owed, repeatable


class ReleaseLog:
    """``<output_dir>/releases.jsonl``: append-only, one :class:`Release` per line, durable before it returns."""

    def __init__(self, output_dir: Path) -> None:
        self.path = Path(output_dir) / RELEASES_FILE

    def append(self, release: Release) -> None:
        """Write the release and force it to disk (file and directory entry) before the caller releases the model."""
        created = not self.path.exists()
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(asdict(release)) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if created:
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def read(self) -> list[Release]:
        """Every complete line; a torn last line (a crash mid-write, before the fsync returned) is no release."""
        if not self.path.exists():
            return []
        releases = []
        for line in self.path.read_text(encoding="utf-8").splitlines(keepends=True):
            if not line.endswith("\n"):
                break
            releases.append(Release(**json.loads(line)))
        return releases

    def count(self) -> int:
        return len(self.read())

    def since(self, count: int) -> list[Release]:
        """The releases logged after the first ``count`` (what a checkpoint written at that point did not see)."""
        return self.read()[count:]
