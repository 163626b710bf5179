"""Per-layer sparsification masks, both keeping exactly k_l = ⌈p · d_l⌉ coordinates of layer l: top-k of an update
(DP-FedSAM-topk, journal Eq. 12) and uniformly random rand-k (Fed-SMP-randk; both defined in docs/algorithms.md);
and Δ ⊙ mask.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fl_app.privacy.mechanisms.norms import NDArrays
from fl_app.privacy.mechanisms.randomness import RandomSource


def kept_count(size: int, fraction: float) -> int:
    """k_l = ⌈p · d_l⌉, the number of coordinates a layer of ``size`` keeps (docs/algorithms.md).

    A product within a relative 1e-9 of an integer counts as that integer, so that e.g. p = 0.7, d = 10
    keeps 7 and not 8 because 0.7 · 10 evaluates to 7.000000000000001 in binary floating point.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if size < 0:
        raise ValueError(f"size must be non-negative, got {size}")
    product = fraction * size
    nearest = round(product)
    k = nearest if abs(product - nearest) <= 1e-9 * max(1.0, product) else math.ceil(product)
    return int(min(max(k, 0), size))


def topk_mask(update: Sequence[np.ndarray], fraction: float) -> list[np.ndarray]:
    """Per-layer boolean masks keeping exactly k_l = ⌈p · d_l⌉ largest-magnitude coordinates (journal Eq. 12).

    Ties at the threshold magnitude are broken towards the lower flat index, so the mask is a deterministic
    function of the values. Selection is O(d) via a partition, not a full sort, because ResNet layers are
    large. For DP-FedSAM-topk it must be computed from the *noised average* to be post-processing of what the
    accountant covers (docs/algorithms.md).
    """
    masks = []
    for tensor in update:
        values = np.asarray(tensor)
        if not np.isfinite(values).all():
            raise ValueError("topk_mask needs a finite update")
        magnitude = np.abs(values).ravel()
        size = magnitude.size
        k = kept_count(size, fraction)
        mask = np.zeros(size, dtype=bool)
        if k == size:
            mask[:] = True
        elif k > 0:
            threshold = np.partition(magnitude, size - k)[size - k]
            mask = magnitude > threshold
            missing = k - int(mask.sum())
            mask[np.flatnonzero(magnitude == threshold)[:missing]] = True
        masks.append(mask.reshape(values.shape))
    return masks


def randk_mask(shapes: Sequence[tuple[int, ...]], fraction: float, rng: RandomSource) -> list[np.ndarray]:
    """Per-layer boolean masks keeping exactly k_l = ⌈p · d_l⌉ coordinates, uniformly without replacement.

    Data-independent (drawn from the server's round RNG in Fed-SMP-randk, docs/algorithms.md), so the mask is
    public and costs no privacy. Layers are drawn in list order from ``rng``.
    """
    masks = []
    for shape in shapes:
        size = math.prod(shape)
        k = kept_count(size, fraction)
        mask = np.zeros(size, dtype=bool)
        mask[rng.choice(size, size=k, replace=False)] = True
        masks.append(mask.reshape(tuple(shape)))
    return masks


def apply_mask(update: Sequence[np.ndarray], mask: Sequence[np.ndarray]) -> NDArrays:
    """Δ ⊙ mask: a new update with the unmasked coordinates set to zero, dtypes preserved."""
    if len(update) != len(mask):
        raise ValueError(f"update has {len(update)} tensors but mask has {len(mask)}")
    result = []
    for tensor, keep in zip(update, mask, strict=True):
        values = np.asarray(tensor)
        keep = np.asarray(keep, dtype=bool)
        if values.shape != keep.shape:
            raise ValueError(f"mask shape {keep.shape} does not match tensor shape {values.shape}")
        result.append(np.where(keep, values, np.zeros((), dtype=values.dtype)))
    return result
