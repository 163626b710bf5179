"""What a strategy's rounds are made private with (docs/mechanisms.md, 2–8): :class:`PrivateRounds`, the input a
client-level DP layer hands the plain strategy it wraps (:class:`strategies.client_level_dp.ClientLevelDP`).

A strategy built without one is a plain algorithm: its clients send unclipped updates and its server takes the mean
of what arrived, accounts nothing and claims nothing. Built with one, the same algorithm clips every update to C_t,
averages over the fixed denominator m = qM, adds the placement's Gaussian noise, guards the budget, logs each release
ahead and accounts it with the ledger :meth:`PrivateRounds.ledger` makes. The algorithm's own class never decides
which it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.serverapp import PrivacyAccountant

from fl_app.config import DPConfig
from fl_app.privacy.ledger import SampledGaussianLedger


@dataclass(frozen=True)
class PrivateRounds:
    """Client-level DP for every round of the strategy that holds it.

    ``accountant`` accounts the releases in place of the one ``privacy.accountant`` names (None: that one): an
    accountant with Flower's ``PrivacyAccountant`` interface, Flower's own ``RdpAccountant`` included. A mechanism
    with its own bound (Noisy-FedAvg's f-DP bound, DP-FTRL's factorization) refuses a given accountant: its ledger
    is not a composition of sampled Gaussian events.
    """

    accountant: PrivacyAccountant | None = None
    #: Whether the server releases the noisy average over the fixed m (clipped, the placement's noise); False for a
    #: mechanism whose clients noise their models themselves (Noisy-FedAvg: the plain mean of what arrived).
    server_average: bool = True

    def ledger(self, privacy: DPConfig, num_clients: int) -> SampledGaussianLedger:
        """The subsampled Gaussian mechanism's ledger for the run's ``privacy`` section and population M."""
        accountant = privacy.accountant if self.accountant is None else self.accountant
        return SampledGaussianLedger(privacy.delta, accountant, privacy.sampling, num_clients)
