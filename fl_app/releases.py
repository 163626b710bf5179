"""Write-ahead log of the noisy models a run releases, so that ε counts every one of them across crashes.

Threat model (docs/PRIVACY.md): every noisy global model that leaves the server — broadcast to the next round's
clients, or written to a checkpoint or the final model — is a release the accountant must count. A run killed
between checkpoints has already released the rounds after its last checkpoint; on resume those rounds run again
and, with secure (CSPRNG) noise, release *new* models with fresh noise. The accountant restored from the
checkpoint knows neither, so :class:`ReleaseLog` records each release before the model can leave the server:
one JSON line, appended and ``fsync``-ed, in ``<output_dir>/releases.jsonl``. A checkpoint stores how many lines
the log had when it was written; resuming accounts every line after that (:meth:`ReleaseLog.since`).

With seeded noise (simulation), a re-run round repeats exactly the same noise and release, so nothing is added:
the resumed run's ε and model equal an uninterrupted run's (the log still shows the repeated rounds).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

RELEASES_FILE = "releases.jsonl"


@dataclass(frozen=True)
class Release:
    """One noisy model released after ``round``, by a mechanism with these parameters."""

    round: int
    noise_multiplier: float
    sample_rate: float
    randomness: str  # "os-csprng" or "seeded"


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
