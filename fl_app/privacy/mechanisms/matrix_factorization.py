"""DP-FTRL with correlated noise by matrix factorization: BLT, banded Toeplitz and identity factorizations.

Pure mathematics (numpy/scipy only), no state, no project imports.

Setting. Over n rounds the server consumes the (clipped, summed) client updates x_0, …, x_{n−1} through a linear
*workload* A (n×n, lower-triangular Toeplitz): the model after round t is w_0 + η (A x)_t. The matrix-factorization
mechanism (Denisov et al. 2022; Choquette-Choo et al. 2023) writes A = B·C and releases C x + z, z ~ N(0, σ² I),
i.e. the server uses x̂ = x + C⁻¹ z, so the model carries the noise B z = A C⁻¹ z. Everything here is lower-triangular
Toeplitz and is represented by its first column, the *Toeplitz coefficients* c_0, c_1, … (``toeplitz_matrix``).

Workloads (:func:`workload_coefficients`): prefix sums (a_j = 1; server SGD w_t = w_0 + η Σ_{s≤t} x̂_s) and heavy-ball
momentum β (v ← βv + x̂; w ← w + ηv), a_j = (1 − β^{j+1})/(1 − β), generating function 1/((1 − x)(1 − βx)).

Factorizations:

- **identity**: C = I (coefficients ``[1.0]``): independent noise each round (DP-FedAvg).
- **BLT** (buffered linear Toeplitz; Dvijotham, McMahan, Pillutla, Steinke, Thakurta 2024, arXiv 2404.16706, Eq. (1)
  and Lemma 5.2; McMahan, Xu, Zhang 2024, arXiv 2408.08868, Algorithms 2–3): with d buffers, output scales θ_i and
  buffer decays ω_i, c_0 = 1 and c_j = Σ_i θ_i ω_i^{j−1} (j ≥ 1), generating function
  C(x) = 1 + Σ_i θ_i x / (1 − ω_i x), a rational function of degree d. Its inverse is again rational, so w = C⁻¹ z is
  computed in streaming form with d buffers (:func:`blt_inverse_step`, Alg. 3 of arXiv 2408.08868). Naming: this
  module (like jax-privacy's *field names*) calls θ ``output_scale`` and ω ``buf_decay``; note that arXiv 2404.16706
  and jax-privacy's *formulas* use the opposite letters (θ for the decay, ω for the scale).
- **banded Toeplitz** (BandMF; Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta, Xu, NeurIPS 2023,
  arXiv 2306.08153): c_j = 0 for j ≥ bands; C⁻¹z is computed from the last bands−1 outputs
  (:func:`banded_inverse_step`, Alg. 9 of arXiv 2306.08153).
- **Toeplitz square root of the prefix sums** (Fichtenberger, Henzinger, Upadhyay 2023): c_j = binom(2j, j)/4^j, the
  coefficients of (1 − x)^{−1/2}; the dense reference (:func:`sqrt_prefix_coefficients`).

Objective (:func:`loss`), as in jax-privacy's ``LossFn.build_min_sep(error='mean')`` (arXiv 2408.08868 Sec. 2):

    loss(C) = sens²(C; k, b, n) · MSE(C),   MSE(C) = (1/n) Σ_{t<n} ‖row_t(A C⁻¹)‖²,

the mean over rounds of the variance of the noise in the t-th iterate (per unit σ² and coordinate), scaled by the
squared sensitivity under (k, b) participation: each client at most k times, any two participations ≥ b rounds apart
(``fl_app.privacy.accounting.matrix_factorization.min_separation_sensitivity``). At a fixed privacy level the noise
std σ is proportional to the sensitivity, so the loss is the model's mean squared noise up to the common factor
(σ/sens)².  For non-negative, non-increasing coefficients sens² is attained by participating in rounds 0, b, 2b, …
(arXiv 2405.13763 Theorem 2, the result jax-privacy's ``toeplitz.minsep_sensitivity_squared`` cites); for banded
C with bands ≤ b the columns touched by one client are orthogonal and sens² = Σ_m ‖column_{mb}‖².

Optimisers (:func:`optimize_blt`, :func:`optimize_banded`) are deterministic (fixed starts, L-BFGS-B with central
finite differences) and evaluate the loss in O(n·d) per call with IIR filtering (``scipy.signal.lfilter``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize
from scipy.signal import lfilter

# ------------------------------------------------------------------------------------------------------------
# Toeplitz basics
# ------------------------------------------------------------------------------------------------------------


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return int(n)


def _check_momentum(momentum: float) -> float:
    momentum = float(momentum)
    if not (math.isfinite(momentum) and 0.0 <= momentum < 1.0):
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    return momentum


def _as_coefs(coefs: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(coefs, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"coefficients must be a non-empty 1-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("coefficients must be finite")
    if arr[0] == 0.0:
        raise ValueError("the leading coefficient c_0 must be non-zero (C must be invertible)")
    return arr


def _pad(coefs: np.ndarray, n: int) -> np.ndarray:
    """The first n coefficients, zero-padded."""
    out = np.zeros(n, dtype=np.float64)
    m = min(n, coefs.size)
    out[:m] = coefs[:m]
    return out


def workload_coefficients(n: int, momentum: float = 0.0) -> np.ndarray:
    """Toeplitz coefficients a_0..a_{n−1} of the workload A.

    momentum 0: prefix sums, a_j = 1 (server SGD, w_t = w_0 + η Σ_{s≤t} x̂_s). Heavy-ball momentum β
    (v ← βv + x̂; w ← w + ηv): a_j = Σ_{i≤j} β^i = (1 − β^{j+1})/(1 − β).
    """
    n = _check_n(n)
    beta = _check_momentum(momentum)
    if beta == 0.0:
        return np.ones(n, dtype=np.float64)
    return (1.0 - beta ** np.arange(1, n + 1, dtype=np.float64)) / (1.0 - beta)


def toeplitz_matrix(coefs: Sequence[float] | np.ndarray, n: int) -> np.ndarray:
    """The n×n lower-triangular Toeplitz matrix M[i, j] = c_{i−j} (i ≥ j), coefs zero-padded / truncated to n."""
    n = _check_n(n)
    c = _pad(np.asarray(coefs, dtype=np.float64).ravel(), n)
    idx = np.arange(n)
    diff = idx[:, None] - idx[None, :]
    return np.where(diff >= 0, c[np.clip(diff, 0, n - 1)], 0.0)


def inverse_coefficients(coefs: Sequence[float] | np.ndarray, n: int) -> np.ndarray:
    """Toeplitz coefficients of C⁻¹ (n of them) for lower-triangular Toeplitz C with coefs (c_0 ≠ 0).

    Forward substitution on C w = e_0 (w_t = (δ_t − Σ_{j≥1} c_j w_{t−j}) / c_0), run as the IIR filter 1/C(x).
    """
    n = _check_n(n)
    c = _as_coefs(coefs)[:n]
    impulse = np.zeros(n, dtype=np.float64)
    impulse[0] = 1.0
    return np.asarray(lfilter([1.0], c, impulse), dtype=np.float64)


def _noise_coefficients(inverse: np.ndarray, momentum: float) -> np.ndarray:
    """Toeplitz coefficients of B = A C⁻¹ given those of C⁻¹ (A: prefix sums with momentum)."""
    if momentum == 0.0:
        return np.cumsum(inverse)
    # A(x) = 1 / ((1 − x)(1 − βx)) = 1 / (1 − (1 + β)x + βx²).
    return np.asarray(lfilter([1.0], [1.0, -(1.0 + momentum), momentum], inverse), dtype=np.float64)


def _mse_from_inverse(inverse: np.ndarray, momentum: float) -> float:
    n = inverse.size
    b = _noise_coefficients(inverse, momentum)
    # Row t of the Toeplitz B has squared norm Σ_{j≤t} b_j²; the mean over t weights b_j² by (n − j)/n.
    weights = (n - np.arange(n, dtype=np.float64)) / n
    return float(np.dot(b * b, weights))


def mean_squared_error(coefs: Sequence[float] | np.ndarray, n: int, momentum: float = 0.0) -> float:
    """MSE(C) = (1/n) Σ_{t<n} ‖row_t(A C⁻¹)‖²: the mean per-round variance of the workload's noise for σ = 1."""
    n = _check_n(n)
    momentum = _check_momentum(momentum)
    return _mse_from_inverse(inverse_coefficients(coefs, n), momentum)


