"""Client-level DP as a wrapper around Flower's own FedAvg-family strategies (McMahan et al., ICLR 2018; SPEC §1, §2,
§7): ``ClientLevelDP(FedAdam(weighted_by_key=UNIT_WEIGHT, ...), num_clients=..., sample_rate=..., clip_norm=...,
noise_multiplier=..., delta=...)``. wrapper.py is the strategy; checks.py what it accepts (refused before the first
message)."""

from strategies.flower_dp.checks import (
    MEAN_AGGREGATORS,
    NOISE_STREAM,
    SAMPLING_STREAM,
    UNIT_WEIGHT,
    check_inner_strategy,
)
from strategies.flower_dp.wrapper import ClientLevelDP

__all__ = [
    "MEAN_AGGREGATORS",
    "NOISE_STREAM",
    "SAMPLING_STREAM",
    "UNIT_WEIGHT",
    "ClientLevelDP",
    "check_inner_strategy",
]
