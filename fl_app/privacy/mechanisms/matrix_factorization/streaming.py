"""The factorizations as the server streams them: the BLT's parameters and one step of w = C⁻¹z for a BLT (d buffers)
or a banded Toeplitz C (the last bands − 1 outputs), state passed explicitly (see the package docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fl_app.privacy.mechanisms.matrix_factorization.toeplitz import _as_coefs, _check_n

# ------------------------------------------------------------------------------------------------------------
# BLT
# ------------------------------------------------------------------------------------------------------------


def _float_tuple(name: str, values: Sequence[float] | np.ndarray) -> tuple[float, ...]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {values!r}")
    return tuple(float(v) for v in arr)


@dataclass(frozen=True)
class BLT:
    """A buffered linear Toeplitz C: c_0 = 1, c_j = Σ_i θ_i ω_i^{j−1} (j ≥ 1), θ = output_scale, ω = buf_decay.

    Same parameters as jax-privacy's ``BufferedToeplitz(buf_decay, output_scale)`` (which represents C, the strategy
    matrix, not C⁻¹; its ``toeplitz_coefs(n)`` equals :meth:`coefficients`).

    Constraints checked here: both tuples finite and of equal length d ≥ 0 (d = 0 is the identity), and
    0 ≤ ω_i < 1 so that the coefficients decay geometrically (jax-privacy's ``sensitivity_squared`` returns ∞ for a
    decay > 1 and its optimiser keeps 0 < ω < 1). Not required here but needed by the min-separation sensitivity
    formula (checked where used): coefficients non-negative and non-increasing, which holds when θ_i > 0,
    0 < ω_i < 1 and Σ_i θ_i ≤ 1 (c_1 = Σθ ≤ c_0 = 1; jax-privacy penalises sum(output_scale) ≥ 1 for this reason).
    jax-privacy's optimiser further keeps Σ θ_i/ω_i < 1 (its "Pillutla score") so that C⁻¹ is a BLT with decays in
    (0, 1) and negative scales.
    """

    output_scale: tuple[float, ...]
    buf_decay: tuple[float, ...]

    def __post_init__(self) -> None:
        scale = _float_tuple("output_scale", self.output_scale)
        decay = _float_tuple("buf_decay", self.buf_decay)
        if len(scale) != len(decay):
            raise ValueError(f"output_scale and buf_decay must have equal lengths, got {len(scale)} and {len(decay)}")
        if any(not 0.0 <= w < 1.0 for w in decay):
            raise ValueError(f"buf_decay must lie in [0, 1), got {decay!r}")
        object.__setattr__(self, "output_scale", scale)
        object.__setattr__(self, "buf_decay", decay)

    @property
    def buffers(self) -> int:
        """d, the number of buffers (state size of the streaming C⁻¹ in units of one model)."""
        return len(self.buf_decay)

    def coefficients(self, n: int) -> np.ndarray:
        """Toeplitz coefficients c_0..c_{n−1} of C."""
        n = _check_n(n)
        out = np.zeros(n, dtype=np.float64)
        out[0] = 1.0
        if self.buffers and n > 1:
            theta = np.asarray(self.output_scale)
            omega = np.asarray(self.buf_decay)
            powers = omega[None, :] ** np.arange(n - 1, dtype=np.float64)[:, None]  # 0**0 = 1
            out[1:] = powers @ theta
        return out

    def to_dict(self) -> dict[str, list[float]]:
        """JSON-safe form: {"output_scale": [...], "buf_decay": [...]} (Python floats)."""
        return {"output_scale": list(self.output_scale), "buf_decay": list(self.buf_decay)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BLT:
        """Inverse of :meth:`to_dict`."""
        extra = set(data) - {"output_scale", "buf_decay"}
        if extra:
            raise ValueError(f"unexpected BLT keys: {sorted(extra)}")
        return cls(output_scale=tuple(data["output_scale"]), buf_decay=tuple(data["buf_decay"]))


def blt_inverse_step(z: np.ndarray, buffers: np.ndarray, blt: BLT) -> tuple[np.ndarray, np.ndarray]:
    """One streaming step of w = C⁻¹ z for C = ``blt`` (Alg. 3 of arXiv 2408.08868).

    w_t = z_t − Σ_i θ_i S_{i,t}, then S_{i,t+1} = ω_i S_{i,t} + w_t. ``buffers`` has shape (d, *z.shape) and is zero at
    t = 0. Returns (w_t, new buffers) in float64; the inputs are not modified.
    """
    z = np.asarray(z, dtype=np.float64)
    buffers = np.asarray(buffers, dtype=np.float64)
    d = blt.buffers
    if buffers.shape != (d, *z.shape):
        raise ValueError(f"buffers must have shape {(d, *z.shape)}, got {buffers.shape}")
    if d == 0:
        return z.copy(), buffers.copy()
    theta = np.asarray(blt.output_scale)
    omega = np.asarray(blt.buf_decay)
    w = z - np.tensordot(theta, buffers, axes=(0, 0))
    expand = (d,) + (1,) * z.ndim
    new_buffers = omega.reshape(expand) * buffers + w[None, ...]
    return w, new_buffers


def banded_inverse_step(z: np.ndarray, history: np.ndarray, coefs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One streaming step of w = C⁻¹ z for banded Toeplitz C with ``len(coefs)`` bands (Alg. 9 of arXiv 2306.08153).

    w_t = (z_t − Σ_{j=1}^{bands−1} c_j w_{t−j}) / c_0; ``history`` has shape (bands − 1, *z.shape), most recent first
    (zeros at t = 0). Returns (w_t, new history) in float64; the inputs are not modified.
    """
    c = _as_coefs(coefs)
    z = np.asarray(z, dtype=np.float64)
    history = np.asarray(history, dtype=np.float64)
    if history.shape != (c.size - 1, *z.shape):
        raise ValueError(f"history must have shape {(c.size - 1, *z.shape)}, got {history.shape}")
    if c.size == 1:
        return z / c[0], history.copy()
    w = (z - np.tensordot(c[1:], history, axes=(0, 0))) / c[0]
    new_history = np.concatenate((w[None, ...], history[:-1]), axis=0)
    return w, new_history


