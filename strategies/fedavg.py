"""Non-private references: FedAvg (McMahan et al. 2017) and FedSAM (local SAM), uniform mean of the updates that
arrived, no clipping, no noise, no accountant."""

from __future__ import annotations

from strategies.base import FederatedStrategy


class FedAvg(FederatedStrategy):
    config_name = "fedavg"
    private = False
    local_optimizer = "sgd"


class FedSAM(FederatedStrategy):
    config_name = "fedsam"
    private = False
    local_optimizer = "sam"
