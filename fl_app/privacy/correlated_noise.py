"""DP-FTRL's correlated noise as a pipeline mechanism: the matrix-factorization mechanism streamed by the server.

For a workload A (the server optimizer's linear map from the rounds' averages to the models: prefix sums for SGD,
the momentum matrix for heavy-ball momentum) and a factorization A = B·C, the mechanism releases
A(x + C⁻¹z) with z_t ~ N(0, σ²C²/m² I) per round (Denisov et al. 2022; Choquette-Choo et al., NeurIPS 2023,
arXiv 2306.08153, Eq. 1): the server adds the t-th row of C⁻¹z to round t's fixed-denominator average and its
optimizer applies A. Its privacy is one Gaussian mechanism of sensitivity sens_Π(C) over the whole run under the
participation rule Π (each client at most k times, at least b rounds apart): fl_app/privacy/accountants/
matrix_factorization.py. Nothing is amplified by sampling, so the rule is what the server must enforce
(fl_app/privacy/mechanisms/participation.py).

The factorizations (fl_app/privacy/mechanisms/matrix_factorization.py has their mathematics):

* ``blt`` — buffered linear Toeplitz (Dvijotham et al. 2024, arXiv 2404.16706; McMahan, Xu, Zhang 2024, arXiv
  2408.08868): C⁻¹z streamed from d model-sized buffers, w_t = z_t − Σ_i θ_i S_i, S_i ← ω_i S_i + w_t.
* ``banded`` — a b-banded Toeplitz C (BandMF's band structure, bands ≤ b so one client's columns are orthogonal):
  w_t = (z_t − Σ_{j<bands} c_j w_{t−j}) / c_0 from the last bands−1 noise vectors.
* ``identity`` — C = I: independent noise every round (DP-FedAvg with no amplification: k Gaussian releases).

The correlated stream lives on the server: it spans the rounds, and a client takes part in at most k of them, so
no client can hold it (client placement is refused by the DP-FTRL strategies). The buffers are the mechanism's
state; a checkpoint stores them with the model (they hold the run's noise: whoever has a checkpoint can subtract
the correlated part of it, so a checkpoint is as secret as the CSPRNG's draws), and a resume continues the
stream bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fl_app.core.choices import FACTORIZATIONS, FactorizationName
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.accountants.events import GDPEvent
from fl_app.privacy.mechanisms import matrix_factorization as mf
from fl_app.privacy.mechanisms.participation import ParticipationRule
from fl_app.privacy.pipeline import Mechanism, NDArrays, PrivacyEvent, ReleaseParameters, ServerStep


@dataclass(frozen=True)
class Factorization:
    """The strategy matrix C of A = B·C for a run of ``rounds`` rounds: its Toeplitz coefficients (c_0 … ; the
    banded and identity ones are as long as their band), the BLT's parameters when it is a BLT, and the workload it
    was optimised for (``momentum`` β: 0 = prefix sums, the server's plain SGD step)."""

    name: FactorizationName
    rounds: int
    coefficients: tuple[float, ...]
    blt: mf.BLT | None = None
    momentum: float = 0.0
    #: The rule the coefficients were optimised under (the accounting is always for the run's own rule).
    rule: ParticipationRule | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.name not in FACTORIZATIONS:
            raise ValueError(f"factorization must be one of {FACTORIZATIONS}, got {self.name!r}")
        if self.rounds < 1 or not self.coefficients or self.coefficients[0] == 0:
            raise ValueError(f"a factorization needs rounds >= 1 and c_0 != 0, got {self.rounds}, {self.coefficients}")
        if (self.name == "blt") != (self.blt is not None):
            raise ValueError("a BLT factorization, and only it, carries BLT parameters")

    @classmethod
    def optimized(
        cls,
        name: FactorizationName,
        rounds: int,
        rule: ParticipationRule,
        *,
        buffers: int = 3,
        bands: int | None = None,
        momentum: float = 0.0,
    ) -> Factorization:
        """The factorization ``name`` optimised for ``rounds`` rounds of the workload (momentum β) under ``rule``:
        the BLT with ``buffers`` buffers, the banded Toeplitz with ``bands`` bands (None = b), or the identity."""
        b, k = rule.min_separation, rule.max_participations_in(rounds)
        if name == "identity":
            return cls("identity", rounds, (1.0,), momentum=momentum, rule=rule)
        if name == "banded":
            bands = min(b, rounds) if bands is None else bands
            if not 1 <= bands <= b:
                raise ValueError(
                    f"a banded factorization needs 1 <= bands <= b = {b} (orthogonal columns), got {bands}"
                )
            coefs = mf.optimize_banded(rounds, bands, b, k, momentum=momentum)
            return cls("banded", rounds, tuple(float(c) for c in coefs), momentum=momentum, rule=rule)
        blt = mf.optimize_blt(rounds, b, k, buffers=buffers, momentum=momentum)
        return cls("blt", rounds, tuple(float(c) for c in blt.coefficients(rounds)), blt, momentum, rule)

    @property
    def toeplitz(self) -> np.ndarray:
        """The coefficients as an array (what the accounting reads)."""
        return np.asarray(self.coefficients, dtype=np.float64)

    @property
    def state_vectors(self) -> int:
        """How many model-sized vectors the stream keeps (BLT: d buffers; banded: bands − 1; identity: 0)."""
        if self.blt is not None:
            return self.blt.buffers
        return len(self.coefficients) - 1 if self.name == "banded" else 0

    def to_dict(self) -> dict[str, Any]:
        """What run.json and a checkpoint state of the factorization (JSON-safe)."""
        out: dict[str, Any] = {"name": self.name, "rounds": self.rounds, "momentum": self.momentum}
        if self.blt is not None:
            out["blt"] = self.blt.to_dict()
        else:
            out["coefficients"] = list(self.coefficients)
        return out

    def describe(self) -> str:
        workload = "prefix sums (server SGD)" if self.momentum == 0 else f"heavy-ball momentum beta={self.momentum:g}"
        if self.blt is not None:
            shape = f"BLT with {self.blt.buffers} buffers"
        elif self.name == "banded":
            shape = f"{len(self.coefficients)}-banded Toeplitz"
        else:
            shape = "identity (independent noise)"
        return f"{shape} for {self.rounds} rounds of {workload}"


class CorrelatedNoise(Mechanism):
    """The server adds round t's row of σ·C⁻¹z (in units of C/m: ``step.noise_std`` = σC/m) to the average.

    The stream's state is the number of releases and the BLT's buffers (or the banded factorization's last
    bands − 1 noise vectors), float64 over the flattened model."""

    def __init__(self, factorization: Factorization) -> None:
        self.factorization = factorization
        #: Rounds released so far: the row of C⁻¹ the next round takes.
        self.releases = 0
        self._vectors: np.ndarray | None = None

    def rerelease_refusal(self) -> str | None:
        # Round t's noise is row t of C⁻¹z: a second draw for that row is outside the factorization's analysis.
        return ("DP-FTRL cannot release those rows of its factorization again with fresh noise (outside its "
                "accounting)")  # fmt: skip

    def server_step(self, average: NDArrays, step: ServerStep) -> NDArrays:
        if self.releases >= self.factorization.rounds:
            raise RuntimeError(
                f"the factorization was built for {self.factorization.rounds} rounds; round "
                f"{self.releases + 1} has no row of it (and no accounting)"
            )
        arrays = [np.asarray(a) for a in average]
        if step.noise_std == 0:
            self.releases += 1
            return [a.copy() for a in arrays]
        # z drawn tensor by tensor in list order from the round's source, as GaussianNoise draws (seeded or CSPRNG).
        z = np.concatenate([np.asarray(step.rng.normal(0.0, 1.0, size=a.shape), np.float64).ravel() for a in arrays])
        w = self._correlate(z)
        self.releases += 1
        out, offset = [], 0
        for a in arrays:
            out.append(mech.add_in_float64(a, step.noise_std * w[offset : offset + a.size].reshape(a.shape)))
            offset += a.size
        return out

    def _correlate(self, z: np.ndarray) -> np.ndarray:
        """w_t = (C⁻¹z)_t from this round's z and the stream's state."""
        f = self.factorization
        if f.state_vectors == 0:
            return z / f.coefficients[0]
        if self._vectors is None:
            self._vectors = np.zeros((f.state_vectors, z.size), dtype=np.float64)
        if self._vectors.shape[1] != z.size:
            raise ValueError(
                f"the noise stream holds vectors of {self._vectors.shape[1]} values, the model has {z.size}"
            )
        if f.blt is not None:
            w, self._vectors = mf.blt_inverse_step(z, self._vectors, f.blt)
        else:
            w, self._vectors = mf.banded_inverse_step(z, self._vectors, f.toeplitz)
        return w

    def privacy_event(self, release: ReleaseParameters) -> PrivacyEvent:
        # One more row of the factorization released: the ledger's bound is the whole mechanism's μ after T rows
        # (fl_app/privacy/accountants/matrix_factorization.py), not a composition of per-round events.
        return GDPEvent()

    def state_dict(self) -> dict[str, Any]:
        return {"correlated_noise": {"factorization": self.factorization.to_dict(), "releases": self.releases}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        stored = state.get("correlated_noise")
        if not isinstance(stored, dict):
            raise ValueError("checkpoint has no correlated-noise state for DP-FTRL's mechanism")
        mine = self.factorization.to_dict()
        if stored.get("factorization") != mine:
            raise ValueError(f"checkpoint's factorization {stored.get('factorization')} is not this run's {mine}")
        releases = stored.get("releases")
        if isinstance(releases, bool) or not isinstance(releases, int) or not 0 <= releases <= mine["rounds"]:
            raise ValueError(f"correlated-noise releases must be an integer in [0, {mine['rounds']}], got {releases!r}")
        self.releases = releases
        self._vectors = None

    def state_arrays(self) -> NDArrays:
        return [] if self._vectors is None else [self._vectors.copy()]

    def load_state_arrays(self, arrays: NDArrays) -> None:
        if not arrays:
            if self.releases and self.factorization.state_vectors:
                raise ValueError(f"checkpoint after {self.releases} releases holds no noise buffers")
            self._vectors = None
            return
        (vectors,) = arrays
        vectors = np.asarray(vectors, dtype=np.float64)
        if vectors.ndim != 2 or vectors.shape[0] != self.factorization.state_vectors:
            raise ValueError(
                f"noise buffers of shape {vectors.shape}, expected ({self.factorization.state_vectors}, d)"
            )
        self._vectors = vectors.copy()
