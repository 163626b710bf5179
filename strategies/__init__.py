"""The strategies: plain Flower (Message API) strategies over one round skeleton (strategies/base.py), one module per
algorithm, each with its config in conf/strategy/, and client-level DP as one layer around a plain strategy
(strategies/client_level_dp.py): ``ClientLevelDP(FedSAM(...), clip_norm=0.2, noise_multiplier=0.95)``, or around one of
Flower's FedAvg family (strategies/dp_over_flower.py).

``from strategies import DPFedSAM`` and ``DPFedSAM(num_clients=100, sample_rate=0.1, clip_norm=0.2,
noise_multiplier=0.95)`` build the named DP strategy (the layer over FedSAM) from keyword settings over conf/'s
defaults; ``strategy.accountant`` is its accountant, with Flower's ``PrivacyAccountant`` interface
(``accountant=RdpAccountant(...)`` puts Flower's own in its place). ``strategy_class(name)`` is the class
``strategy=<name>`` runs (strategies/registry.py, where a strategy of your own is registered by name).
"""

from strategies.base import FederatedStrategy
from strategies.blur import DPFedAvgBLUR, DPFedAvgBLURS, FedAvgBLUR, FedAvgBLURS
from strategies.client_dp.private_rounds import PrivateRounds
from strategies.client_level_dp import ClientLevelDP, DPOverRounds, RegisteredDP
from strategies.dp_fedavg import DPFedAvg
from strategies.dp_fedsam import DPFedSAM
from strategies.dp_fedsam_topk import DPFedSAMTopK, FedSAMTopK
from strategies.dp_ftrl import DPFedAvgUnamplified, DPFTRLFedAvg, DPFTRLFedSAM
from strategies.dp_over_flower import DPOverFlowerMean
from strategies.fed_smp import FedAvgRandK, FedAvgTopK, FedSMPRandK, FedSMPTopK
from strategies.fedavg import FederatedAveraging, FedSAM
from strategies.flower_dp import UNIT_WEIGHT
from strategies.noisy import NoisyFedAvg, NoisyFedProx
from strategies.own_mechanism import PrivateByItsOwnMechanism
from strategies.registry import build_strategy, register_strategy, strategy_class

__all__ = [
    "UNIT_WEIGHT",
    "ClientLevelDP",
    "DPFTRLFedAvg",
    "DPFTRLFedSAM",
    "DPFedAvg",
    "DPFedAvgBLUR",
    "DPFedAvgBLURS",
    "DPFedAvgUnamplified",
    "DPFedSAM",
    "DPFedSAMTopK",
    "DPOverFlowerMean",
    "DPOverRounds",
    "FedAvgBLUR",
    "FedAvgBLURS",
    "FedAvgRandK",
    "FedAvgTopK",
    "FedSAM",
    "FedSAMTopK",
    "FedSMPRandK",
    "FedSMPTopK",
    "FederatedAveraging",
    "FederatedStrategy",
    "NoisyFedAvg",
    "NoisyFedProx",
    "PrivateByItsOwnMechanism",
    "PrivateRounds",
    "RegisteredDP",
    "build_strategy",
    "register_strategy",
    "strategy_class",
]
