"""Chaos testing (config ``fault_injection``): corrupt what a client sends, as a broken or hostile client would."""

from __future__ import annotations

import numpy as np


def inject_fault(fault: str, update: list[np.ndarray]) -> list[np.ndarray]:
    """``nan``: a NaN in the first tensor; ``wrong_shape``: an extra tensor; ``huge_norm``: the update ×10⁶.
    Any other value (``""``, or ``raise``, which the caller handles) leaves the update as it is."""
    if fault == "nan":
        update = [u.copy() for u in update]
        update[0].flat[0] = np.nan
    elif fault == "wrong_shape":
        update = [*update, np.zeros(3, dtype=np.float32)]
    elif fault == "huge_norm":
        update = [u * np.float32(1e6) for u in update]
    return update
