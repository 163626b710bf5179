"""Reference values from jax-privacy 2.0.0's own functions for tests/privacy/test_matrix_factorization.py.

Run with the separate venv that has jax-privacy (jax is not a dependency of this project):

    python3 -m venv /tmp/jaxp && /tmp/jaxp/bin/pip install jax-privacy==2.0.0
    /tmp/jaxp/bin/python scripts/jax_privacy_reference.py > tests/privacy/data/jax_privacy_reference.json

Conventions checked (see the test file): ``BufferedToeplitz(buf_decay, output_scale)`` represents C, the strategy
matrix (``toeplitz_coefs(n)`` = [1, Σ s_i, Σ s_i d_i, Σ s_i d_i², …]); ``blt.inverse()`` is the BLT of C⁻¹;
``toeplitz.minsep_sensitivity_squared(coefs, min_sep, max_participations)`` is sens² with k capped at ⌈n/b⌉;
``LossFn.build_min_sep(n, error='mean', ...).loss(blt)`` = sens² × mean_t Σ_{j≤t} (cumsum(C⁻¹ coefs))_j².
"""

from __future__ import annotations

import json
import sys
from typing import Any

import dp_accounting
import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax_privacy.matrix_factorization import buffered_toeplitz as bt  # noqa: E402
from jax_privacy.matrix_factorization import toeplitz  # noqa: E402

BLT_CASES = [
    {"name": "blt3", "buf_decay": [0.9, 0.5, 0.1], "output_scale": [0.2, 0.1, 0.02], "n": 20},
    {"name": "blt2", "buf_decay": [0.97, 0.6], "output_scale": [0.3, 0.25], "n": 16},
]
MINSEP = [(1, None), (1, 1), (3, 4), (10, 2), (7, 3), (4, 100)]
BANDED_CASES = [
    {"coefs": [1.0, 0.6, 0.3, 0.1], "n": 20, "min_sep": 4, "max_participations": 5},
    {"coefs": [1.0, 0.6, 0.3, 0.1], "n": 22, "min_sep": 5, "max_participations": 3},
    {"coefs": [1.0, 0.5], "n": 9, "min_sep": 2, "max_participations": 10},
]
OPTIMIZE_CASES = [(20, 10, 2), (64, 8, 8)]
GDP_CASES = [(1.0, 1e-5), (0.5, 1e-6), (2.0, 1e-5)]  # (noise multiplier σ/sens, δ)


def _floats(x: Any) -> list[float]:
    return [float(v) for v in np.asarray(x).ravel()]


def main() -> None:
    out: dict[str, Any] = {"jax_privacy_version": "2.0.0", "blt": [], "banded": [], "optimize": [], "gdp": []}
    for case in BLT_CASES:
        n = case["n"]
        blt = bt.BufferedToeplitz.build(buf_decay=case["buf_decay"], output_scale=case["output_scale"])
        coefs = blt.toeplitz_coefs(n)
        inv_blt = blt.inverse()
        entry: dict[str, Any] = {
            "buf_decay": _floats(blt.buf_decay),
            "output_scale": _floats(blt.output_scale),
            "n": n,
            "coefficients": _floats(coefs),
            "inverse_coefficients": _floats(toeplitz.inverse_coef(coefs)),
            "inverse_blt_coefficients": _floats(inv_blt.toeplitz_coefs(n)),
            "single_sensitivity_squared_closed_form": float(bt.sensitivity_squared(blt, n)),
            "max_error_closed_form": float(bt.max_error(inv_blt, n)),
            "per_query_error": _floats(toeplitz.per_query_error(noising_coef=inv_blt.toeplitz_coefs(n))),
            "minsep": [],
        }
        for b, k in MINSEP:
            lf = bt.LossFn.build_min_sep(n=n, error="mean", min_sep=b, max_participations=k)
            entry["minsep"].append(
                {
                    "min_sep": b,
                    "max_participations": k,
                    "sensitivity_squared": float(
                        toeplitz.minsep_sensitivity_squared(coefs, min_sep=b, max_participations=k)
                    ),
                    "mean_loss": float(lf.loss(blt)),
                }
            )
        out["blt"].append(entry)
    for case in BANDED_CASES:
        sens_sq = toeplitz.minsep_sensitivity_squared(
            jnp.asarray(case["coefs"]),
            min_sep=case["min_sep"],
            max_participations=case["max_participations"],
            n=case["n"],
        )
        out["banded"].append({**case, "sensitivity_squared": float(sens_sq)})
    # Banded Toeplitz optimised by jax-privacy for single participation, mean error (its loss is scale-invariant).
    band_coefs = toeplitz.optimize_banded_toeplitz(n=64, bands=8)
    out["optimize_banded_toeplitz"] = {
        "n": 64,
        "bands": 8,
        "coefficients": _floats(band_coefs),
        "mean_loss_single_participation": float(toeplitz.loss(band_coefs, n=64)),
    }
    for n, b, k in OPTIMIZE_CASES:
        blt = bt.optimize(n=n, min_sep=b, max_participations=k, error="mean")
        lf = bt.LossFn.build_min_sep(n=n, error="mean", min_sep=b, max_participations=k)
        out["optimize"].append(
            {
                "n": n,
                "min_sep": b,
                "max_participations": k,
                "buf_decay": _floats(blt.buf_decay),
                "output_scale": _floats(blt.output_scale),
                "mean_loss": float(lf.loss(blt)),
            }
        )
    # jax-privacy 2.0.0 has no (k, b)-min-sep DP-MF calibration (jax_privacy.accounting only covers DP-SGD /
    # cyclic-Poisson BandMF via dp_accounting), so the reference is dp_accounting's PLD for one Gaussian mechanism
    # with noise multiplier σ/sens, the event a min-sep matrix-factorization release reduces to.
    for nm, delta in GDP_CASES:
        accountant = dp_accounting.pld.PLDAccountant()
        accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier=nm))
        out["gdp"].append({"noise_multiplier": nm, "delta": delta, "pld_epsilon": float(accountant.get_epsilon(delta))})
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
