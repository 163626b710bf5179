"""What a run publishes about its clients (``privacy.client_statistics``; docs/PRIVACY.md): one object, resolved
once the run knows where it happens, instead of a mode string tested across the round.

- ``raw``: per-client pre-clip norms, their statistics, the mean local train loss/accuracy and the counts of
  sampled, answering and rejected clients are published unprotected; ε does not cover them.
- ``noisy``: only the fraction of clipped clients, through a Gaussian mechanism on the count (std σ_s, over the fixed
  denominator m like the update average), accounted jointly with the update: σ_joint = (σ⁻² + σ_s⁻²)^(−1/2)
  (:func:`fl_app.privacy.mechanisms.joint_noise_multiplier`). Under adaptive clipping the clip norm's own noisy
  count (strategies/client_dp/clipping.py) is that release, accounted there.
- ``none``: no client-derived value and no count; the counts go to the operator's ``operator_counts.jsonl``.
- ``auto``: ``raw`` in simulation, ``none`` against a real SuperLink (strategies/settings.py resolves it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fl_app.config import ConfigError
from fl_app.instructions import CLIENT_TIMESTAMPS
from fl_app.metrics import CLIENT_COUNTS
from fl_app.privacy import mechanisms as mech

#: Round-record fields computed from individual clients' raw values (outside ε): published only when raw.
CLIENT_DERIVED = (
    "train_loss",
    "train_accuracy",
    "client_norms",
    *mech.CLIPPING_STATS_KEYS,
    *(f"first_{key}" for key in CLIENT_TIMESTAMPS),
)


@dataclass(frozen=True)
class ClientStatistics:
    """The run's choice of what it publishes about clients: ``mode`` (raw | noisy | none | auto) and, for ``noisy``,
    the count's noise multiplier σ_s (``privacy.statistics_noise_multiplier``, default m/20)."""

    mode: str
    noise_multiplier: float

    @property
    def publishes_raw(self) -> bool:
        """Whether client-derived values, counts and per-reply rejection reasons are published (outside ε)."""
        return self.mode == "raw"

    @property
    def releases_noisy_count(self) -> bool:
        """Whether a noisy clipped count is released every round and so shares the accountant's joint σ."""
        return self.mode == "noisy"

    def claim(self, adaptive_count_stddev: float | None) -> str:
        """What the published files say about clients, and whether ε covers it (``run.json``);
        ``adaptive_count_stddev`` is adaptive clipping's σ_b (None without adaptive clipping)."""
        if self.mode == "raw":
            return ("raw: per-client pre-clip norms, their statistics, mean local train loss/accuracy and the "
                    "counts of sampled, answering and rejected clients are published unprotected; epsilon does not "
                    "cover them")  # fmt: skip
        if self.mode == "noisy" and adaptive_count_stddev is not None:
            return (f"noisy: only the clipped fraction released by adaptive clipping (sigma_b = "
                    f"{adaptive_count_stddev:.4g} on the centred count), accounted jointly with the update; no count "
                    "of clients")  # fmt: skip
        if self.mode == "noisy":
            return (f"noisy: only the clipped fraction, through a Gaussian mechanism (sigma_s = "
                    f"{self.noise_multiplier:.4g} on the count), accounted jointly with the update; no count of "
                    "clients")  # fmt: skip
        if self.mode == "none":
            return ("none: no client-derived value and no count of clients is published (the counts are in the "
                    "operator's operator_counts.jsonl, outside epsilon)")  # fmt: skip
        return "auto: raw in simulation, none against a real SuperLink"

    def refuse_unaccounted_count(self, accounted: bool, strategy: str) -> None:
        """Refuse a noisy count for a strategy whose releases the sampled-Gaussian accountant does not account
        (``accounted`` False): nothing would account the count's noise with the update's."""
        if self.releases_noisy_count and not accounted:
            raise ConfigError(
                "invalid config value privacy.client_statistics=noisy: allowed only for strategies accounted by the "
                f"sampled-Gaussian accountant ({strategy} has none); use raw or none"
            )

    def published(
        self,
        stats: dict[str, Any],
        expected_clients: float,
        adaptive: bool,
        rng: Callable[[], mech.RandomSource],
    ) -> dict[str, Any]:
        """The round's ``stats`` as the mode allows them to be published; ``rng`` gives the round's statistics noise
        stream (drawn only when a noisy count is released)."""
        if self.publishes_raw:
            return stats
        public = {k: v for k, v in stats.items() if k not in CLIENT_DERIVED and k not in CLIENT_COUNTS}
        if self.releases_noisy_count and not adaptive:
            # (With adaptive clipping the clipped fraction is already released, accounted, in ``stats``.)
            clipped = sum(1 for norm in stats["client_norms"] if norm > stats["clip_norm"])
            noisy = mech.noisy_count(clipped, self.noise_multiplier, rng())
            # The fixed denominator m, like the update average; the noisy value may leave [0, 1].
            public["fraction_clipped_noisy"] = noisy / expected_clients
        return public


def released_line(published: dict[str, Any], epsilon: float | None, delta: float | None) -> str:
    """One round's progress as the DP hooks log it: ε so far (None for the non-private references) and, as far as
    they are ``published``, the counts of accepted and rejected clients."""
    parts = [] if epsilon is None else [f"epsilon={epsilon:.4g} (delta={delta:.3g})"]
    if "aggregated" in published:
        rejected = sum(int(published.get(k, 0)) for k in ("rejected_malformed", "rejected_nonfinite", "rejected_shape"))
        parts.append(f"{published['aggregated']} of {published.get('sampled', '?')} sampled clients accepted, "
                     f"{published.get('failed', 0)} failed, {rejected} rejected")  # fmt: skip
    return "; ".join(parts) or "no statistics published"
