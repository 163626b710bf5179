"""Client-level DP around Flower's own FedAvg-family strategies (McMahan et al., ICLR 2018; docs/mechanisms.md):
``ClientLevelDP(FedAdam(weighted_by_key=UNIT_WEIGHT, ...), num_clients=..., sample_rate=..., clip_norm=...,
noise_multiplier=..., delta=...)`` (``from strategies import ClientLevelDP``) builds strategies/dp_over_flower.py's
:class:`~strategies.dp_over_flower.DPOverFlowerMean`; docs/client_level_dp.md. Here, checks.py says what it accepts
(refused before the first message, the privacy arguments by our ``privacy`` config's rules); replies.py what it does
with a round's messages and replies. (This package's own modules import no strategy: Flower's server steps under our
strategies, strategies/flower_step.py, share its reply forwarding.)"""

from strategies.flower_dp.checks import (
    MEAN_AGGREGATORS,
    NOISE_STREAM,
    SAMPLING_STREAM,
    UNIT_WEIGHT,
    check_inner_strategy,
)

__all__ = [
    "MEAN_AGGREGATORS",
    "NOISE_STREAM",
    "SAMPLING_STREAM",
    "UNIT_WEIGHT",
    "check_inner_strategy",
]
