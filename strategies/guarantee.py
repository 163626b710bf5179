"""What a run claims: ``run.json``'s guarantee and the summary the run logs, from explicit inputs.

The claim of a private run is its :class:`~strategies.client_dp.PrivacyAccount`'s (the budget: the ledger's ε at
δ, the accountant, the sampling event, the releases; the mechanism's parameters, or those a mechanism of its own
states in their place; the sources of the randomness): the same claim as ClientLevelDP's layer over Flower's
strategies makes. Beside it stand what the run publishes about its clients and, where SuperNodes learn of the
sample, what they learn. A plain algorithm's run claims nothing but the statistics it publishes.
"""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any

from flwr.common.logger import log

from fl_app.config import DPConfig
from strategies.client_dp.account import PrivacyAccount
from strategies.client_dp.clipping import AdaptiveClipNorm, ClipNorm
from strategies.client_dp.randomness import RunRandomness
from strategies.settings import VIRTUAL_DEPLOYMENT_DISCLOSURE, RunSettings
from strategies.statistics import ClientStatistics


def run_claim(
    account: PrivacyAccount | None,
    randomness: RunRandomness,
    mechanism: dict[str, Any] | None,
    not_covered: str | None,
    warning: str | None,
    statistics: str,
    population: dict[str, str],
) -> dict[str, Any]:
    """The run's DP claim as ``run.json`` states it: ``account``'s (None: a plain algorithm's run, which claims no
    guarantee) with the ``mechanism``'s parameters (None: the subsampled Gaussian mechanism's, the account's),
    ``not_covered`` (why the ledger's ε does not cover the configuration), ``warning`` (a canary audit that
    contradicts the claim, stated with it, never left out), what is published about clients (``statistics``:
    :func:`statistics_claim`) and what SuperNodes learn (``population``: :func:`population_claim`)."""
    if account is None:
        return {"dp_guarantee": "none: non-private reference", "client_statistics": statistics}
    return {
        **account.claim(randomness, mechanism, not_covered, warning),
        "client_statistics": statistics,
        **population,
    }


def log_summary(
    name: str,
    local_optimizer: str,
    privacy: DPConfig,
    num_clients: int,
    expected_clients: float,
    account: PrivacyAccount | None,
    randomness: RunRandomness,
    not_covered: str | None,
) -> None:
    """The strategy's settings as the run starts: the algorithm, the sampling and (private) C, σ, the placement,
    the accountant, δ and where the noise comes from; a warning where the reported ε does not cover the run."""
    log(INFO, "Strategy %s (local optimizer: %s)", name, local_optimizer)
    log(INFO, "\tclients M=%d, sampling=%s q=%.4g, m=%.4g", num_clients, privacy.sampling, privacy.sample_rate,
        expected_clients)  # fmt: skip
    if account is None:
        log(INFO, "\tnon-private reference: no clipping, no noise")
        return
    log(INFO, "\tC=%.4g sigma=%.4g placement=%s accountant=%s delta=%.3g noise=%s", privacy.clip_norm,
        account.noise_multiplier, privacy.placement, account.ledger.claim()["accountant"], privacy.delta,
        randomness.source())  # fmt: skip
    if not_covered:
        log(WARNING, "The reported epsilon does NOT cover this run: %s", not_covered)


def population_claim(settings: RunSettings | None, population: str) -> dict[str, str]:
    """What SuperNodes learn of the sample, where the run lets them learn it (``run.json``): only under
    ``population=virtual`` against a real SuperLink, which strategies/settings.py refuses unless allowed."""
    if settings is None or settings.simulation or population != "virtual":
        return {}
    return {"supernodes_learn": VIRTUAL_DEPLOYMENT_DISCLOSURE}


def statistics_claim(statistics: ClientStatistics, clipping: ClipNorm) -> str:
    """What the published files say about clients, and whether ε covers it (``run.json``)."""
    return statistics.claim(clipping.count_stddev if isinstance(clipping, AdaptiveClipNorm) else None)
