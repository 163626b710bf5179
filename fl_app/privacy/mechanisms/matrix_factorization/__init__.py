"""DP-FTRL with correlated noise by matrix factorization: BLT, banded Toeplitz and identity factorizations.

Pure mathematics (numpy/scipy only), no state. One idea a module: ``toeplitz`` (coefficients, workloads, error,
sensitivity, loss), ``streaming`` (the BLT and one step of C⁻¹z), ``optimize`` (the optimisers).

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
(``fl_app.privacy.accountants.matrix_factorization.min_separation_sensitivity``). At a fixed privacy level the noise
std σ is proportional to the sensitivity, so the loss is the model's mean squared noise up to the common factor
(σ/sens)².  For non-negative, non-increasing coefficients sens² is attained by participating in rounds 0, b, 2b, …
(arXiv 2405.13763 Theorem 2, the result jax-privacy's ``toeplitz.minsep_sensitivity_squared`` cites); for banded
C with bands ≤ b the columns touched by one client are orthogonal and sens² = Σ_m ‖column_{mb}‖².

Optimisers (:func:`optimize_blt`, :func:`optimize_banded`) are deterministic (fixed starts, L-BFGS-B with central
finite differences) and evaluate the loss in O(n·d) per call with IIR filtering (``scipy.signal.lfilter``).
"""

from fl_app.privacy.mechanisms.matrix_factorization.optimize import optimize_banded, optimize_blt
from fl_app.privacy.mechanisms.matrix_factorization.streaming import BLT, banded_inverse_step, blt_inverse_step
from fl_app.privacy.mechanisms.matrix_factorization.toeplitz import (
    inverse_coefficients,
    loss,
    mean_squared_error,
    min_separation_sensitivity_squared,
    sqrt_prefix_coefficients,
    toeplitz_matrix,
    workload_coefficients,
)

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
