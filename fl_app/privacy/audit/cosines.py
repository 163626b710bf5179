"""The test statistics of G. Andrew et al., "One-shot Empirical Privacy Estimation for Federated Learning", ICLR
2024 (arXiv 2302.03098v5), §4, from the canaries' dot products with the model deltas: the cosine of each canary
with the final model's displacement w_T − w_0 (only the final model released) and the maximum over rounds of
its cosine with Δ_t (every iterate released).
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def _dots_matrix(dots: np.ndarray) -> np.ndarray:
    matrix = np.asarray(dots, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"dots must have shape (canaries, rounds), got {matrix.shape}")
    if not np.isfinite(matrix).all():
        raise ValueError("dots must be finite")
    return matrix


def _positive_finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def final_model_statistics(dots: np.ndarray, final_delta_norm: float) -> np.ndarray:
    """cos(u_i, w_T − w_0) for each canary: Σ_t dots[i, t] / ‖w_T − w_0‖ (Andrew et al. §4, final-model threat model).

    w_T − w_0 = Σ_t Δ_t, so the dot product with the final model's displacement is the sum of the per-round dots
    (summed in float64); ``final_delta_norm`` is ‖w_T − w_0‖, measured on the models themselves (the norm of the
    sum is not a function of the per-round norms).
    """
    matrix = _dots_matrix(dots)
    return matrix.sum(axis=1) / _positive_finite("final_delta_norm", final_delta_norm)


def all_iterates_statistics(dots: np.ndarray, delta_norms: np.ndarray) -> np.ndarray:
    """max_t cos(u_i, Δ_t) = max_t dots[i, t] / ‖Δ_t‖ for each canary (Andrew et al. §4, all iterates released).

    When the adversary sees every model delta, an inserted canary shows up as a large cosine in the rounds that
    included it; the paper's statistic — and the authors' code, which keeps a running ``tf.maximum`` of the
    per-round cosines — takes the maximum over rounds. The ε is then :func:`estimate_epsilon` on these values
    (one Gaussian fitted to the inserted canaries' maxima and one to the never-inserted canaries' maxima, which
    the authors' code records for this purpose): the null has to be measured, since the maximum of T null cosines
    is not N(0, 1/d).
    A round with ‖Δ_t‖ = 0 has no cosine and is rejected.
    """
    matrix = _dots_matrix(dots)
    norms = np.asarray(delta_norms, dtype=np.float64)
    if norms.shape != (matrix.shape[1],):
        raise ValueError(f"delta_norms must have shape ({matrix.shape[1]},), got {norms.shape}")
    if matrix.shape[1] == 0:
        raise ValueError("all_iterates_statistics needs at least one round")
    if not (np.isfinite(norms).all() and (norms > 0).all()):
        raise ValueError("every round's ‖Δ_t‖ must be positive and finite (a zero delta has no cosine)")
    return (matrix / norms).max(axis=1)
