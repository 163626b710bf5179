"""Client-side privacy recipes: the order in which a client applies the mechanisms to its update.

The math is in :mod:`fl_app.privacy.mechanisms`; this module only decides the order for each recipe kind
(:class:`fl_app.instructions.RecipeSpec`):

* ``dense`` — DP-FedAvg / DP-FedSAM (journal Alg. 1 lines 10–12): Δ → clip to C (Eq. 10) → [+ N(0, σ²C²/m), Eq. 11].
* ``topk_noisy`` / ``topk_clean`` — DP-FedSAM-topk (journal Alg. 1 option II, Eq. 12): as ``dense``, then keep the
  per-layer top-k of the noisy (or, non-DP option, the clean) update.
* ``shared_mask`` — Fed-SMP with the round's server mask (SPEC_BASELINES.md): Δ ⊙ mask [/ p] → clip →
  noise on the kept coordinates only.
* ``topk_local`` — Fed-SMP-topk as published: the client's own top-k of |Δ| → clip → noise on the kept coordinates.
* ``lus`` — BLUR + LUS: top-k of |Δ| (local update sparsification) → clip → dense noise.
* ``noisy_model`` — Noisy-FedAvg / Noisy-FedProx (seed 004): no update clipping (the local steps clipped each
  gradient to V), absolute noise N(0, σ² I) on the upload.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fl_app.instructions import STREAM_CLIENT_NOISE, TrainInstructions
from fl_app.privacy import mechanisms as mech


def noise_rng(instructions: TrainInstructions, partition_id: int) -> mech.NormalSource:
    """The client's noise source: the OS CSPRNG in deployment, a (seed, round, client) stream in simulation."""
    secure = instructions.secure_noise or instructions.seed is None
    return mech.random_source(secure, instructions.seed, instructions.server_round, STREAM_CLIENT_NOISE, partition_id)


def _pre_clip_mask(
    kind: str, update: list[np.ndarray], sparsity: float, shared_mask: Sequence[np.ndarray] | None
) -> list[np.ndarray] | None:
    """The mask applied before clipping (None = dense)."""
    if kind == "shared_mask":
        if shared_mask is None:
            raise ValueError("recipe shared_mask needs the round's mask from the server")
        return list(shared_mask)
    if kind in ("topk_local", "lus"):
        return mech.topk_mask(update, sparsity)
    return None


def privatize_update(
    update: list[np.ndarray],
    instructions: TrainInstructions,
    partition_id: int,
    shared_mask: Sequence[np.ndarray] | None = None,
) -> tuple[list[np.ndarray], float]:
    """Return (what the client sends, the global L2 norm of what was clipped, before clipping)."""
    recipe = instructions.recipe
    rng = noise_rng(instructions, partition_id)
    if recipe.kind == "noisy_model":
        return mech.add_gaussian_noise(update, recipe.noise_std, rng), mech.global_l2_norm(update)

    mask = _pre_clip_mask(recipe.kind, update, recipe.sparsity, shared_mask)
    if mask is not None:
        update = mech.apply_mask(update, mask)
        if recipe.kind == "shared_mask" and recipe.rescale:
            update = [u / np.asarray(recipe.sparsity, dtype=u.dtype) for u in update]
    if instructions.clip_norm <= 0:
        return update, mech.global_l2_norm(update)

    clipped, norm = mech.clip_update(update, instructions.clip_norm)
    sent = clipped
    if instructions.add_noise:
        std = mech.gaussian_noise_std(
            instructions.noise_multiplier, instructions.clip_norm, instructions.expected_clients, "client"
        )
        sent = mech.add_gaussian_noise(clipped, std, rng)
        if mask is not None and recipe.kind != "lus":  # Fed-SMP: noise on the kept coordinates only
            sent = mech.apply_mask(sent, mask)
    if recipe.kind == "topk_noisy":
        sent = mech.apply_mask(sent, mech.topk_mask(sent, recipe.sparsity))
    elif recipe.kind == "topk_clean":
        sent = mech.apply_mask(sent, mech.topk_mask(clipped, recipe.sparsity))
    return sent, norm
