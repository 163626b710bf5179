"""The ``audit`` section: canary clients for a one-run privacy audit (docs/audit.md; the statistics are
:mod:`fl_app.privacy.audit`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fl_app.config.readers import _choice, _finite, _integer, _known_keys, _number, _optional_integer, _require
from fl_app.core.choices import GUESS_RULES, GuessRule


@dataclass(frozen=True)
class AuditConfig:
    """Canary clients for a one-run privacy audit (docs/audit.md); ``canaries = 0`` switches it off."""

    canaries: int = 0
    #: Stream of the canaries' directions and memberships; None = the run's seed.
    seed: int | None = None
    #: Estimate and bound every this many rounds; 0 = after the last round only.
    every: int = 0
    #: A canary's update before clipping is canary_scale * C along its direction.
    canary_scale: float = 1.0
    confidence: float = 0.95
    #: δ of the one-run lower bound (compared with the accountant's ε at the same δ); None = min(run δ, 0.01/K),
    #: which keeps the bound's δ term 2Kδ (Steinke et al. Thm 5.2) at most 0.02.
    lower_bound_delta: float | None = None
    #: Coordinates of a canary's direction: None = dense (uniform on the sphere); s = sparse, s random coordinates
    #: (fl_app/privacy/audit/canaries.py ``sparse_canary_direction``: ~150x cheaper to draw and score, so K can be
    #: large).
    support: int | None = None
    #: The lower bound's guesses (:data:`GUESS_RULES`). One-sided by default: an inserted canary that never joins a
    #: round (a fraction (1 − q)^T) scores like the null whatever the mechanism, so two-sided "not inserted" guesses
    #: on the lowest scores are partly wrong by construction and keep the bound below the accountant (docs/audit.md).
    guess_rule: GuessRule = "one_sided"

    @property
    def enabled(self) -> bool:
        return self.canaries > 0


def _validate_audit(section: Mapping[str, Any], refusal: str | None) -> AuditConfig:
    """The ``audit`` section; ``refusal`` is why the run's strategy cannot run canary clients (None = it can)."""
    _known_keys(section, AuditConfig, "audit")
    p = "audit"
    canaries = _integer(section, "canaries", p, 0) if "canaries" in section else 0
    seed = _optional_integer(section, "seed", p, 0)
    every = _integer(section, "every", p, 0) if "every" in section else 0
    scale = _number(section, "canary_scale", p) if "canary_scale" in section else 1.0
    _require(scale > 0, "audit.canary_scale", scale, "> 0")
    confidence = _number(section, "confidence", p) if "confidence" in section else 0.95
    _require(0.5 <= confidence < 1, "audit.confidence", confidence, "in [0.5, 1)")
    if canaries:
        _require(canaries >= 20, "audit.canaries", canaries, "0 (off) or >= 20 (half of them are the null)")
        _require(refusal is None, "audit.canaries", canaries, f"0 with this strategy: {refusal}")
    bound_delta = section.get("lower_bound_delta")
    _require(bound_delta is None or (_finite(bound_delta) and 0 < float(bound_delta) < 1), "audit.lower_bound_delta",
             bound_delta, "delta in (0, 1) or null for min(privacy.delta, 0.01 / audit.canaries)")  # fmt: skip
    support = _optional_integer(section, "support", p, 1)
    rule = _choice(section, "guess_rule", p, GUESS_RULES) if "guess_rule" in section else AuditConfig.guess_rule
    return AuditConfig(
        canaries=canaries,
        seed=seed,
        every=every,
        canary_scale=scale,
        confidence=confidence,
        lower_bound_delta=None if bound_delta is None else float(bound_delta),
        support=support,
        guess_rule=rule,  # type: ignore[arg-type]
    )