def min_separation_sensitivity_squared(
    coefs: Sequence[float] | np.ndarray, n: int, min_separation: int, max_participations: int
) -> float:
    """sens² = max over participation patterns π of Σ_{i,j∈π} (CᵀC)_{ij} for the n×n lower-triangular Toeplitz C.

    π: at most k rounds among 0..n−1, pairwise ≥ b apart (k capped at ⌈n/b⌉); zero-out adjacency, each participation
    moves its round's input by at most 1 (the clip norm). Two closed forms:

    - coefficients (first n) non-negative and non-increasing: the maximum is at π = {0, b, 2b, …} (arXiv 2405.13763
      Theorem 2, the source jax-privacy's ``toeplitz.minsep_sensitivity_squared`` cites; used by arXiv 2408.08868),
      sens² = ‖Σ_{m<k} column_{mb}‖²;
    - otherwise, if the last non-zero coefficient has index < b (bands ≤ b): columns touched by one client are
      orthogonal, sens² = Σ_{m<k} ‖column_{mb}‖² (column norms are non-increasing in the index).

    Raises ValueError for any other coefficients (no closed form; the maximum over patterns is then a hard problem).
    """
    n, b, k = _check_participation(n, min_separation, max_participations)
    c = _pad(_as_coefs(coefs), n)
    # Non-increasing up to rounding (1e-15·c_0), so that BLTs with a decay within float64 of 1 are accepted.
    if c[0] > 0 and np.all(c >= 0) and np.all(np.diff(c) <= 1e-15 * c[0]):
        return _minsep_sens_sq_monotone(c, b, k)
    nonzero = np.flatnonzero(c)
    bands = int(nonzero[-1]) + 1
    if bands <= b:
        return _banded_sens_sq(c[:bands], n, b, k)
    raise ValueError(
        "min-separation sensitivity needs non-negative, non-increasing coefficients or bands ≤ min_separation; got "
        f"{bands} bands > min_separation {b} and coefficients {c[: min(n, 8)].tolist()}…"
    )


