"""Accountants that speak Flower 1.42's ``PrivacyAccountant`` interface (``flwr.supercore.privacy_accounting``).

- :mod:`.events`: what a release composes: Flower's ``GaussianPrivacyEvent``, our ``SampledGaussianEvent`` (σ, q)
  and ``GDPEvent``.
- :mod:`.interface`: Flower's Protocol as a runtime check, a run's sampling ↔ Flower's ``PrivacyConfig``, ε after
  more releases without changing an accountant.
- :mod:`.sampled_gaussian`: ``SampledGaussianAccountant``, RDP / PRV / PLD of the sampled Gaussian mechanism (the
  composition of :mod:`fl_app.privacy.accounting`).
- :mod:`.gdp`: ``GDPAccountant``, the μ-GDP bound of Noisy-FedAvg / Noisy-FedProx.
- :mod:`.registry`: accountants by name (``create_accountant``, ``register_accountant``).

The ledgers (:mod:`fl_app.privacy.ledger`) hold one of these, or any other object with Flower's interface such as
Flower's own ``RdpAccountant``.
"""

from fl_app.privacy.accountants.events import GaussianPrivacyEvent, GDPEvent, SampledGaussianEvent
from fl_app.privacy.accountants.gdp import GDPAccountant, gdp_privacy_config
from fl_app.privacy.accountants.interface import FlowerAccountant, epsilon_after, privacy_config, run_sampling
from fl_app.privacy.accountants.registry import ACCOUNTANTS, create_accountant, register_accountant
from fl_app.privacy.accountants.sampled_gaussian import SampledGaussianAccountant

__all__ = [
    "ACCOUNTANTS",
    "FlowerAccountant",
    "GDPAccountant",
    "GDPEvent",
    "GaussianPrivacyEvent",
    "SampledGaussianAccountant",
    "SampledGaussianEvent",
    "create_accountant",
    "epsilon_after",
    "gdp_privacy_config",
    "privacy_config",
    "register_accountant",
    "run_sampling",
]
