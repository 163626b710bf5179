"""Screening and aggregation of client updates (docs/mechanisms.md, 3 and 5): what must be rejected before
aggregation (wrong tensor count, shapes or dtype; NaN/Inf or an overflowing norm), and the uniform sum and average
over the fixed denominator m = qM, in float64 and in order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from fl_app.privacy.mechanisms.norms import NDArrays, global_l2_norm


def is_finite_update(update: Sequence[np.ndarray]) -> bool:
    """True if no tensor contains NaN or ±Inf (such updates are rejected before aggregation)."""
    return all(bool(np.isfinite(np.asarray(tensor)).all()) for tensor in update)


def has_shapes(update: Sequence[np.ndarray], reference_shapes: Sequence[tuple[int, ...]]) -> bool:
    """True if the update has exactly one tensor per reference shape, each of that shape."""
    if len(update) != len(reference_shapes):
        return False
    return all(tuple(np.shape(tensor)) == tuple(shape) for tensor, shape in zip(update, reference_shapes, strict=True))


def measure_update(
    update: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]]
) -> tuple[Literal["shape", "nonfinite"] | None, float]:
    """The screening of an update from a client (docs/mechanisms.md, 5): why it must be rejected before
    aggregation, or None if it may be used — ``shape`` (wrong tensor count, shapes or a non-floating dtype) or
    ``nonfinite`` (NaN/Inf anywhere, or a global norm that overflows) — and the :func:`global_l2_norm` it measured
    (NaN when it did not get that far), for a receiver that re-clips next (:func:`reclip`'s ``norm``)."""
    if not has_shapes(update, shapes) or not all(np.issubdtype(np.asarray(u).dtype, np.floating) for u in update):
        return "shape", math.nan
    # One pass decides: the norm is a sum of squares, so a NaN anywhere makes it NaN and an infinity infinite (no
    # inf - inf can arise). Finite values can still overflow it (float64 coordinates of 1e200): such an update
    # cannot be clipped, so it is rejected like a NaN.
    with np.errstate(over="ignore", invalid="ignore"):
        norm = global_l2_norm(update)
    if not math.isfinite(norm):
        return "nonfinite", norm
    return None, norm


def uniform_sum(updates: Sequence[Sequence[np.ndarray]], shapes: Sequence[tuple[int, ...]]) -> NDArrays:
    """Σ_i Δ_i in float64, in the given order (zeros of ``shapes`` for no updates); see :func:`uniform_average`."""
    totals = [np.zeros(tuple(shape), dtype=np.float64) for shape in shapes]
    for index, update in enumerate(updates):
        if not has_shapes(update, shapes):
            raise ValueError(f"update {index} does not match the model's tensor shapes")
        add_to_sum(totals, update)
    return totals


def add_to_sum(totals: Sequence[np.ndarray], update: Sequence[np.ndarray]) -> None:
    """``totals += update`` in place, tensor by tensor: one step of :func:`uniform_sum` (float64 ``totals``), for a
    caller that adds updates one at a time instead of holding them all."""
    if not has_shapes(update, [np.shape(total) for total in totals]):
        raise ValueError("the update does not match the sum's tensor shapes")
    for total, tensor in zip(totals, update, strict=True):
        # The ufunc widens each coordinate to float64 as it adds (exactly, for every float dtype): the same sums as
        # adding a float64 copy, without making one per tensor.
        np.add(total, np.asarray(tensor), out=total)


def uniform_average(
    updates: Sequence[Sequence[np.ndarray]],
    denominator: float,
    shapes: Sequence[tuple[int, ...]],
) -> NDArrays:
    """Σ_i Δ_i / denominator with uniform weights (docs/mechanisms.md, 3), returned as float32.

    The denominator is the fixed m = qM, not the number of updates received: then one client moves the average
    by at most C/m whatever the others do, which is the sensitivity the accountant assumes. Sample-count
    weights would break that bound. Summation runs in float64 in the given order, so the result is
    deterministic and does not depend on float32 accumulation error. No updates gives zeros of the given
    shapes.
    """
    if denominator <= 0 or not math.isfinite(denominator):
        raise ValueError(f"denominator must be a positive finite number, got {denominator}")
    # Divided in float64 and rounded to float32 as each value is written (the ufunc's output cast): the values of
    # (total / m).astype(float32), without a float64 quotient of the whole model in between.
    return [
        np.divide(total, denominator, out=np.empty(total.shape, np.float32), casting="unsafe")
        for total in uniform_sum(updates, shapes)
    ]
