"""Clipping diagnostics of a round (DP-FedSAM journal Eq. 18 / Fig. 4; docs/running.md, "Metrics"): statistics of
the pre-clip norms ‖Δ_i‖, the mean clip factor ᾱ and its dispersion α̃ = mean |α_i − ᾱ|, the share of clipped
updates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fl_app.privacy.mechanisms.clipping import clip_factor

CLIPPING_STATS_KEYS = (
    "norm_mean",
    "norm_median",
    "norm_max",
    "norm_q25",
    "norm_q75",
    "alpha_mean",
    "alpha_dispersion",
    "fraction_clipped",
)


def clipping_stats(norms: Sequence[float], clip_norm: float) -> dict[str, float]:
    """Summary of the pre-clip norms ‖Δ_i‖ of one round.

    Keys: ``norm_mean``, ``norm_median``, ``norm_max``, ``norm_q25``, ``norm_q75`` (linear-interpolation
    quantiles), ``alpha_mean`` ᾱ = mean α_i with α_i = min(1, C/‖Δ_i‖), ``alpha_dispersion``
    α̃ = mean |α_i − ᾱ| (journal Eq. 18), ``fraction_clipped`` (share with ‖Δ_i‖ > C).

    With no norms every value is NaN: "no clients" is not "nothing was clipped", and NaN keeps a missing round
    from being averaged into plots as a real zero.
    """
    values = np.asarray(norms, dtype=np.float64)
    if values.size == 0:
        return dict.fromkeys(CLIPPING_STATS_KEYS, float("nan"))
    alphas = np.array([clip_factor(float(norm), clip_norm) for norm in values])
    alpha_mean = float(alphas.mean())
    q25, median, q75 = np.quantile(values, [0.25, 0.5, 0.75])
    return {
        "norm_mean": float(values.mean()),
        "norm_median": float(median),
        "norm_max": float(values.max()),
        "norm_q25": float(q25),
        "norm_q75": float(q75),
        "alpha_mean": alpha_mean,
        "alpha_dispersion": float(np.abs(alphas - alpha_mean).mean()),
        "fraction_clipped": float((values > clip_norm).mean()),
    }
