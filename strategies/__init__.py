"""The strategies: Flower (Message API) strategies over one round skeleton (strategies/base.py), one module per
algorithm, each with its config in conf/strategy/.

``from strategies import DPFedSAM`` and ``DPFedSAM(num_clients=100, sample_rate=0.1, clip_norm=0.2,
noise_multiplier=0.95)`` build a strategy from keyword settings over conf/'s defaults; ``strategy.accountant`` is
its accountant, with Flower's ``PrivacyAccountant`` interface (``accountant=RdpAccountant(...)`` puts Flower's own in
its place). ``strategy_class(name)`` is the class ``strategy=<name>`` runs (strategies/registry.py, where a strategy of
your own is registered by name). ``ClientLevelDP`` wraps Flower's own FedAvg-family strategies (strategies/flower_dp/).
"""

from strategies.base import FederatedStrategy
from strategies.blur import DPFedAvgBLUR, DPFedAvgBLURS
from strategies.dp_fedavg import DPFedAvg
from strategies.dp_fedsam import DPFedSAM
from strategies.dp_fedsam_topk import DPFedSAMTopK
from strategies.dp_ftrl import DPFedAvgUnamplified, DPFTRLFedAvg, DPFTRLFedSAM
from strategies.fed_smp import FedSMPRandK, FedSMPTopK
from strategies.fedavg import FedAvg, FedSAM
from strategies.flower_dp import UNIT_WEIGHT, ClientLevelDP
from strategies.noisy import NoisyFedAvg, NoisyFedProx
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
    "FedAvg",
    "FedSAM",
    "FedSMPRandK",
    "FedSMPTopK",
    "FederatedStrategy",
    "NoisyFedAvg",
    "NoisyFedProx",
    "build_strategy",
    "register_strategy",
    "strategy_class",
]
