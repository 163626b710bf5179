"""Client-side privacy recipe: the order in which a client applies the mechanisms to its update.

DP-FedAvg / DP-FedSAM (journal Alg. 1 lines 10–12): Δ → clip to C on the global norm (Eq. 10) → in client
placement add N(0, σ²C²/m) (Eq. 11). Non-private references send Δ unchanged. The math is in
:mod:`fl_app.privacy.mechanisms`; this module only decides the order.
"""

from __future__ import annotations

import numpy as np

from fl_app.instructions import STREAM_CLIENT_NOISE, TrainInstructions
from fl_app.privacy import mechanisms as mech


def noise_rng(instructions: TrainInstructions, partition_id: int) -> np.random.Generator:
    """The client's noise source: the OS CSPRNG in deployment, a (seed, round, client) stream in simulation."""
    if instructions.secure_noise:
        return mech.secure_rng()
    return mech.make_rng(instructions.seed, instructions.server_round, STREAM_CLIENT_NOISE, partition_id)


def privatize_update(
    update: list[np.ndarray], instructions: TrainInstructions, partition_id: int
) -> tuple[list[np.ndarray], float]:
    """Return (what the client sends, the update's global L2 norm before clipping)."""
    if instructions.clip_norm <= 0:
        return update, mech.global_l2_norm(update)
    clipped, norm = mech.clip_update(update, instructions.clip_norm)
    if instructions.add_noise:
        std = mech.gaussian_noise_std(
            instructions.noise_multiplier, instructions.clip_norm, instructions.expected_clients, "client"
        )
        clipped = mech.add_gaussian_noise(clipped, std, noise_rng(instructions, partition_id))
    return clipped, norm
