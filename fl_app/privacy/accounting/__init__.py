"""Privacy accounting for client-level DP-FedAvg / DP-FedSAM: ε for a history of sampled Gaussian rounds.

One round releases the uniform average of clipped client updates over the fixed denominator m = qM plus
Gaussian noise of std σC/m, i.e. a sampled Gaussian mechanism with noise multiplier σ (``fl_app/privacy/mechanisms/``).
Implemented here, as docs/mechanisms.md states it (1, 6 and 7):

- Poisson sampling (default): RDP of the Poisson-subsampled Gaussian composed over T rounds and converted to
  (ε, δ)-DP (DP-FedSAM journal Thm 2 / Eqs. 16–17) through Opacus' ``RDPAccountant``; the tighter numerical
  accountants Opacus ``PRVAccountant`` and dp_accounting ``PLDAccountant`` as options.
- Fixed-size sampling (exactly m of M clients without replacement, papers' Algorithm 1): dp_accounting's
  ``SampledWithoutReplacementDpEvent`` under replace-one adjacency with its RDP accountant — never the Poisson
  formula, which would understate ε roughly twofold.
- Noise calibration (target ε → σ, used for journal Table II) and a stateful accountant with a budget guard.
- δ(ε) of a history (:func:`delta_from_history`), the inverse of ε(δ).

:class:`fl_app.privacy.accountants.SampledGaussianAccountant` puts this composition behind Flower's
``PrivacyAccountant`` interface; this package imports no Flower.

No privacy math is written here: every ε comes from Opacus or dp_accounting.

The package, one idea a module:

- :mod:`.checks`: argument validation, the :data:`~.checks.Segment` triple and m = qM (:func:`fixed_sample_size`).
- :mod:`.composition`: ε(δ) and δ(ε) of a history of segments, RDP / PRV / PLD under Poisson or fixed-size
  sampling, with the caches.
- :mod:`.calibration`: :func:`compute_epsilon` and :func:`calibrate_noise_multiplier`.
- :mod:`.accountant`: :class:`PrivacyAccountant`, the stateful accountant with the budget guard.
"""

from fl_app.core.choices import AccountantName, Sampling
from fl_app.privacy.accounting.accountant import PrivacyAccountant
from fl_app.privacy.accounting.calibration import calibrate_noise_multiplier, compute_epsilon
from fl_app.privacy.accounting.checks import Segment, fixed_sample_size
from fl_app.privacy.accounting.composition import (
    REPLACE_ONE_SENSITIVITY_FACTOR as REPLACE_ONE_SENSITIVITY_FACTOR,
)
from fl_app.privacy.accounting.composition import (
    delta_from_history,
    epsilon_and_order_from_history,
    epsilon_from_history,
)

__all__ = [
    "AccountantName",
    "PrivacyAccountant",
    "Sampling",
    "Segment",
    "calibrate_noise_multiplier",
    "compute_epsilon",
    "delta_from_history",
    "epsilon_and_order_from_history",
    "epsilon_from_history",
    "fixed_sample_size",
]