def loss(
    coefs: Sequence[float] | np.ndarray,
    n: int,
    min_separation: int,
    max_participations: int,
    momentum: float = 0.0,
) -> float:
    """sens²(C under (k, b), n rounds) × MSE(C): the objective both optimisers minimise (module docstring)."""
    sens_sq = min_separation_sensitivity_squared(coefs, n, min_separation, max_participations)
    return sens_sq * mean_squared_error(coefs, n, momentum)


def sqrt_prefix_coefficients(n: int) -> np.ndarray:
    """c_j = binom(2j, j) / 4^j, the coefficients of (1 − x)^{−1/2}: C = √A for the prefix sums (C² = A).

    Fichtenberger, Henzinger, Upadhyay 2023; computed by the recurrence c_j = c_{j−1} (2j − 1) / (2j).
    """
    n = _check_n(n)
    j = np.arange(1, n, dtype=np.float64)
    return np.concatenate(([1.0], np.cumprod((2.0 * j - 1.0) / (2.0 * j))))


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


# ------------------------------------------------------------------------------------------------------------
# Fast loss for the optimisers (O(n·d) per evaluation)
# ------------------------------------------------------------------------------------------------------------


def _effective_k(n: int, min_separation: int, max_participations: int) -> int:
    return min(max_participations, -(-n // min_separation))


def _minsep_sens_sq_monotone(c: np.ndarray, b: int, k: int) -> float:
    """sens² for non-negative non-increasing coefficients: ‖Σ_{m<k} column_{mb}‖² (jax-privacy's cumsum trick)."""
    n = c.size
    rows = -(-n // b)
    padded = np.zeros(rows * b, dtype=np.float64)
    padded[:n] = c
    cs = np.cumsum(padded.reshape(rows, b), axis=0)
    if k < rows:
        cs[k:] = cs[k:] - cs[:-k].copy()
    u = cs.ravel()[:n]
    return float(np.dot(u, u))


def _banded_sens_sq(c: np.ndarray, n: int, b: int, k: int) -> float:
    """sens² for bands ≤ b: Σ_{m<k} ‖column_{mb}‖², ‖column_i‖² = Σ_{j < min(bands, n − i)} c_j²."""
    csq = np.cumsum(c * c)
    total = 0.0
    for m in range(k):
        i = m * b
        total += float(csq[min(c.size, n - i) - 1])
    return total


def _blt_polys(theta: np.ndarray, omega: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """C(x) = p(x)/q(x) in ascending powers: q = Π(1 − ω_i x), p = q + Σ_i θ_i x Π_{j≠i}(1 − ω_j x)."""
    q = np.array([1.0])
    for w in omega:
        q = np.convolve(q, [1.0, -w])
    p = q.copy()
    for i, t in enumerate(theta):
        others = np.array([1.0])
        for j, w in enumerate(omega):
            if j != i:
                others = np.convolve(others, [1.0, -w])
        p[1:] += t * others
    return p, q


def _blt_log_loss(theta: np.ndarray, omega: np.ndarray, n: int, b: int, k: int, momentum: float) -> float:
    powers = omega[None, :] ** np.arange(n - 1, dtype=np.float64)[:, None]
    c = np.concatenate(([1.0], powers @ theta))
    sens_sq = _minsep_sens_sq_monotone(c, b, k)
    p, q = _blt_polys(theta, omega)
    impulse = np.zeros(n, dtype=np.float64)
    impulse[0] = 1.0
    inverse = np.asarray(lfilter(q, p, impulse), dtype=np.float64)  # C⁻¹(x) = q(x)/p(x)
    mse = _mse_from_inverse(inverse, momentum)
    value = math.log(sens_sq) + math.log(mse)
    return value if math.isfinite(value) else 1e300


def _blt_from_params(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """θ_i = e^{u_i} / (1 + Σ_j e^{u_j}) (θ > 0, Σθ < 1), ω_i = 1 / (1 + e^{−v_i}) (0 < ω < 1)."""
    d = x.size // 2
    u, v = x[:d], x[d:]
    top = max(0.0, float(np.max(u)))
    eu = np.exp(u - top)
    theta = eu / (math.exp(-top) + eu.sum())
    omega = np.empty(d)
    pos = v >= 0
    omega[pos] = 1.0 / (1.0 + np.exp(-v[pos]))
    ev = np.exp(v[~pos])
    omega[~pos] = ev / (1.0 + ev)
    return theta, omega


def _params_from_blt(theta: np.ndarray, omega: np.ndarray) -> np.ndarray:
    rest = 1.0 - theta.sum()
    return np.concatenate((np.log(theta / rest), np.log(omega / (1.0 - omega))))


def _check_participation(n: int, min_separation: int, max_participations: int) -> tuple[int, int, int]:
    n = _check_n(n)
    for name, value in (("min_separation", min_separation), ("max_participations", max_participations)):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return n, int(min_separation), _effective_k(n, int(min_separation), int(max_participations))


def optimize_blt(
    n: int,
    min_separation: int,
    max_participations: int,
    buffers: int = 3,
    momentum: float = 0.0,
) -> BLT:
    """The BLT with ``buffers`` buffers minimising :func:`loss` (sens² under (k, b) × mean squared error).

    Search space: θ_i > 0, 0 < ω_i < 1 and Σθ_i < 1, reparametrised without constraints (θ by a softmax with an
    extra zero logit, ω by a sigmoid). There the coefficients are positive and non-increasing (c_1 = Σθ < 1 = c_0,
    and each c_j = Σθ_i ω_i^{j−1} decreases in j), which the min-separation sensitivity formula needs; the
    constraint Σθ < 1 is necessary for this (θ > 0, ω ∈ (0,1) alone allow c_1 > c_0). They also keep C(x) free of
    zeros in the closed unit disk (Re C(x) ≥ 1 − Σθ_i/(1 + ω_i) > 0), so C⁻¹'s coefficients decay and the
    loss is evaluated stably by IIR filtering.

    Minimises log(loss) by L-BFGS-B with central finite differences from a fixed set of starts (decays spread
    geometrically towards 1 at two scales of n); deterministic. ``buffers = 0`` returns the identity.
    """
    n, b, k = _check_participation(n, min_separation, max_participations)
    momentum = _check_momentum(momentum)
    if isinstance(buffers, bool) or not isinstance(buffers, int | np.integer) or buffers < 0:
        raise ValueError(f"buffers must be a non-negative integer, got {buffers!r}")
    d = int(buffers)
    if d == 0 or n == 1:
        return BLT(output_scale=(0.0,) * d, buf_decay=(0.0,) * d)  # C = I

    def objective(x: np.ndarray) -> float:
        theta, omega = _blt_from_params(x)
        return _blt_log_loss(theta, omega, n, b, k, momentum)

    starts: list[np.ndarray] = []
    for span in (1.0, 0.5):
        # Time constants 1/(1 − ω) spread log-uniformly over [1.5, n^span]; θ sums to 1/2 (c_1 = 1/2, as for √A).
        top = max(2.0, float(n) ** span)
        taus = np.geomspace(1.5, top, d) if d > 1 else np.array([max(2.0, top / 4.0)])
        theta = np.full(d, 0.5 / d) * (np.linspace(1.5, 0.5, d) if d > 1 else np.ones(1))
        starts.append(_params_from_blt(theta, 1.0 - 1.0 / taus))

    best_x: np.ndarray | None = None
    best_f = math.inf
    for x0 in starts:
        result = minimize(
            objective,
            x0,
            method="L-BFGS-B",
            jac="3-point",
            bounds=[(-40.0, 40.0)] * (2 * d),
            options={"maxiter": 300, "ftol": 1e-12, "gtol": 1e-8},
        )
        value = float(result.fun)
        if value < best_f - 1e-12:
            best_f, best_x = value, np.asarray(result.x)
    assert best_x is not None
    theta, omega = _blt_from_params(best_x)
    order = np.argsort(-omega, kind="stable")  # jax-privacy's canonical order: decays decreasing
    return BLT(output_scale=tuple(theta[order]), buf_decay=tuple(omega[order]))


def optimize_banded(
    n: int,
    bands: int,
    min_separation: int,
    max_participations: int,
    momentum: float = 0.0,
) -> np.ndarray:
    """Coefficients c_0..c_{bands−1} (c_0 = 1) of the banded Toeplitz C minimising :func:`loss`.

    Requires bands ≤ min_separation: then two columns touched by one client do not overlap, sens² = Σ over its
    participations of the column norms², maximal (column norms are non-increasing in the column index) for the
    earliest pattern 0, b, 2b, …: k·Σc_j² when those columns are not truncated by the end. The coefficients are
    free (any sign); L-BFGS-B with central finite differences on log(loss), started from the truncated square root
    of the prefix sums; deterministic. bands = 1 is the identity.
    """
    n, b, k = _check_participation(n, min_separation, max_participations)
    momentum = _check_momentum(momentum)
    if isinstance(bands, bool) or not isinstance(bands, int | np.integer) or bands < 1:
        raise ValueError(f"bands must be a positive integer, got {bands!r}")
    bands = int(bands)
    if bands > b:
        raise ValueError(f"bands ({bands}) must be ≤ min_separation ({b}) for the orthogonal-column sensitivity")
    bands = min(bands, n)
    if bands == 1:
        return np.ones(1)
    impulse = np.zeros(n, dtype=np.float64)
    impulse[0] = 1.0

    def objective(x: np.ndarray) -> float:
        c = np.concatenate(([1.0], x))
        inverse = np.asarray(lfilter([1.0], c, impulse), dtype=np.float64)
        if not np.all(np.isfinite(inverse)):
            return 1e300
        value = math.log(_banded_sens_sq(c, n, b, k)) + math.log(_mse_from_inverse(inverse, momentum))
        return value if math.isfinite(value) else 1e300

    x0 = sqrt_prefix_coefficients(bands)[1:]
    result = minimize(
        objective, x0, method="L-BFGS-B", jac="3-point", options={"maxiter": 2000, "ftol": 1e-14, "gtol": 1e-10}
    )
    best = result.x if result.fun <= objective(x0) else x0
    return np.concatenate(([1.0], np.asarray(best, dtype=np.float64)))


__all__ = [
    "BLT",
    "banded_inverse_step",
    "blt_inverse_step",
    "inverse_coefficients",
    "loss",
    "mean_squared_error",
    "min_separation_sensitivity_squared",
    "optimize_banded",
    "optimize_blt",
    "sqrt_prefix_coefficients",
    "toeplitz_matrix",
    "workload_coefficients",
]
