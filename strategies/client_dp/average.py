"""The released average of a private round (docs/mechanisms.md, 3-5; McMahan et al., "Learning Differentially
Private Recurrent Language Models", ICLR 2018, Alg. 1 with the fixed denominator), at the server.

Every accepted update (or a cohort's sum of k of them) is clipped again to C (k·C) where the server clips — under
server placement it trusts no client's clip; under client placement the updates carry their clients' noise and
cannot be clipped again. The round's average is the uniform sum over the FIXED denominator m = qM, whoever answered,
so that one client moves it by at most C/m. The pipeline's server steps then run on it in order (the mechanisms of
:mod:`fl_app.privacy.pipeline`): the server's share of the Gaussian noise N(0, σ²C²/m²) — all of it under server
placement, the top-up for the clients that did not contribute under client placement (placement.py) — the
noise's support, DP-FTRL's correlated noise, DP-FedSAM-topk's top-k of the noisy average.

A strategy whose releases are private in another way (Noisy-FedAvg's clients noise their models) has no
:class:`NoisyAverage`: its server takes the plain mean of what arrived.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from fl_app.instructions import STREAM_SERVER_NOISE
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.pipeline import GaussianNoise, Mechanism, ServerStep, run_server_steps
from fl_app.privacy.prefetch import PrefetchedNormals
from strategies.client_dp.clipping import ClipNorm
from strategies.client_dp.placement import Placement


class ReleasedRound(Protocol):
    """What the average needs of the round it releases (a :class:`strategies.rounds.RoundPlan`): its number, the
    model's shapes, the round's public mask, and its server noise if drawn ahead (:meth:`NoisyAverage.draw_noise_ahead`
    sets it)."""

    server_round: int
    mask: list[np.ndarray] | None
    server_noise: mech.RandomSource | None

    @property
    def shapes(self) -> list[tuple[int, ...]]: ...


#: The run's noise source of a round and purpose (seeded streams or the OS CSPRNG: strategies/client_dp/randomness.py).
NoiseSource = Callable[[int, int], mech.RandomSource]


class NoisyAverage:
    """A private round's average: the server's re-clip of each accepted sum (:meth:`reclip`), the uniform sum over
    ``expected_clients`` (m) and the server steps of ``mechanisms`` (:meth:`average`), with the update noise
    multiplier σ = ``noise_multiplier``, the clip norm of ``clipping`` (C_t, which adaptive clipping moves between
    rounds) and the noise ``placement``; each round's draws come from the source it is handed."""

    def __init__(
        self,
        mechanisms: Sequence[Mechanism],
        placement: Placement,
        clipping: ClipNorm,
        *,
        noise_multiplier: float,
        expected_clients: float,
    ) -> None:
        self.mechanisms = tuple(mechanisms)
        self.placement = placement
        self.clipping = clipping
        self.noise_multiplier = float(noise_multiplier)
        self.expected_clients = float(expected_clients)

    def reclip(self, total: list[np.ndarray], clients: int, norm: float = math.nan) -> tuple[list[np.ndarray], int]:
        """A screened sum of ``clients`` updates held to clients·C where the server clips; (sum, clients if it had to
        be re-clipped else 0). ``norm`` is its global L2 norm as the screening measured it (NaN: measured here)."""
        if not self.placement.server_clips:
            return total, 0
        # Never trust the client's clipping: the sensitivity bound C/m must hold for any reply. A cohort's worker
        # re-clipped each client to C, so a sum of k such updates is within k·C.
        bound = clients * self.clipping.clip_norm
        total, was_reclipped = mech.reclip(total, bound, norm=None if math.isnan(norm) else norm)
        return total, clients * int(was_reclipped)

    def average(
        self, plan: ReleasedRound, updates: list[list[np.ndarray]], num_clients: int, noise_source: NoiseSource
    ) -> list[np.ndarray]:
        """The released average of ``updates`` (client updates, or cohort sums of them: their sum is the same) that
        hold ``num_clients`` client updates: the uniform sum over m, then the server steps, in order, drawing from
        ``noise_source`` (the run's randomness as resolved: strategies/client_dp/randomness.py)."""
        average = mech.uniform_average(updates, self.expected_clients, plan.shapes)
        rng = plan.server_noise
        if rng is None:
            rng = noise_source(plan.server_round, STREAM_SERVER_NOISE)
        step = ServerStep(
            noise_std=self.placement.server_noise_std(
                self.noise_multiplier, self.clipping.clip_norm, self.expected_clients, num_clients
            ),
            rng=rng,
            mask=plan.mask,
            updates=updates,
        )
        return run_server_steps(self.mechanisms, average, step)

    def draw_noise_ahead(self, plan: ReleasedRound, noise_source: NoiseSource) -> None:
        """Start drawing the round's server noise on a background thread (:class:`PrefetchedNormals`: the stream
        :meth:`average` would draw from, so the same values), where the server adds noise whoever answers (server
        placement and a Gaussian-noise step); idempotent. The run calls it when the round's first reply is in, so
        that the draw runs on the core that worker freed instead of after the last reply."""
        if plan.server_noise is not None or self.placement.clients_add_noise:
            return
        if not any(isinstance(mechanism, GaussianNoise) for mechanism in self.mechanisms):
            return
        plan.server_noise = PrefetchedNormals(noise_source(plan.server_round, STREAM_SERVER_NOISE), plan.shapes)
