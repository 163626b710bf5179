"""Privacy accounting, in one package: ε of a run's releases, and the accountants that speak Flower 1.42's
``PrivacyAccountant`` interface (``flwr.supercore.privacy_accounting``).

The composition (no privacy math is written here: every ε comes from Opacus or dp_accounting). One round of
client-level DP-FedAvg / DP-FedSAM releases the uniform average of clipped client updates over the fixed denominator
m = qM plus Gaussian noise of std σC/m, a sampled Gaussian mechanism with noise multiplier σ
(``fl_app/privacy/mechanisms/``), accounted as docs/mechanisms.md states it (1, 6 and 7):

- Poisson sampling (default): RDP of the Poisson-subsampled Gaussian composed over T rounds and converted to
  (ε, δ)-DP (DP-FedSAM journal Thm 2 / Eqs. 16–17) through Opacus' ``RDPAccountant``; the tighter numerical
  accountants Opacus ``PRVAccountant`` and dp_accounting ``PLDAccountant`` as options.
- Fixed-size sampling (exactly m of M clients without replacement, papers' Algorithm 1): dp_accounting's
  ``SampledWithoutReplacementDpEvent`` under replace-one adjacency with its RDP accountant — never the Poisson
  formula, which would understate ε roughly twofold.

One idea a module:

- :mod:`.checks`: argument validation, the :data:`~.checks.Segment` triple and m = qM (:func:`fixed_sample_size`).
- :mod:`.composition`: ε(δ) and δ(ε) of a history of (σ, q, rounds) segments, RDP / PRV / PLD under Poisson or
  fixed-size sampling, with the caches.
- :mod:`.calibration`: :func:`compute_epsilon` and :func:`calibrate_noise_multiplier` (target ε → σ).
- :mod:`.history`: :class:`CompositionHistory`, the (σ, q, rounds) history of one run and its ε, with the budget guard.
- :mod:`.matrix_factorization`: DP-FTRL's min-separation sensitivity, its μ-GDP / (ε, δ) / ρ-zCDP bound and
  calibration.
- :mod:`.events`: what a release composes: Flower's ``GaussianPrivacyEvent``, our ``SampledGaussianEvent`` (σ, q)
  and ``GDPEvent``.
- :mod:`.interface`: Flower's Protocol as a runtime check, a run's sampling ↔ Flower's ``PrivacyConfig``, ε after
  more releases without changing an accountant.
- :mod:`.sampled_gaussian`: ``SampledGaussianAccountant``, the composition above behind Flower's interface.
- :mod:`.gdp`: ``GDPAccountant``, the μ-GDP bound of Noisy-FedAvg / Noisy-FedProx.
- :mod:`.registry`: accountants by name (``create_accountant``, ``register_accountant``).

The ledgers (:mod:`fl_app.privacy.ledger`) hold one of these accountants, or any other object with Flower's
interface such as Flower's own ``RdpAccountant``.
"""

from fl_app.privacy.accountants.calibration import calibrate_noise_multiplier, compute_epsilon
from fl_app.privacy.accountants.checks import Segment, fixed_sample_size
from fl_app.privacy.accountants.composition import (
    REPLACE_ONE_SENSITIVITY_FACTOR,
    delta_from_history,
    epsilon_and_order_from_history,
    epsilon_from_history,
)
from fl_app.privacy.accountants.events import GaussianPrivacyEvent, GDPEvent, SampledGaussianEvent
from fl_app.privacy.accountants.gdp import GDPAccountant, gdp_privacy_config
from fl_app.privacy.accountants.history import CompositionHistory
from fl_app.privacy.accountants.interface import FlowerAccountant, epsilon_after, privacy_config, run_sampling
from fl_app.privacy.accountants.registry import ACCOUNTANTS, create_accountant, register_accountant
from fl_app.privacy.accountants.sampled_gaussian import SampledGaussianAccountant

__all__ = [
    "ACCOUNTANTS",
    "REPLACE_ONE_SENSITIVITY_FACTOR",
    "CompositionHistory",
    "FlowerAccountant",
    "GDPAccountant",
    "GDPEvent",
    "GaussianPrivacyEvent",
    "SampledGaussianAccountant",
    "SampledGaussianEvent",
    "Segment",
    "calibrate_noise_multiplier",
    "compute_epsilon",
    "create_accountant",
    "delta_from_history",
    "epsilon_after",
    "epsilon_and_order_from_history",
    "epsilon_from_history",
    "fixed_sample_size",
    "gdp_privacy_config",
    "privacy_config",
    "register_accountant",
    "run_sampling",
]
