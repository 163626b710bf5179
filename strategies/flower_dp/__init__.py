"""Client-level DP as a wrapper around Flower's own FedAvg-family strategies (McMahan et al., ICLR 2018;
docs/mechanisms.md): ``ClientLevelDP(FedAdam(weighted_by_key=UNIT_WEIGHT, ...), num_clients=..., sample_rate=...,
clip_norm=..., noise_multiplier=..., delta=...)``; docs/client_level_dp.md. wrapper.py is the strategy (its
``.accountant`` has Flower's ``PrivacyAccountant`` interface); checks.py what it accepts (refused before the first
message, the privacy arguments by our ``privacy`` config's rules); replies.py what it does with a round's messages and
replies."""

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
