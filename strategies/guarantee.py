"""What a run claims: ``run.json``'s guarantee, its :class:`~strategies.client_dp.PrivacyAccount`'s (the budget:
the ledger, the guard and the accounting of each release; the mechanism's parameters; the randomness's sources, the
same claim as ClientLevelDP's layer over Flower's strategies) with the statistics the run publishes, and the summary
it logs. A part of :class:`strategies.base.FederatedStrategy` (a mixin over its
fields), kept apart so the round's skeleton reads on its own."""

from __future__ import annotations

import math
from functools import partial
from logging import INFO, WARNING
from typing import Any

from flwr.common.logger import log
from flwr.serverapp import PrivacyAccountant

from fl_app.instructions import (
    STREAM_STATISTICS,
)
from fl_app.privacy import adaptive_clipping as adaptive
from fl_app.privacy.ledger import PrivacyLedger
from strategies.client_dp.clipping import AdaptiveClipNorm, ClipNorm
from strategies.noise import accounted_noise_multiplier, update_noise_multiplier
from strategies.settings import VIRTUAL_DEPLOYMENT_DISCLOSURE, RunSettings
from strategies.statistics import ClientStatistics


class Guarantee:
    """What the strategy states of its privacy: run.json's claim around its budget's, the summary it logs, the
    statistics it publishes (strategies/base.py's fields; a private run is one that holds a budget)."""

    @property
    def noise_source(self) -> str:
        if self.budget is None:
            return "none"
        return self.randomness.source()

    @property
    def secure_noise(self) -> bool:
        """Whether the server's and the clients' draws come from the OS CSPRNG (else seeded streams)."""
        return self.randomness.secure

    def calibrated_noise_multiplier(self) -> float:
        """σ of the update (strategies/noise.py): ``privacy.noise_multiplier``, or calibrated to the target ε by the
        sampled Gaussian accountant, less a noisy count's share."""
        return update_noise_multiplier(self.config, self.statistics, self.clipping)

    def make_ledger(self) -> PrivacyLedger:
        """The ledger that accounts this strategy's releases: the one its privacy makes (the subsampled Gaussian
        mechanism's)."""
        assert self.privacy is not None  # only a private strategy has a ledger
        return self.privacy.ledger(self.config.privacy, self.num_clients)

    @property
    def accountant(self) -> PrivacyAccountant | None:
        """What accounts the run's releases, with Flower's ``PrivacyAccountant`` interface (``compose``,
        ``get_epsilon``, ``would_exceed``, ``state_dict``); None for the non-private references."""
        return None if self.ledger is None else self.ledger.accountant

    def dp_guarantee(self) -> dict[str, Any]:
        """The run's DP claim, as written into ``run.json``: its account's (client_dp/account.py: the ledger's ε,
        the mechanism's parameters, the sources of the randomness), the statistics it publishes, the population."""
        if self.account is None:
            statistics = statistics_claim(self.statistics, self.clipping)
            return {"dp_guarantee": "none: non-private reference", "client_statistics": statistics}
        # A canary audit that contradicts the claim is stated with it, never left out.
        warning = None if self.auditor is None else self.auditor.warning()
        return {
            **self.account.claim(self.randomness, self.mechanism_claim(), self.not_covered_reason(), warning),
            "client_statistics": statistics_claim(self.statistics, self.clipping),
            **population_claim(self.run_settings, self.config.population),
        }

    def mechanism_claim(self) -> dict[str, Any]:
        """The parameters of the mechanism the ledger accounts (``run.json``): the account's, for the subsampled
        Gaussian mechanism; a mechanism of its own states its own."""
        return {} if self.account is None else self.account.mechanism()

    def not_covered_reason(self) -> str | None:
        """Why the accountant's ε does not cover this configuration (None = it does)."""
        return None

    @property
    def clip_norm(self) -> float:
        """C_t, the clip norm of the coming round."""
        return self.clipping.clip_norm

    @property
    def client_clip_norm(self) -> float:
        """C the client clips its update to (0 = no update clipping)."""
        return 0.0 if self.budget is None else self.clip_norm

    @property
    def adaptive_clipping(self) -> bool:
        return self.clipping.adaptive

    @property
    def clipped_count_stddev(self) -> float:
        """σ_b of adaptive clipping's count: ``privacy.clipped_count_stddev``, or m/20."""
        if isinstance(self.clipping, AdaptiveClipNorm):
            return self.clipping.count_stddev
        return self.config.privacy.clipped_count_stddev or adaptive.default_clipped_count_stddev(self.expected_clients)

    @property
    def client_statistics(self) -> str:
        """The run's ``privacy.client_statistics`` mode (raw | noisy | none; "auto" until resolved)."""
        return self.statistics.mode

    def published_statistics(self, server_round: int, stats: dict[str, Any]) -> dict[str, Any]:
        """The round's statistics as ``privacy.client_statistics`` allows them to be published."""
        rng = partial(self.randomness.noise_rng, server_round, STREAM_STATISTICS)  # drawn only for a noisy count
        return self.statistics.published(stats, self.expected_clients, self.adaptive_clipping, rng)

    @property
    def ledger(self) -> PrivacyLedger | None:
        """What the run has released and spent (None for the non-private references)."""
        return None if self.budget is None else self.budget.ledger

    @property
    def rounds_released(self) -> int:
        """Distinct noisy models released and accounted, those of the run a resume continues included."""
        return 0 if self.budget is None else self.budget.released

    def epsilon(self) -> float:
        return math.inf if self.budget is None else self.budget.epsilon()

    @property
    def accounted_noise_multiplier(self) -> float:
        """The σ the accountant composes: the update's, or the joint one when noisy statistics are released too."""
        if self.budget is not None:
            return self.budget.noise_multiplier
        return accounted_noise_multiplier(self.noise_multiplier, self.clipping, self.statistics)

    def round_extras(self) -> dict[str, Any]:
        """Strategy-specific fields of the round record."""
        return {"gdp_mu": None}

    def summary(self) -> None:
        p = self.config.privacy
        log(INFO, "Strategy %s (local optimizer: %s)", type(self).__name__, self.local_optimizer)
        log(
            INFO,
            "\tclients M=%d, sampling=%s q=%.4g, m=%.4g",
            self.num_clients,
            p.sampling,
            p.sample_rate,
            self.expected_clients,
        )
        if self.budget is None:
            log(INFO, "\tnon-private reference: no clipping, no noise")
            return
        log(
            INFO,
            "\tC=%.4g sigma=%.4g placement=%s accountant=%s delta=%.3g noise=%s",
            p.clip_norm,
            self.noise_multiplier,
            p.placement,
            self.budget.ledger.claim()["accountant"],
            p.delta,
            self.noise_source,
        )
        if reason := self.not_covered_reason():
            log(WARNING, "The reported epsilon does NOT cover this run: %s", reason)


def population_claim(settings: RunSettings | None, population: str) -> dict[str, str]:
    """What SuperNodes learn of the sample, where the run lets them learn it (``run.json``): only under
    ``population=virtual`` against a real SuperLink, which strategies/settings.py refuses unless allowed."""
    if settings is None or settings.simulation or population != "virtual":
        return {}
    return {"supernodes_learn": VIRTUAL_DEPLOYMENT_DISCLOSURE}


def statistics_claim(statistics: ClientStatistics, clipping: ClipNorm) -> str:
    """What the published files say about clients, and whether ε covers it (``run.json``)."""
    return statistics.claim(clipping.count_stddev if isinstance(clipping, AdaptiveClipNorm) else None)
