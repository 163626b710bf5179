"""The plain algorithms: FedAvg (McMahan et al. 2017; :class:`FederatedAveraging`, named apart from Flower's own
``FedAvg`` class, which ``ClientLevelDP`` also wraps) and FedSAM (local SAM): the uniform mean of the updates that
arrived, no clipping, no noise, no accountant. Built with :class:`~strategies.client_dp.private_rounds.PrivateRounds`
(what :class:`strategies.client_level_dp.ClientLevelDP` does) they are DP-FedAvg and DP-FedSAM."""

from __future__ import annotations

from strategies.base import FederatedStrategy


class FederatedAveraging(FederatedStrategy):
    config_name = "fedavg"
    local_optimizer = "sgd"


class FedSAM(FederatedStrategy):
    config_name = "fedsam"
    local_optimizer = "sam"
