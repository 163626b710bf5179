"""Where the server's randomness comes from (docs/mechanisms.md, 1 and 8; docs/PRIVACY.md): the round's sampler,
its masks and its noise.

Every draw is the OS CSPRNG when randomness is secure, else a seeded stream ``(seed, round, purpose)``
(:func:`fl_app.privacy.mechanisms.random_source` decides which, in one place). Noise streams are keyed also by the
run's ``noise_key`` under ``privacy.noise_stream=per_run``; sampling and masks are not, so the runs of one seed sample
the same clients. What this means for the guarantee is what ``run.json`` says: :meth:`RunRandomness.source` and
:meth:`RunRandomness.noise_stream_claim`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import numpy as np

from fl_app.config import DPConfig
from fl_app.privacy import mechanisms as mech


@dataclass(frozen=True)
class RunRandomness:
    """The run's random sources: ``secure`` (CSPRNG) or seeded by ``seed`` (and ``noise_key`` for noise), the
    sampler (``sampling`` at rate ``sample_rate``), and whether the run is known to face a real SuperLink
    (``deployment``: True/False once strategies/settings.py resolved it, None before)."""

    secure: bool
    seed: int
    noise_key: int | None
    sampling: str
    sample_rate: float
    deployment: bool | None = None

    @classmethod
    def for_config(cls, privacy: DPConfig, seed: int, noise_key: int | None) -> RunRandomness:
        """The sources of a run's ``privacy`` section (``secure_noise``: ``auto`` is seeded until resolved)."""
        return cls(privacy.secure_noise is True, seed, noise_key, privacy.sampling, privacy.sample_rate)

    def round_rng(self, server_round: int, purpose: int) -> mech.RandomSource:
        """The server's draws of a round for ``purpose`` (sampling, masks)."""
        return mech.random_source(self.secure, self.seed, server_round, purpose)

    def noise_rng(self, server_round: int, purpose: int) -> mech.RandomSource:
        """The server's noise draws of a round (the update's noise, the noisy counts): :meth:`round_rng`'s stream,
        keyed also by :attr:`noise_key` under ``privacy.noise_stream=per_run``."""
        return mech.random_source(self.secure, self.seed, server_round, purpose, noise_key=self.noise_key)

    def secret_key(self) -> int:
        """A key for draws that must stay secret from the clients (the canaries' directions and memberships): from
        the OS CSPRNG when randomness is secure — the run's seed goes to every client as the data layout's seed
        (``partition_seed``) — else the seed (a reproducible simulation)."""
        return secrets.randbits(62) if self.secure else self.seed

    def sample(self, population: int, rng: mech.RandomSource) -> np.ndarray:
        """The round's sampler (docs/mechanisms.md, 1) over ``population`` clients: each with probability q
        (Poisson), or round(q · population) of them uniformly (fixed size). The real clients and the audit's
        canaries are both drawn by this code, so whatever it does to one it does to the other (docs/audit.md)."""
        if self.sampling == "fixed":
            return mech.fixed_size_sample(population, round(self.sample_rate * population), rng)
        return mech.poisson_sample(population, self.sample_rate, rng)

    def source(self) -> str:
        """Where sampling, masks and noise come from (``run.json``: ``noise_source``, ``sampling_source``)."""
        if self.secure:
            return "os-csprng"
        if self.deployment:
            return ("seeded-prng (DEPLOYMENT: the seed is sent to every sampled client, who can recompute the "
                    "sampling and the server's noise; not private against clients)")  # fmt: skip
        return "seeded-prng (simulation; reproducible; private only while the seed stays secret)"

    def noise_stream_claim(self) -> dict[str, Any]:
        """Which runs draw this run's noise (``run.json``: ``noise_stream``): whoever sees two models with the same
        noise can subtract it, and no ε covers that pair (docs/PRIVACY.md)."""
        if self.secure:
            return {"mode": "secure", "shared_with": "no run: every noise draw comes from the OS CSPRNG"}
        if self.noise_key is None:
            shared = (
                f"every seeded run with seed={self.seed} and noise_stream=shared (any strategy, C, sigma): they draw "
                "the same standardized noise every round, so two of their models cancel each other's noise and no "
                "epsilon covers the pair; publish one, or use privacy.noise_stream=per_run"
            )
            return {"mode": "shared", "shared_with": shared}
        own = (f"only runs of this config (a re-run, a resume): any other config draws independent noise; client "
               f"sampling, masks and shuffles still follow seed={self.seed} alone")  # fmt: skip
        return {"mode": "per_run", "key": self.noise_key, "shared_with": own}
