"""DP-FedAvg (McMahan et al., ICLR 2018): local SGD, then the client-level Gaussian mechanism of
docs/mechanisms.md, 2–4 (journal Eqs. 10–11) with uniform, fixed-denominator aggregation."""

from __future__ import annotations

from strategies.base import FederatedStrategy


class DPFedAvg(FederatedStrategy):
    config_name = "dp_fedavg"
    private = True
    local_optimizer = "sgd"
