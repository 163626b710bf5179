"""DP-FedAvg (McMahan et al., ICLR 2018): local SGD, then the client-level Gaussian mechanism of
docs/mechanisms.md, 2–4 (journal Eqs. 10–11) with uniform, fixed-denominator aggregation: the client-level DP layer
over the plain FedAvg (:class:`~strategies.fedavg.FederatedAveraging`)."""

from __future__ import annotations

from strategies.client_level_dp import RegisteredDP
from strategies.fedavg import FederatedAveraging


class DPFedAvg(RegisteredDP):
    """``ClientLevelDP(FederatedAveraging(config))``, by the name ``dp_fedavg``."""

    config_name = "dp_fedavg"
    algorithm = FederatedAveraging
