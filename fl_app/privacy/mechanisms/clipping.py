"""Global-norm clipping Δ̃ = Δ · min(1, C/‖Δ‖) (DP-FedSAM journal Eq. 10; docs/mechanisms.md, 2): the clip factor α,
the sender's clip (:func:`clip_update`, whose result is within C exactly, also in float32) and the receiver's
(:func:`reclip`, which never trusts the sender's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fl_app.privacy.mechanisms.norms import NDArrays, global_l2_norm

# How many times clip_update may shrink its factor by one ulp-sized step before giving up; a single step
# already suffices for float32 (see clip_update), the rest is headroom for float16/bfloat16-like dtypes.
_MAX_CLIP_RETRIES = 16
# In float64 only, after those: steps that double, up to 2³⁰ ulps (a relative 2.4e-7). A near-constant update rounds
# every coordinate the same way, and so do the terms of its norm's sum, so the measured norm can stay above C by
# many ulps (1e-14 relative on the CNN's 1.66M coordinates); a doubling step meets the bound with a shrink of at
# most twice what it needs, where a fixed one-ulp step would give up and fail the round.
_MAX_DOUBLING_RETRIES = 30


def _round_down(value: float, dtype: np.dtype) -> np.floating:
    """``value`` in ``dtype``, rounded towards zero (a clip factor must never grow by rounding)."""
    cast = np.asarray(value, dtype=dtype)[()]
    return np.nextafter(cast, dtype.type(0)) if float(cast) > value else cast


def clip_factor(norm: float, clip_norm: float) -> float:
    """α = min(1, C/‖Δ‖) (journal Eq. 10); α = 1 for the zero update, α = 0 for an infinite norm.

    Raises ValueError for a NaN or negative norm: a NaN update must be rejected upstream, not silently scaled.
    """
    if clip_norm <= 0 or not math.isfinite(clip_norm):
        raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm}")
    if math.isnan(norm) or norm < 0:
        raise ValueError(f"norm must be a non-negative number, got {norm}")
    if norm <= clip_norm:
        return 1.0
    return clip_norm / norm


#: How far above its bound a received update may be and still count as clipped by its sender: a correct clip lands
#: within float32 rounding of C (a relative 2⁻²⁴ ≈ 6e-8), so anything past 1e-5 is a sender that did not clip.
RECLIP_TOLERANCE = 1e-5


def _floating_arrays(update: Sequence[np.ndarray], caller: str) -> NDArrays:
    """The update's tensors as arrays; TypeError naming ``caller`` for a non-floating one."""
    arrays = [np.asarray(tensor) for tensor in update]
    for tensor in arrays:
        if not np.issubdtype(tensor.dtype, np.floating):
            raise TypeError(f"{caller} expects floating-point tensors, got dtype {tensor.dtype}")
    return arrays


def reclip(update: Sequence[np.ndarray], bound: float, norm: float | None = None) -> tuple[NDArrays, bool]:
    """The receiver's clip (the server's, or a cohort worker's after a client's recipe): never trust the sender's
    clip, clip to ``bound`` again; (the update within ``bound``, whether the sender had not clipped it to ``bound``).

    An update already within ``bound`` comes back as it is (its arrays, not copies: nothing to change, and the
    receiver only reads it); one beyond it as :func:`clip_update`'s clipped copy. ``norm`` is the update's
    :func:`global_l2_norm` when the caller has just measured it (:func:`measure_update`), so it is not measured
    twice; it must be that function's value for exactly these arrays.
    """
    arrays = _floating_arrays(update, "reclip")
    if norm is None:
        norm = global_l2_norm(arrays)
    if norm <= bound:  # False for NaN: clip_update below refuses a non-finite update
        return arrays, False
    clipped, norm = clip_update(arrays, bound)
    return clipped, norm > bound * (1 + RECLIP_TOLERANCE)


def clip_update(update: Sequence[np.ndarray], clip_norm: float) -> tuple[NDArrays, float]:
    """Clip to global L2 norm ``clip_norm`` (journal Eq. 10); returns (clipped copy, pre-clip norm).

    The norm is global over all tensors, never per tensor: per-tensor clipping (as in the released DP-FedSAM
    code) lets each of L tensors reach C, i.e. a sensitivity of C·√L instead of the accounted C.

    The input is not modified. An update with norm ≤ C is returned as an exact copy. For a clipped update the
    result satisfies ``global_l2_norm(result) <= clip_norm`` exactly, also in float32: scaling by α = C/‖Δ‖ and
    rounding each coordinate to float32 can overshoot C by up to a relative 2⁻²⁴, so the result is re-measured
    and, if needed, re-scaled with α shrunk by one epsilon at a time. The result keeps each tensor's dtype when
    the bound can be met in it; when it cannot (float16 coordinates scaled towards a tiny C land on subnormals,
    whose rounding error is absolute, not relative), the whole update is clipped in float64 instead.
    """
    arrays = _floating_arrays(update, "clip_update")
    norm = global_l2_norm(arrays)
    if not math.isfinite(norm):
        raise ValueError("cannot clip a non-finite update; reject it before clipping (docs/mechanisms.md, clipping)")
    alpha = clip_factor(norm, clip_norm)
    # Compare norms, not α == 1: for a norm one ulp above C, C/norm can round to exactly 1.0.
    if norm <= clip_norm:
        return [tensor.copy() for tensor in arrays], norm

    clipped = _scale_within(arrays, alpha, clip_norm)
    if clipped is None:
        clipped = _scale_within_float64(arrays, alpha, clip_norm)
    if clipped is None:
        raise FloatingPointError(f"could not clip update of norm {norm} below {clip_norm}, not even in float64")
    return clipped, norm


def _scale_within(arrays: Sequence[np.ndarray], alpha: float, clip_norm: float) -> NDArrays | None:
    """The tensors scaled by α (or slightly less) in their own dtypes with global norm ≤ ``clip_norm``, or None
    when the dtypes cannot meet the bound within a few shrinking steps."""
    # The shrink step is the coarsest epsilon among the dtypes present, so one step moves every dtype's rounded
    # factor down by at least one ulp.
    step = max((float(np.finfo(tensor.dtype).eps) for tensor in arrays), default=float(np.finfo(np.float64).eps))
    factor = alpha
    for _ in range(_MAX_CLIP_RETRIES):
        # Scaled in each tensor's own dtype (no float64 copy of the model) by the factor rounded down in that
        # dtype; the re-measurement below is what guarantees the bound.
        with np.errstate(under="ignore"):
            clipped = [tensor * _round_down(factor, tensor.dtype) for tensor in arrays]
        if global_l2_norm(clipped) <= clip_norm:
            return clipped
        factor *= 1.0 - step
    return None


def _scale_within_float64(arrays: Sequence[np.ndarray], alpha: float, clip_norm: float) -> NDArrays | None:
    """After :func:`_scale_within` failed in ``arrays``' own dtypes: the same in float64 where some dtype was
    narrower, then doubling steps (:data:`_MAX_DOUBLING_RETRIES`) in float64."""
    if any(tensor.dtype != np.float64 for tensor in arrays):
        arrays = [tensor.astype(np.float64) for tensor in arrays]
        clipped = _scale_within(arrays, alpha, clip_norm)
        if clipped is not None:
            return clipped
    shrink = float(np.finfo(np.float64).eps) * _MAX_CLIP_RETRIES
    for _ in range(_MAX_DOUBLING_RETRIES):
        shrink *= 2.0
        factor = alpha * (1.0 - shrink)
        clipped = [tensor * factor for tensor in arrays]
        if global_l2_norm(clipped) <= clip_norm:
            return clipped
    return None
