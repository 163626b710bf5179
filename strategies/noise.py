"""The noise multiplier of a round's update (docs/mechanisms.md, 6–7): configured, or calibrated to
``privacy.target_epsilon``, then shared with whatever else the round releases.

The configured (or calibrated) multiplier z is the one the ledger composes for everything a round releases. When a
round also releases a noisy count, the update gets what the count leaves: σ_Δ = (z⁻² − σ_s⁻²)^(−1/2) for the noisy
client statistics (:func:`fl_app.privacy.mechanisms.update_noise_for_joint`), σ_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) for
adaptive clipping's count (Andrew et al. 2021, Thm. 1; strategies/client_dp/clipping.py owns that split).
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import INFO, WARNING

from flwr.common.logger import log

from fl_app.config import AppConfig, ConfigError
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.accountants import calibrate_noise_multiplier
from strategies.client_dp.clipping import AdaptiveClipNorm, ClipNorm
from strategies.statistics import ClientStatistics


@dataclass(frozen=True)
class NoiseMultipliers:
    """A private run's noise multipliers, computed once: σ of the update (what the clients or the server add, in
    units of C/m) and the σ the ledger composes (the joint one where a noisy count is released beside the update)."""

    update: float
    accounted: float

    @classmethod
    def for_run(
        cls, config: AppConfig, statistics: ClientStatistics, clipping: ClipNorm, own: float | None = None
    ) -> NoiseMultipliers:
        """The run's multipliers: the update's is ``own`` where a mechanism of its own calibrates it (DP-FTRL's
        factorization), else :func:`update_noise_multiplier`'s."""
        sigma = update_noise_multiplier(config, statistics, clipping) if own is None else own
        return cls(sigma, accounted_noise_multiplier(sigma, clipping, statistics))


def update_noise_multiplier(config: AppConfig, statistics: ClientStatistics, clipping: ClipNorm) -> float:
    """σ of a private run's update: ``privacy.noise_multiplier`` or the one calibrated to the target ε, less the
    share of the round's noisy count (client statistics or adaptive clipping's). A share that leaves nothing is a
    :class:`ConfigError` naming the setting to raise."""
    p = config.privacy
    sigma = p.noise_multiplier
    if p.target_epsilon is not None:
        sigma = calibrate_noise_multiplier(
            p.target_epsilon,
            p.delta,
            p.sample_rate,
            config.num_rounds,
            accountant=p.accountant,
            sampling=p.sampling,
            population=config.dataset.num_clients,
        )
        if statistics.releases_noisy_count and not isinstance(clipping, AdaptiveClipNorm):
            # The calibrated multiplier is the joint one; the update gets what the statistics leave.
            try:
                sigma = mech.update_noise_for_joint(sigma, statistics.noise_multiplier)
            except ValueError as exc:
                raise ConfigError(f"invalid config value privacy.statistics_noise_multiplier: {exc}") from exc
        log(
            INFO,
            "Calibrated noise multiplier sigma=%.4f for target epsilon=%.3f (delta=%.3g, q=%.4g, T=%d, %s)",
            sigma,
            p.target_epsilon,
            p.delta,
            p.sample_rate,
            config.num_rounds,
            p.accountant,
        )
    if not isinstance(clipping, AdaptiveClipNorm):
        return sigma
    # The configured (or calibrated) multiplier is the joint one of update + count (Andrew et al. Thm. 1).
    joint = sigma
    try:
        sigma = clipping.update_share_of_joint(joint)
    except ValueError as exc:
        raise ConfigError(
            f"invalid config value privacy.clipped_count_stddev={clipping.count_stddev:.4g}: {exc}; "
            "raise it (2 * clipped_count_stddev must exceed the noise multiplier)"
        ) from exc
    accounted = accounted_noise_multiplier(sigma, clipping, statistics)
    if sigma > 1.25 * accounted:
        log(
            WARNING,
            "Adaptive clipping: the count's share leaves the update sigma=%.4g for a joint %.4g (+%.0f%% "
            "noise); raise privacy.clipped_count_stddev (now %.4g) to spend less of the budget on the count",
            sigma,
            accounted,
            100 * (sigma / accounted - 1),
            clipping.count_stddev,
        )
    return sigma


def accounted_noise_multiplier(sigma: float, clipping: ClipNorm, statistics: ClientStatistics) -> float:
    """The multiplier the ledger composes for a release whose update carries σ = ``sigma``: σ itself, or the joint
    one of the update and the noisy count released beside it (adaptive clipping's, or the noisy client statistics':
    Andrew et al. 2021, Thm. 1). σ = 0 stays 0: the release is not private."""
    if sigma == 0:
        return sigma
    if isinstance(clipping, AdaptiveClipNorm):
        return clipping.joint_noise_multiplier(sigma)
    if not statistics.releases_noisy_count:
        return sigma
    return mech.joint_noise_multiplier(sigma, statistics.noise_multiplier)
