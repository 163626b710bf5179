"""``privacy.distributed``: distributed DP's settings (``privacy.placement=distributed``; docs/mechanisms.md,
"Distributed DP"): the bit width of secure aggregation's sums, its threshold, the neighbourhood graph, the rounding
and the overflow target. The keys may be left out (``privacy=distributed`` in Hydra sets them all).

Distributed DP runs where its analysis holds, and the checks say why elsewhere: Poisson sampling (the bound's
amplification, Zhu & Wang 2019, is for Poisson samples), a fixed clip norm and no published client statistics
(adaptive clipping's and the statistics' per-client values would reach the server in the clear), the RDP accountant
(the Skellam bound is an RDP bound), one client a message (secure aggregation's participant is one client).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fl_app.config.readers import _known_keys, _require

__all__ = ["DistributedConfig", "validate_distributed"]


@dataclass(frozen=True)
class DistributedConfig:
    """``privacy.distributed``."""

    #: b: the sums are taken modulo 2^b (the masked vectors' width: 4 bytes a value up to 32 bits, else 8).
    bits: int = 32
    #: t: the fewest clients whose masked vectors a round needs (fewer: the round is aborted, nothing released);
    #: each client adds the Skellam noise of 1/t of the sum's, so any t survivors carry all of it. An int, or a
    #: fraction of m = qM in (0, 1]; None = the largest t ≤ ⌊m/2⌋ + 1 whose aborts (a sample below t, which the
    #: models' consumers can see) add at most δ/10 to their guarantee (strategies/client_dp/placement.py).
    threshold: int | float | None = None
    #: Each client's neighbours in the masking graph (SecAgg+'s random Harary graph); None = every other client
    #: (SecAgg's complete graph).
    neighbours: int | None = None
    #: β of the conditional randomised rounding (0: unconditioned rounding, the looser norm bound C·s + √d).
    rounding_beta: float = math.exp(-0.5)
    #: The bound on a round's probability of a modular wrap the scale is chosen for.
    overflow_target: float = 1e-9

    def resolved_threshold(self, expected_clients: float) -> int:
        """t for a round of m = ``expected_clients`` clients on average; unset, the ceiling ⌊m/2⌋ + 1 (the
        placement lowers it until the aborts cost little: ``distributed.mechanism.default_threshold``)."""
        if self.threshold is None:
            return max(2, math.floor(expected_clients / 2) + 1)
        if isinstance(self.threshold, float):
            return max(2, math.ceil(self.threshold * expected_clients))
        return int(self.threshold)


def validate_distributed(
    section: Mapping[str, Any] | None, privacy: Mapping[str, Any], num_clients: int
) -> DistributedConfig:
    """``privacy.distributed`` (absent: the defaults), and what distributed placement requires of ``privacy`` for a
    run over ``num_clients`` clients."""
    section = dict(section or {})
    _known_keys(section, DistributedConfig, "privacy.distributed")
    p = "privacy.distributed"
    bits = section.get("bits", 32)
    _require(_is_int(bits) and 12 <= bits <= 36, f"{p}.bits", bits, "an int in [12, 36]")
    threshold = section.get("threshold")
    _require(threshold is None or (_is_int(threshold) and threshold >= 2)
             or (isinstance(threshold, float) and 0 < threshold <= 1), f"{p}.threshold", threshold,
             "null, an int >= 2, or a fraction of m in (0, 1]")  # fmt: skip
    neighbours = section.get("neighbours")
    _require(neighbours is None or (_is_int(neighbours) and neighbours >= 2), f"{p}.neighbours", neighbours,
             "null (every other client) or an int >= 2")  # fmt: skip
    beta = section.get("rounding_beta", math.exp(-0.5))
    _require(isinstance(beta, (int, float)) and 0 <= beta < 1, f"{p}.rounding_beta", beta, "in [0, 1)")
    target = section.get("overflow_target", 1e-9)
    _require(isinstance(target, (int, float)) and 0 < target < 1, f"{p}.overflow_target", target, "in (0, 1)")
    _check_privacy(privacy)
    settings = DistributedConfig(bits=int(bits), threshold=threshold, neighbours=neighbours,
                                 rounding_beta=float(beta), overflow_target=float(target))  # fmt: skip
    t = settings.resolved_threshold(float(privacy["sample_rate"]) * num_clients)
    _require(t <= num_clients, f"{p}.threshold", threshold,
             f"at most dataset.num_clients = {num_clients} (it resolves to t = {t}: no round could reach "
             "it)")  # fmt: skip
    # A secret is rebuilt from t shares of one neighbourhood (the client and its neighbours).
    if threshold is None:
        _require(neighbours is None or t <= neighbours + 1, f"{p}.neighbours", neighbours,
                 f"at least t - 1 = {t - 1} (the default threshold floor(m/2) + 1 = {t}), or a threshold of at "
                 "most neighbours + 1")  # fmt: skip
    else:
        _require(neighbours is None or t <= neighbours + 1, f"{p}.threshold", threshold,
                 f"at most neighbours + 1 = {(neighbours or 0) + 1} (it resolves to t = {t})")  # fmt: skip
    return settings


def _check_privacy(privacy: Mapping[str, Any]) -> None:
    why = "with placement=distributed"
    _require(privacy.get("sampling") == "poisson", "privacy.sampling", privacy.get("sampling"),
             f"poisson {why} (the Skellam bound's amplification is for Poisson samples)")  # fmt: skip
    _require(privacy.get("clipping", "fixed") == "fixed", "privacy.clipping", privacy.get("clipping"),
             f"fixed {why} (adaptive clipping's per-client bits would reach the server in the clear)")  # fmt: skip
    _require(privacy.get("client_statistics", "auto") in ("auto", "none"), "privacy.client_statistics",
             privacy.get("client_statistics"), f"none or auto {why} (the server never sees a client's "
             "values)")  # fmt: skip
    _require(privacy.get("accountant", "rdp") == "rdp", "privacy.accountant", privacy.get("accountant"),
             f"rdp {why} (the Skellam mechanism's bound is an RDP bound)")  # fmt: skip


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
