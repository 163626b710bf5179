"""Client-level DP's objects, held by every strategy that releases under it: :class:`PrivacyBudget` (what the
releases spend, the budget guard) today; docs/architecture.md describes the layer."""

from strategies.client_dp.budget import PrivacyBudget

__all__ = ["PrivacyBudget"]
