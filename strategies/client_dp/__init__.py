"""Client-level DP's objects, held by every strategy that releases under it: :class:`PrivacyBudget` (what the
releases spend, the budget guard), :class:`PrivacyAccount` (the budget and what run.json states of it) and
:class:`NoisyAverage` (the released average: the server's clip, the fixed denominator, the noise);
docs/architecture.md describes the layer."""

from strategies.client_dp.account import PrivacyAccount
from strategies.client_dp.average import NoisyAverage
from strategies.client_dp.budget import PrivacyBudget

__all__ = ["NoisyAverage", "PrivacyAccount", "PrivacyBudget"]
