"""A client's update as the server takes it, on every DP path (docs/mechanisms.md, 5; docs/PRIVACY.md, 4): nothing a
client sends is trusted. :func:`trained_update` turns a reply's trained model into the update Δ = trained − global
that the server clips, and screens it; :data:`REJECTION_KINDS` names why a reply is not aggregated, in the words
every round's counts, logs and run failures use (our strategies' rounds and
:class:`strategies.flower_dp.ClientLevelDP` alike)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fl_app.privacy import mechanisms as mech

#: Why a reply is not aggregated: ``failed`` (an error reply), ``malformed`` (another layout, or an answer to no
#: message of the round, from another node than it went to, or a second answer), ``shape`` (other keys, shapes or a
#: non-floating dtype), ``nonfinite`` (NaN/Inf, or a norm that overflows).
REJECTION_KINDS = ("failed", "malformed", "shape", "nonfinite")


def trained_update(
    trained: Sequence[np.ndarray], global_weights: Sequence[np.ndarray]
) -> tuple[str | None, list[np.ndarray], float]:
    """The update Δ = trained − global of a reply that sent its trained model (Flower's convention, and every reply
    :class:`strategies.flower_dp.ClientLevelDP` takes), in float64: (None, Δ, its global L2 norm), or the rejection
    kind with no update: "shape" for other shapes or a non-floating dtype (the released model is floating and every
    coordinate gets noise), "nonfinite" for NaN/Inf anywhere or finite entries whose norm overflows."""
    shapes = [np.shape(g) for g in global_weights]
    floating = all(np.issubdtype(np.asarray(t).dtype, np.floating) for t in trained)
    if not (floating and mech.has_shapes(trained, shapes)):
        return "shape", [], math.nan
    with np.errstate(over="ignore", invalid="ignore"):  # inf − inf and overflows are screened just below
        update = [np.subtract(t, g, dtype=np.float64) for t, g in zip(trained, global_weights, strict=True)]
    kind, norm = mech.measure_update(update, shapes)
    if kind is not None:
        return kind, [], math.nan
    return None, update, norm
