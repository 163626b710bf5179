"""The ``privacy`` section: clipping (fixed, or adaptive after Andrew et al. 2021), noise, sampling and
accounting, randomness (secure or seeded, the seeded noise stream shared or keyed by the run), and what is
published about clients; and :func:`noise_stream_key`, the run's noise key (``privacy.noise_stream=per_run``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fl_app.config.distributed import DistributedConfig, validate_distributed
from fl_app.config.readers import _boolean, _choice, _fail, _finite, _known_keys, _number, _require
from fl_app.core.choices import (
    ACCOUNTANTS,
    AMPLIFIED_SAMPLINGS,
    CLIENT_STATISTICS,
    CLIPPINGS,
    NOISE_STREAMS,
    PLACEMENTS,
    SAMPLINGS,
    AccountantName,
    ClientStatisticsMode,
    Clipping,
    NoiseStream,
    Placement,
    Sampling,
)


@dataclass(frozen=True)
class DPConfig:
    """The ``privacy`` section: client-level DP's settings (named apart from Flower's accounting ``PrivacyConfig``)."""

    clip_norm: float
    noise_multiplier: float
    sample_rate: float
    sampling: Sampling
    placement: Placement
    accountant: AccountantName
    delta: float
    max_epsilon: float | None
    target_epsilon: float | None
    secure_noise: bool | Literal["auto"]
    #: Seeded randomness (secure_noise=false) against a real SuperLink sends the seed to every sampled client, who
    #: can then recompute the sampling and the server's noise: refused unless this is true (docs/PRIVACY.md).
    allow_seeded_deployment: bool = False
    #: What metrics.jsonl, logs and run.json say about clients: raw | noisy | none | auto (raw in simulation,
    #: none against a real SuperLink). See docs/PRIVACY.md.
    client_statistics: ClientStatisticsMode = "auto"
    #: sigma_s of the noisy statistics (Gaussian on the clipped count, sensitivity 1); None = m / 20.
    statistics_noise_multiplier: float | None = None
    #: fixed: C = clip_norm every round; adaptive: C_t follows the target_quantile of the update norms from
    #: C_0 = clip_norm (Andrew et al. 2021; fl_app/privacy/adaptive_clipping.py).
    clipping: Clipping = "fixed"
    #: adaptive: gamma, the quantile of the clients' update norms that C_t aims at.
    target_quantile: float = 0.5
    #: adaptive: eta_C of the geometric update C_{t+1} = C_t exp(-eta_C (unclipped fraction - gamma)).
    clip_learning_rate: float = 0.2
    #: adaptive: sigma_b, std of the noise on the clipped count; None = m / 20.
    clipped_count_stddev: float | None = None
    #: Seeded noise: shared by every run of the seed, or keyed by the run's config (:data:`NOISE_STREAMS`,
    #: :func:`noise_stream_key`; docs/PRIVACY.md). Secure randomness never shares noise.
    noise_stream: NoiseStream = "shared"
    #: b of the participation rule (sampling=cyclic|available): any two rounds of one client at least b apart;
    #: None with the amplified samplers. Resolved: ``min_separation`` null = 1/q.
    min_separation: int | None = None
    #: k of the participation rule: at most k rounds per client; None = ⌈T/b⌉ (what b alone allows).
    max_participations: int | None = None
    #: Distributed DP's settings (placement=distributed; fl_app/config/distributed.py); None for the others.
    distributed: DistributedConfig | None = None


def _validate_privacy(
    section: Mapping[str, Any],
    num_clients: int,
    num_rounds: int = 1,
    samplings: tuple[str, ...] = AMPLIFIED_SAMPLINGS,
    strategy: str = "",
) -> DPConfig:
    """The ``privacy`` section for a run of ``num_rounds`` rounds over ``num_clients`` clients, under a strategy
    (named ``strategy``) whose accounting admits the samplers ``samplings`` (``auto`` = the first of them)."""
    _known_keys(section, DPConfig, "privacy")
    p = "privacy"
    clip_norm = _number(section, "clip_norm", p)
    _require(clip_norm > 0, "privacy.clip_norm", clip_norm, "C > 0")
    sigma = _number(section, "noise_multiplier", p)
    _require(sigma >= 0, "privacy.noise_multiplier", sigma, "sigma >= 0")
    q = _number(section, "sample_rate", p)
    _require(0 < q <= 1, "privacy.sample_rate", q, "q in (0, 1]")
    sampling = _sampling(section, q, num_clients, samplings, strategy)
    rule = _participation_rule(section, sampling, q, num_clients, num_rounds)
    delta = section.get("delta")
    if delta is None:
        delta = 1.0 / num_clients
    _require(_finite(delta) and 0 < float(delta) < 1, "privacy.delta", delta, "delta in (0, 1) or null for 1/M")
    max_eps = section.get("max_epsilon")
    _require(max_eps is None or (_finite(max_eps) and max_eps > 0), "privacy.max_epsilon", max_eps, "> 0 or null")
    target = section.get("target_epsilon")
    _require(target is None or (_finite(target) and target > 0), "privacy.target_epsilon", target, "> 0 or null")
    accountant, placement = _accountant_and_placement(section, sampling)
    distributed = None
    if placement == "distributed":
        distributed = validate_distributed(section.get("distributed"), {**section, "sampling": sampling}, num_clients)
    _require(placement == "distributed" or section.get("distributed") is None, "privacy.distributed",
             section.get("distributed"), "absent unless privacy.placement=distributed")  # fmt: skip
    return DPConfig(
        clip_norm=clip_norm,
        noise_multiplier=sigma,
        sample_rate=q,
        sampling=sampling,  # type: ignore[arg-type]
        placement=placement,  # type: ignore[arg-type]
        accountant=accountant,  # type: ignore[arg-type]
        delta=float(delta),
        max_epsilon=None if max_eps is None else float(max_eps),
        target_epsilon=None if target is None else float(target),
        secure_noise=_secure_noise(section),
        allow_seeded_deployment=(
            _boolean(section, "allow_seeded_deployment", p) if "allow_seeded_deployment" in section else False
        ),
        client_statistics=_choice(section, "client_statistics", p, CLIENT_STATISTICS),  # type: ignore[arg-type]
        statistics_noise_multiplier=_statistics_sigma(section),
        **_adaptive_clipping(section),
        noise_stream=_noise_stream(section),
        **rule,
        distributed=distributed,
    )


def _sampling(
    section: Mapping[str, Any], q: float, num_clients: int, samplings: tuple[str, ...], strategy: str
) -> str:
    """``privacy.sampling`` (``auto`` = the strategy's first), one the strategy's accounting assumes; a fixed-size
    sample of a whole number m = qM >= 1."""
    sampling = _choice(section, "sampling", "privacy", ("auto", *SAMPLINGS))
    if sampling == "auto":
        sampling = samplings[0]
    # The accountant must be the one for the sampler that runs: a run whose sampler and accounting disagree does
    # not start (the sampled Gaussian accountants amplify; DP-FTRL's rests on the enforced participation rule).
    _require(sampling in samplings, "privacy.sampling", sampling,
             f"{' | '.join(samplings)} (or auto) with strategy {strategy or '?'}: its accounting assumes one of "
             "these samplers")  # fmt: skip
    if sampling == "fixed":
        m = q * num_clients
        _require(
            abs(m - round(m)) < 1e-9 and round(m) >= 1,
            "privacy.sample_rate",
            q,
            f"q such that q * num_clients ({num_clients}) is a whole number >= 1 with sampling=fixed",
        )
    return sampling


def _accountant_and_placement(section: Mapping[str, Any], sampling: str) -> tuple[str, str]:
    """``privacy.accountant`` and ``privacy.placement``, each as the sampler allows it."""
    accountant = _choice(section, "accountant", "privacy", ACCOUNTANTS)
    # Opacus' PRV and dp_accounting's PLD have no event for sampling without replacement.
    _require(
        not (sampling == "fixed" and accountant != "rdp"),
        "privacy.accountant",
        accountant,
        "rdp with sampling=fixed (prv and pld account Poisson sampling only)",
    )
    placement = _choice(section, "placement", "privacy", PLACEMENTS)
    # With Poisson sampling the total client-side noise variance n*sigma^2*C^2/m reveals the number of
    # participants n (measurable to ~sqrt(2/d) over d coordinates); the sampled Gaussian accountant does not
    # cover that, so client placement is only offered with fixed-size sampling, where n = m always.
    _require(
        not (placement == "client" and sampling == "poisson"),
        "privacy.placement",
        placement,
        "server with sampling=poisson (client placement needs sampling=fixed, see docs/mechanisms.md, Noise)",
    )
    return accountant, placement


def _participation_rule(
    section: Mapping[str, Any], sampling: str, q: float, num_clients: int, num_rounds: int
) -> dict[str, int | None]:
    """b and k of the participation rule (fl_app/privacy/mechanisms/participation.py) for the enforced samplers;
    none for the amplified ones."""
    separation, participations = section.get("min_separation"), section.get("max_participations")
    if sampling in AMPLIFIED_SAMPLINGS:
        for key, value in (("min_separation", separation), ("max_participations", participations)):
            _require(value is None, f"privacy.{key}", value,
                     "null with sampling=poisson|fixed (a participation rule is for "
                     "sampling=cyclic|available)")  # fmt: skip
        return {"min_separation": None, "max_participations": None}
    if separation is None:
        separation = round(1.0 / q)
    _require(isinstance(separation, int) and not isinstance(separation, bool) and separation >= 1,
             "privacy.min_separation", separation, "an integer b >= 1 or null for 1/q")  # fmt: skip
    if sampling == "cyclic":
        # b groups taken in turn: each client once every b rounds, m = M/b of them a round.
        _require(abs(q * separation - 1.0) < 1e-9, "privacy.sample_rate", q,
                 f"1/min_separation = {1.0 / separation:.6g} with sampling=cyclic (b = {separation} groups taken in "
                 "turn, each a fraction 1/b of the clients)")  # fmt: skip
        _require(separation <= num_clients, "privacy.min_separation", separation,
                 f"at most dataset.num_clients ({num_clients}) groups with sampling=cyclic")  # fmt: skip
    allowed = -(-num_rounds // separation)
    if participations is None:
        participations = allowed
    _require(isinstance(participations, int) and not isinstance(participations, bool) and participations >= 1,
             "privacy.max_participations", participations, "an integer k >= 1 or null for ceil(T/b)")  # fmt: skip
    _require(sampling != "cyclic" or participations >= allowed, "privacy.max_participations", participations,
             f">= ceil(T/b) = {allowed} with sampling=cyclic (every client is taken every b rounds)")  # fmt: skip
    return {"min_separation": separation, "max_participations": min(participations, allowed)}


def _adaptive_clipping(section: Mapping[str, Any]) -> dict[str, Any]:
    p = "privacy"
    clipping = _choice(section, "clipping", p, CLIPPINGS) if "clipping" in section else "fixed"
    quantile = _number(section, "target_quantile", p) if "target_quantile" in section else 0.5
    _require(0 < quantile < 1, "privacy.target_quantile", quantile, "gamma in (0, 1)")
    rate = _number(section, "clip_learning_rate", p) if "clip_learning_rate" in section else 0.2
    _require(rate > 0, "privacy.clip_learning_rate", rate, "eta_C > 0")
    stddev = section.get("clipped_count_stddev")
    _require(stddev is None or (_finite(stddev) and float(stddev) > 0), "privacy.clipped_count_stddev", stddev,
             "sigma_b > 0 or null for m / 20")  # fmt: skip
    if clipping == "adaptive":
        # The adaptive count *is* the published clipped fraction: a second statistics release would spend twice.
        _require(section.get("statistics_noise_multiplier") is None, "privacy.statistics_noise_multiplier",
                 section.get("statistics_noise_multiplier"),
                 "null with clipping=adaptive (the clipped fraction released by adaptive clipping is the noisy "
                 "statistic; its noise is privacy.clipped_count_stddev)")  # fmt: skip
    return {
        "clipping": clipping,
        "target_quantile": quantile,
        "clip_learning_rate": rate,
        "clipped_count_stddev": None if stddev is None else float(stddev),
    }


def _check_adaptive_support(privacy: DPConfig, refusal: str | None) -> None:
    if privacy.clipping == "adaptive" and refusal is not None:
        raise _fail("privacy.clipping", "adaptive", f"fixed with this strategy: {refusal}")


def _check_placement_support(privacy: DPConfig, client_refusal: str | None, distributed_refusal: str | None) -> None:
    if privacy.placement == "client" and client_refusal is not None:
        raise _fail("privacy.placement", "client", f"server with this strategy: {client_refusal}")
    if privacy.placement == "distributed" and distributed_refusal is not None:
        raise _fail("privacy.placement", "distributed", f"server or client with this strategy: {distributed_refusal}")


def _statistics_sigma(section: Mapping[str, Any]) -> float | None:
    value = section.get("statistics_noise_multiplier")
    if value is None:
        return None
    _require(_finite(value) and float(value) > 0, "privacy.statistics_noise_multiplier", value, "null or > 0")
    return float(value)


def _noise_stream(section: Mapping[str, Any]) -> NoiseStream:
    # Configs stored before the key existed (checkpoints) drew the shared streams.
    if "noise_stream" not in section:
        return "shared"
    return _choice(section, "noise_stream", "privacy", NOISE_STREAMS)  # type: ignore[return-value]


def _secure_noise(section: Mapping[str, Any]) -> bool | Literal["auto"]:
    value = section.get("secure_noise")
    _require(value in (True, False, "auto"), "privacy.secure_noise", value, "auto, true or false")
    return value  # type: ignore[return-value]


# --- the run's noise key (privacy.noise_stream=per_run) ---------------------------------------------------------
