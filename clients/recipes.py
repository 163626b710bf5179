"""The client's side of the privacy pipeline: its update through its recipe's client steps.

The steps and their order are :mod:`fl_app.privacy.pipeline`'s (the recipe named by
:class:`fl_app.instructions.RecipeSpec`); this module only turns the round's instructions into the client's
:class:`~fl_app.privacy.pipeline.ClientStep`: C, its share of the noise (client placement) and its noise source.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fl_app.instructions import STREAM_CLIENT_NOISE, TrainInstructions
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.pipeline import ClientStep, mechanisms_for, run_client_steps


def noise_rng(instructions: TrainInstructions, partition_id: int) -> mech.NormalSource:
    """The client's noise source: the OS CSPRNG in deployment, a (seed, round, client) stream in simulation, keyed
    also by the run's noise key under ``privacy.noise_stream=per_run`` (Noisy-FedAvg's absolute noise included)."""
    secure = instructions.secure_noise or instructions.seed is None
    return mech.random_source(
        secure,
        instructions.seed,
        instructions.server_round,
        STREAM_CLIENT_NOISE,
        partition_id,
        noise_key=instructions.noise_key,
    )


def client_step(
    instructions: TrainInstructions, partition_id: int, shared_mask: Sequence[np.ndarray] | None = None
) -> ClientStep:
    """The state the client steps share: C, the client's noise std σC/√m if it adds noise, its noise source."""
    noise_std = None
    if instructions.add_noise and instructions.clip_norm > 0:
        noise_std = mech.gaussian_noise_std(
            instructions.noise_multiplier, instructions.clip_norm, instructions.expected_clients, "client"
        )
    return ClientStep(
        clip_norm=instructions.clip_norm,
        noise_std=noise_std,
        rng=noise_rng(instructions, partition_id),
        shared_mask=shared_mask,
    )


def privatize_update(
    update: list[np.ndarray],
    instructions: TrainInstructions,
    partition_id: int,
    shared_mask: Sequence[np.ndarray] | None = None,
) -> tuple[list[np.ndarray], float]:
    """Return (what the client sends, the global L2 norm of what was clipped, before clipping)."""
    step = client_step(instructions, partition_id, shared_mask)
    return run_client_steps(mechanisms_for(instructions.recipe), update, step)
