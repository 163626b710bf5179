"""Flower 1.42's ``PrivacyAccountant`` interface as this project uses it (``flwr.supercore.privacy_accounting``).

- :class:`FlowerAccountant`: Flower's Protocol, runtime-checkable. Flower's own ``PrivacyAccountant`` is a plain
  ``typing.Protocol``, so ``isinstance(x, PrivacyAccountant)`` raises ``TypeError`` on Python 3.11 even for a class
  that subclasses it; our accountants subclass it explicitly (it is in their MRO), and this Protocol is how code
  asks at run time whether an object, ours or Flower's ``RdpAccountant``, has the interface.
- :func:`privacy_config` / :func:`run_sampling`: a run's ``privacy.sampling`` ↔ Flower's (sampling method,
  neighbouring relation): Poisson ↔ (POISSON, ADD_OR_REMOVE_ONE), fixed-size ↔ (WITHOUT_REPLACEMENT, REPLACE_ONE).
- :func:`epsilon_after`: ε after more releases without changing the accountant (the budget guard's question), from
  the accountant's own ``epsilon_after`` where it has one, else from a copy rebuilt through ``state_dict`` (the way
  Flower's ``RdpAccountant.would_exceed`` replays its ledger).
"""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

from flwr.supercore.privacy_accounting import (
    NeighboringRelation,
    PrivacyAccountant,
    PrivacyConfig,
    SamplingMethod,
)

from fl_app.core.choices import Sampling

__all__ = [
    "FlowerAccountant",
    "ProjectingAccountant",
    "copy_accountant",
    "epsilon_after",
    "privacy_config",
    "run_sampling",
]


@runtime_checkable
class FlowerAccountant(PrivacyAccountant, Protocol):
    """Flower's ``PrivacyAccountant`` Protocol, checkable with ``isinstance`` (structurally: it has the members)."""


@runtime_checkable
class ProjectingAccountant(Protocol):
    """An accountant that answers ε after more releases itself, without a copy (ours do)."""

    def epsilon_after(self, event: Any, count: int = 1, delta: float | None = None) -> float:
        """ε(δ) after composing ``count`` more ``event``; the accountant itself is not changed."""
        ...


_MODELS: dict[str, tuple[SamplingMethod, NeighboringRelation]] = {
    "poisson": (SamplingMethod.POISSON, NeighboringRelation.ADD_OR_REMOVE_ONE),
    "fixed": (SamplingMethod.WITHOUT_REPLACEMENT, NeighboringRelation.REPLACE_ONE),
}


def privacy_config(
    delta: float, sampling: Sampling, population: int | None, max_epsilon: float | None = None
) -> PrivacyConfig:
    """Flower's ``PrivacyConfig`` of a run that samples ``population`` clients by ``sampling`` and reports at δ."""
    if sampling not in _MODELS:
        raise ValueError(f"sampling must be one of {tuple(_MODELS)}, got {sampling!r}")
    if population is None:
        raise ValueError("Flower's PrivacyConfig needs the population size M as a positive int, got None")
    method, relation = _MODELS[sampling]
    return PrivacyConfig(
        target_delta=float(delta),
        population_size=population,
        neighboring_relation=relation,
        sampling_method=method,
        max_epsilon=max_epsilon,
    )


def run_sampling(config: PrivacyConfig) -> Sampling | None:
    """The run's ``privacy.sampling`` an accountant configured by ``config`` accounts (None: no amplification)."""
    for sampling, (method, _) in _MODELS.items():
        if config.sampling_method is method:
            return sampling  # type: ignore[return-value]
    return None


def copy_accountant(accountant: PrivacyAccountant) -> PrivacyAccountant:
    """A new accountant of the same class and config holding the same releases (``accountant`` is not changed).

    Rebuilt as ``type(accountant)(accountant.config)`` plus ``load_state_dict(state_dict())``, the constructor every
    registered accountant takes (:mod:`fl_app.privacy.accountants.registry`). Runs of identical events in a
    Flower-format state (``compositions``: ``{"event", "count"}`` entries) are merged first, so the copy composes
    one event per run of rounds instead of one per round: composition of identical events is what ``count`` states.
    """
    fresh = type(accountant)(accountant.config)  # type: ignore[call-arg]
    fresh.load_state_dict(_merged_compositions(accountant.state_dict()))
    return fresh


def _merged_compositions(state: dict[str, object]) -> dict[str, object]:
    compositions = state.get("compositions")
    if not isinstance(compositions, list):
        return state
    merged: list[dict[str, Any]] = []
    for entry in compositions:
        if merged and isinstance(entry, dict) and merged[-1]["event"] == entry.get("event"):
            merged[-1] = {**merged[-1], "count": merged[-1]["count"] + entry["count"]}
        else:
            merged.append(dict(entry) if isinstance(entry, dict) else entry)
    return {**state, "compositions": merged}


def epsilon_limit(config: PrivacyConfig, max_epsilon: float | None) -> float:
    """The ε limit ``would_exceed`` compares against: ``max_epsilon``, else the config's (Flower's contract)."""
    limit = config.max_epsilon if max_epsilon is None else max_epsilon
    if limit is None:
        raise ValueError("max_epsilon must be supplied either in PrivacyConfig or to would_exceed()")
    if isinstance(limit, bool) or not (limit > 0 and math.isfinite(limit)):
        raise ValueError(f"max_epsilon must be positive and finite, got {limit!r}")
    return float(limit)


def epsilon_after(accountant: PrivacyAccountant, event: Any, count: int = 1, delta: float | None = None) -> float:
    """ε(δ) of ``accountant`` after ``count`` more ``event`` (δ: the config's ``target_delta`` if None); the
    accountant is not changed."""
    if isinstance(accountant, ProjectingAccountant):
        return accountant.epsilon_after(event, count, delta)
    projected = copy_accountant(accountant)
    projected.compose(event, count)
    return projected.get_epsilon(accountant.config.target_delta if delta is None else delta)
