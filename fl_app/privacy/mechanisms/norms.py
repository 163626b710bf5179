"""An update and its size: ``NDArrays`` (one array per model tensor, normally float32) and the global L2 norm
‖Δ‖ = sqrt(Σ_l ‖Δ_l‖²) over all its tensors, accumulated in float64 (the norm that journal Eq. 10 clips;
docs/mechanisms.md, 2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

NDArrays = list[np.ndarray]


_NORM_BLOCK = 1 << 16


def global_l2_norm(update: Sequence[np.ndarray]) -> float:
    """L2 norm of the whole flattened update, ‖Δ‖ = sqrt(Σ_l ‖Δ_l‖²).

    Accumulated in float64: float32 accumulation over millions of coordinates loses enough precision to make
    the clipping guarantee ‖Δ̃‖ ≤ C unverifiable.
    """
    total = 0.0
    for tensor in update:
        flat = np.asarray(tensor).ravel()
        # Converted block by block: a float64 copy of a whole model is a fresh multi-MB allocation per call (and a
        # float64 tensor, such as a cohort's sum, is read where it lies: the same values, so the same norm).
        for start in range(0, flat.size, _NORM_BLOCK):
            block = flat[start : start + _NORM_BLOCK].astype(np.float64, copy=False)
            total += float(np.dot(block, block))
    return math.sqrt(total)
