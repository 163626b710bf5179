"""One validated, typed configuration for a run — the only place where config values are range-checked.

Hydra composes ``conf/`` (from the command line in :mod:`fl_app.main`, or from the ``flwr run`` run-config in
:mod:`fl_app.server_app`), :func:`load_app_config` turns the composed tree into frozen dataclasses and rejects
bad values with one message that names the key and the allowed range, before Ray or any worker starts.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

from omegaconf import DictConfig, OmegaConf

from fl_app.choices import (
    ACCOUNTANTS,
    CLIENT_STATISTICS,
    CLIPPINGS,
    COHORT_ENGINES,
    DEVICES,
    GUESS_RULES,
    NOISE_STREAMS,
    NOISY_SCHEDULES,
    PLACEMENTS,
    POPULATIONS,
    SAMPLINGS,
    AccountantName,
    ClientStatisticsMode,
    Clipping,
    CohortEngine,
    Device,
    GuessRule,
    NoiseStream,
    Placement,
    PopulationMode,
    Sampling,
)
from fl_app.server_optimizers import SERVER_OPTIMIZERS

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


#: Every strategy class named by ``strategy._target_`` derives from this one.
STRATEGY_BASE = "strategies.base.FederatedStrategy"


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key and what is allowed."""


@dataclass(frozen=True)
class StrategyConfig:
    """Every strategy's settings: its name, its class and the server's step size. A strategy with settings of its
    own names a subclass below as its ``settings_class`` (strategies/); each subclass validates its own fields
    (:meth:`check`), so a strategy is validated for what it reads and nothing else."""

    name: str
    target: str
    server_lr: float = 1.0

    def check(self) -> None:
        """Raise :class:`ConfigError` for a value out of range (the types were checked when it was read)."""
        require(self.server_lr > 0, "strategy.server_lr", self.server_lr, "> 0")


@dataclass(frozen=True)
class SparseConfig(StrategyConfig):
    """Sparsified methods (SPEC §5, SPEC_BASELINES.md): the fraction p of coordinates kept per layer."""

    sparsity: float = 0.4

    def check(self) -> None:
        super().check()
        require(0 < self.sparsity <= 1, "strategy.sparsity", self.sparsity, "p in (0, 1]")


@dataclass(frozen=True)
class MaskedConfig(SparseConfig):
    """A sparsified method whose mask has a source: one of the class's ``MASK_SOURCES``."""

    MASK_SOURCES: ClassVar[tuple[str, ...]] = ()
    mask_source: str = ""

    def check(self) -> None:
        super().check()
        require(self.mask_source in self.MASK_SOURCES, "strategy.mask_source", self.mask_source,
                " | ".join(self.MASK_SOURCES))  # fmt: skip


@dataclass(frozen=True)
class TopKConfig(MaskedConfig):
    """DP-FedSAM-topk: the top-k mask of the noisy update (covered) or of the clean one (not covered)."""

    MASK_SOURCES: ClassVar[tuple[str, ...]] = ("noisy", "clean")
    mask_source: str = "noisy"


@dataclass(frozen=True)
class RandKConfig(SparseConfig):
    """Fed-SMP-randk: send (update ⊙ mask) / p (unbiased) instead of update ⊙ mask."""

    rescale: bool = True


@dataclass(frozen=True)
class SMPTopKConfig(MaskedConfig):
    """Fed-SMP-topk: each client's own top-k (as published; not covered) or last round's public global top-k."""

    MASK_SOURCES: ClassVar[tuple[str, ...]] = ("local", "global")
    mask_source: str = "local"


@dataclass(frozen=True)
class BlurConfig(StrategyConfig):
    """DP-FedAvg-blur: the BLUR coefficient λ."""

    blur_coef: float = 1.0

    def check(self) -> None:
        super().check()
        require(self.blur_coef >= 0, "strategy.blur_coef", self.blur_coef, ">= 0")


@dataclass(frozen=True)
class BlurSparseConfig(BlurConfig, SparseConfig):
    """DP-FedAvg-blurs: BLUR plus local update sparsification keeping the fraction p per layer (both checks)."""


@dataclass(frozen=True)
class NoisyConfig(StrategyConfig):
    """Noisy-FedAvg (seed 004): K local steps, the schedule's constant μ and the schedule, per-step gradient clip V,
    absolute noise std σ on the uploaded model, the assumed smoothness L."""

    local_steps: int = 10
    noisy_lr: float = 0.05
    lr_schedule: str = "constant"
    grad_clip: float = 1.0
    noise_std: float = 0.01
    smoothness: float = 1.0

    def check(self) -> None:
        super().check()
        require(self.noisy_lr > 0, "strategy.noisy_lr", self.noisy_lr, "> 0")
        require(self.lr_schedule in NOISY_SCHEDULES, "strategy.lr_schedule", self.lr_schedule,
                " | ".join(NOISY_SCHEDULES))  # fmt: skip
        require(self.grad_clip > 0, "strategy.grad_clip", self.grad_clip, "V > 0")
        require(self.noise_std >= 0, "strategy.noise_std", self.noise_std, "sigma >= 0")
        require(self.smoothness > 0, "strategy.smoothness", self.smoothness, "L > 0")


@dataclass(frozen=True)
class NoisyProxConfig(NoisyConfig):
    """Noisy-FedProx: Noisy-FedAvg plus the proximal coefficient α."""

    prox_coef: float = 0.0

    def check(self) -> None:
        super().check()
        require(self.prox_coef >= 0, "strategy.prox_coef", self.prox_coef, "alpha >= 0")


@dataclass(frozen=True)
class ClientConfig:
    local_epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    lr_decay: float
    rho: float
    adaptive: bool


@dataclass(frozen=True)
class DatasetConfig:
    name: str
    data_dir: str | None
    download: bool
    partition: str
    alpha: float
    num_clients: int
    max_train_samples: int | None
    max_test_samples: int | None


@dataclass(frozen=True)
class ModelConfig:
    name: str


@dataclass(frozen=True)
class PrivacyConfig:
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


@dataclass(frozen=True)
class SimulationConfig:
    client_cpus: float
    client_gpus: float
    device: Device
    #: CPUs one simulation may use (Ray's num_cpus and the server's torch threads); None = every core. Set it to
    #: cores / n_jobs when a launcher runs n_jobs simulations at once.
    total_cpus: int | None = None
    #: Clients per train message (population=virtual): 1 = one message per client; k > 1 = cohorts of about k
    #: clients balanced by local work; "auto" = one cohort per worker (SuperNode) in simulation, 1 in deployment.
    cohort_size: int | Literal["auto"] = "auto"
    #: How a worker trains a cohort: one client after another, or all at once on stacked models (torch.func);
    #: "auto" = vectorized on a GPU, sequential on a CPU.
    cohort_engine: Literal["auto"] | CohortEngine = "auto"
    #: None = start a local Ray for this run; "auto" or "host:port" = join that running Ray cluster.
    ray_address: str | None = None


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
    #: (fl_app/privacy/audit.py ``sparse_canary_direction``: ~150x cheaper to draw and score, so K can be large).
    support: int | None = None
    #: The lower bound's guesses (:data:`GUESS_RULES`). One-sided by default: an inserted canary that never joins a
    #: round (a fraction (1 − q)^T) scores like the null whatever the mechanism, so two-sided "not inserted" guesses
    #: on the lowest scores are partly wrong by construction and keep the bound below the accountant (docs/audit.md).
    guess_rule: GuessRule = "one_sided"

    @property
    def enabled(self) -> bool:
        return self.canaries > 0


@dataclass(frozen=True)
class ServerOptimizerConfig:
    """How the server moves the global model along the round's released average (fl_app/server_optimizers.py);
    the step size is ``strategy.server_lr``."""

    name: str = "sgd"
    #: beta1: momentum's and Adam/Yogi's first-moment decay.
    momentum: float = 0.9
    #: beta2: Adam/Yogi's second-moment decay.
    beta2: float = 0.99
    #: tau: added to the root of the second moment (adagrad, adam, yogi).
    eps: float = 1e-3


@dataclass(frozen=True)
class FaultInjectionConfig:
    """Chaos testing: partitions whose client misbehaves on purpose (the server must cope; see docs/running.md)."""

    raise_partitions: tuple[int, ...] = ()
    nan_partitions: tuple[int, ...] = ()
    wrong_shape_partitions: tuple[int, ...] = ()
    huge_norm_partitions: tuple[int, ...] = ()

    def fault_of(self, partition_id: int) -> str:
        for kind in ("raise", "nan", "wrong_shape", "huge_norm"):
            if partition_id in getattr(self, f"{kind}_partitions"):
                return kind
        return ""


@dataclass(frozen=True)
class AppConfig:
    seed: int
    num_rounds: int
    eval_every: int
    population: PopulationMode
    round_timeout: float
    checkpoint_every: int
    resume: str | None
    output_dir: str | None
    strategy: StrategyConfig
    client: ClientConfig
    dataset: DatasetConfig
    model: ModelConfig
    privacy: PrivacyConfig
    simulation: SimulationConfig
    fault_injection: FaultInjectionConfig = FaultInjectionConfig()
    audit: AuditConfig = AuditConfig()
    server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_raw(self) -> dict[str, Any]:
        """The composed-config form that :func:`validate` accepts (round trip: ``validate(c.to_raw()) == c``)."""
        raw = asdict(self)
        raw["strategy"]["_target_"] = raw["strategy"].pop("target")
        raw["fault_injection"] = {k: list(v) for k, v in raw["fault_injection"].items()}
        return raw


def _fail(key: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"invalid config value {key}={value!r}: allowed {allowed}")


def require(ok: bool, key: str, value: object, allowed: str) -> None:
    """Raise :class:`ConfigError` ``invalid config value key=value: allowed ...`` unless ``ok`` (a settings class's
    :meth:`~StrategyConfig.check` uses it, as every check here does)."""
    if not ok:
        raise _fail(key, value, allowed)


_require = require


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def _number(section: Mapping[str, Any], key: str, prefix: str) -> float:
    value = section.get(key)
    _require(_finite(value), f"{prefix}.{key}", value, "a finite number")
    return float(value)  # type: ignore[arg-type]


def _integer(section: Mapping[str, Any], key: str, prefix: str, minimum: int) -> int:
    value = section.get(key)
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    _require(ok, f"{prefix}.{key}", value, f"an integer >= {minimum}")
    return int(value)  # type: ignore[arg-type]


def _optional_integer(section: Mapping[str, Any], key: str, prefix: str, minimum: int) -> int | None:
    return None if section.get(key) is None else _integer(section, key, prefix, minimum)


def _choice(section: Mapping[str, Any], key: str, prefix: str, options: Iterable[str]) -> str:
    value = section.get(key)
    opts = tuple(options)
    _require(value in opts, f"{prefix}.{key}" if prefix else key, value, "one of " + ", ".join(opts))
    return str(value)


def _boolean(section: Mapping[str, Any], key: str, prefix: str) -> bool:
    value = section.get(key)
    _require(isinstance(value, bool), f"{prefix}.{key}", value, "true or false")
    return bool(value)


def _known_keys(section: Mapping[str, Any], cls: type, prefix: str, extra: Iterable[str] = ()) -> None:
    allowed = {f.name for f in fields(cls)} | set(extra)
    unknown = sorted(set(section) - allowed)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"unknown config key(s) {', '.join(where + k for k in unknown)}; known: {', '.join(sorted(allowed))}"
        )


def _validate_audit(section: Mapping[str, Any], strategy: type) -> AuditConfig:
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
        refusal = getattr(strategy, "audit_refusal", None)
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


def _strategy_class(section: Mapping[str, Any]) -> type:
    """The class ``strategy._target_`` names (checked by :func:`_validate_strategy`)."""
    module_name, _, class_name = str(section.get("_target_")).rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)


#: Keys every strategy's section carried while the settings were one flat class for all strategies: a config stored
#: then (a checkpoint's) holds them all, at values its strategy did not read.
LEGACY_STRATEGY_KEYS = (
    "sparsity", "mask_source", "rescale", "blur_coef", "local_steps", "noisy_lr", "lr_schedule", "grad_clip",
    "noise_std", "prox_coef", "smoothness",
)  # fmt: skip


def upgrade_stored_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config (a checkpoint's) in today's form: the strategy section keeps only its strategy's own
    settings of :data:`LEGACY_STRATEGY_KEYS` (the others were never read). Today's configs pass unchanged."""
    upgraded = dict(raw)
    section = dict(raw.get("strategy") or {})
    try:
        settings_class = getattr(_strategy_class(section), "settings_class", StrategyConfig)
    except Exception:  # an unimportable target: validate() reports it
        return upgraded
    own = {f.name for f in fields(settings_class)}
    upgraded["strategy"] = {k: v for k, v in section.items() if k in own or k not in LEGACY_STRATEGY_KEYS}
    return upgraded


def _validate_strategy(section: Mapping[str, Any]) -> StrategyConfig:
    target = section.get("_target_")
    _require(isinstance(target, str) and "." in target, "strategy._target_", target, "a dotted class path")
    module_name, _, class_name = str(target).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise _fail("strategy._target_", target, "an importable strategy class") from exc
    # Checked by name along the MRO: importing strategies.base here would make this module and the strategy
    # package import each other (they depend on this module, not the other way round).
    _require(
        isinstance(cls, type) and any(f"{c.__module__}.{c.__qualname__}" == STRATEGY_BASE for c in cls.__mro__),
        "strategy._target_",
        target,
        "a subclass of strategies.base.FederatedStrategy",
    )
    settings_class = getattr(cls, "settings_class", StrategyConfig)
    _known_keys(section, settings_class, "strategy", extra=("_target_",))
    p = "strategy"
    name = section.get("name")
    _require(isinstance(name, str) and bool(name), "strategy.name", name, "a non-empty string")
    defaults = settings_class(name=str(name), target=str(target))
    values: dict[str, Any] = {}
    for f in fields(settings_class):
        if f.name in ("name", "target") or f.name not in section:
            continue
        default = getattr(defaults, f.name)
        if isinstance(default, bool):
            values[f.name] = _boolean(section, f.name, p)
        elif isinstance(default, int):
            values[f.name] = _integer(section, f.name, p, 1)
        elif isinstance(default, float):
            values[f.name] = _number(section, f.name, p)
        else:
            value = section.get(f.name)
            _require(isinstance(value, str), f"strategy.{f.name}", value, "a string")
            values[f.name] = value
    cfg = replace(defaults, **values)
    cfg.check()
    return cfg


def _validate_client(section: Mapping[str, Any]) -> ClientConfig:
    _known_keys(section, ClientConfig, "client")
    p = "client"
    cfg = ClientConfig(
        local_epochs=_integer(section, "local_epochs", p, 1),
        batch_size=_integer(section, "batch_size", p, 1),
        lr=_number(section, "lr", p),
        momentum=_number(section, "momentum", p),
        weight_decay=_number(section, "weight_decay", p),
        lr_decay=_number(section, "lr_decay", p),
        rho=_number(section, "rho", p),
        adaptive=_boolean(section, "adaptive", p),
    )
    _require(cfg.lr > 0, "client.lr", cfg.lr, "> 0")
    _require(0 <= cfg.momentum < 1, "client.momentum", cfg.momentum, "[0, 1)")
    _require(cfg.weight_decay >= 0, "client.weight_decay", cfg.weight_decay, ">= 0")
    _require(0 < cfg.lr_decay <= 1, "client.lr_decay", cfg.lr_decay, "(0, 1]")
    _require(cfg.rho >= 0, "client.rho", cfg.rho, ">= 0")
    return cfg


def _validate_dataset(section: Mapping[str, Any]) -> DatasetConfig:
    from fl_app.data.datasets import DATASETS
    from fl_app.data.partition import SCHEMES

    _known_keys(section, DatasetConfig, "dataset")
    p = "dataset"
    data_dir = section.get("data_dir")
    _require(data_dir is None or isinstance(data_dir, str), "dataset.data_dir", data_dir, "a path or null")
    cfg = DatasetConfig(
        name=_choice(section, "name", p, DATASETS),
        data_dir=data_dir,
        download=_boolean(section, "download", p),
        partition=_choice(section, "partition", p, SCHEMES),
        alpha=_number(section, "alpha", p),
        num_clients=_integer(section, "num_clients", p, 1),
        max_train_samples=_optional_integer(section, "max_train_samples", p, 1),
        max_test_samples=_optional_integer(section, "max_test_samples", p, 1),
    )
    _require(cfg.alpha > 0, "dataset.alpha", cfg.alpha, "> 0")
    return cfg


def _validate_model(section: Mapping[str, Any]) -> ModelConfig:
    from fl_app.models import MODELS

    _known_keys(section, ModelConfig, "model")
    return ModelConfig(name=_choice(section, "name", "model", MODELS))


def _validate_privacy(section: Mapping[str, Any], num_clients: int) -> PrivacyConfig:
    _known_keys(section, PrivacyConfig, "privacy")
    p = "privacy"
    clip_norm = _number(section, "clip_norm", p)
    _require(clip_norm > 0, "privacy.clip_norm", clip_norm, "C > 0")
    sigma = _number(section, "noise_multiplier", p)
    _require(sigma >= 0, "privacy.noise_multiplier", sigma, "sigma >= 0")
    q = _number(section, "sample_rate", p)
    _require(0 < q <= 1, "privacy.sample_rate", q, "q in (0, 1]")
    sampling = _choice(section, "sampling", p, SAMPLINGS)
    if sampling == "fixed":
        m = q * num_clients
        _require(
            abs(m - round(m)) < 1e-9 and round(m) >= 1,
            "privacy.sample_rate",
            q,
            f"q such that q * num_clients ({num_clients}) is a whole number >= 1 with sampling=fixed",
        )
    delta = section.get("delta")
    if delta is None:
        delta = 1.0 / num_clients
    _require(_finite(delta) and 0 < float(delta) < 1, "privacy.delta", delta, "delta in (0, 1) or null for 1/M")
    max_eps = section.get("max_epsilon")
    _require(max_eps is None or (_finite(max_eps) and max_eps > 0), "privacy.max_epsilon", max_eps, "> 0 or null")
    target = section.get("target_epsilon")
    _require(target is None or (_finite(target) and target > 0), "privacy.target_epsilon", target, "> 0 or null")
    accountant = _choice(section, "accountant", p, ACCOUNTANTS)
    # Opacus' PRV and dp_accounting's PLD have no event for sampling without replacement.
    _require(
        not (sampling == "fixed" and accountant != "rdp"),
        "privacy.accountant",
        accountant,
        "rdp with sampling=fixed (prv and pld account Poisson sampling only)",
    )
    placement = _choice(section, "placement", p, PLACEMENTS)
    # With Poisson sampling the total client-side noise variance n*sigma^2*C^2/m reveals the number of
    # participants n (measurable to ~sqrt(2/d) over d coordinates); the sampled Gaussian accountant does not
    # cover that, so client placement is only offered with fixed-size sampling, where n = m always.
    _require(
        not (placement == "client" and sampling == "poisson"),
        "privacy.placement",
        placement,
        "server with sampling=poisson (client placement needs sampling=fixed, see docs/mechanisms.md, Noise)",
    )
    return PrivacyConfig(
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
    )


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


def _check_adaptive_support(privacy: PrivacyConfig, strategy: type) -> None:
    refusal = getattr(strategy, "adaptive_clipping_refusal", None)
    if privacy.clipping == "adaptive" and refusal is not None:
        raise _fail("privacy.clipping", "adaptive", f"fixed with this strategy: {refusal}")


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


def _validate_faults(section: Mapping[str, Any], num_clients: int) -> FaultInjectionConfig:
    _known_keys(section, FaultInjectionConfig, "fault_injection")
    lists: dict[str, tuple[int, ...]] = {}
    for key, value in section.items():
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < num_clients for v in value
        )
        _require(ok, f"fault_injection.{key}", value, f"a list of partition ids in [0, {num_clients})")
        lists[key] = tuple(int(v) for v in value)
    return FaultInjectionConfig(**lists)


def _secure_noise(section: Mapping[str, Any]) -> bool | Literal["auto"]:
    value = section.get("secure_noise")
    _require(value in (True, False, "auto"), "privacy.secure_noise", value, "auto, true or false")
    return value  # type: ignore[return-value]


def _validate_simulation(section: Mapping[str, Any]) -> SimulationConfig:
    _known_keys(section, SimulationConfig, "simulation")
    p = "simulation"
    cpus = _number(section, "client_cpus", p)
    _require(cpus > 0, "simulation.client_cpus", cpus, "> 0")
    gpus = _number(section, "client_gpus", p)
    _require(0 <= gpus <= 1, "simulation.client_gpus", gpus, "[0, 1] (a GPU fraction per client)")
    total = _optional_integer(section, "total_cpus", p, 1)
    if total is not None:
        _require(cpus <= total, "simulation.client_cpus", cpus, f"<= simulation.total_cpus ({total})")
    cohort = section.get("cohort_size", "auto")
    if cohort != "auto":
        _require(
            isinstance(cohort, int) and not isinstance(cohort, bool) and cohort >= 1,
            "simulation.cohort_size", cohort, "'auto' or an integer >= 1",
        )  # fmt: skip
    address = section.get("ray_address")
    _require(address is None or (isinstance(address, str) and address.strip() != ""),
             "simulation.ray_address", address, "null, 'auto' or 'host:port' of a running Ray cluster")  # fmt: skip
    if address is not None:
        _require(total is None, "simulation.total_cpus", total,
                 "null when joining a Ray cluster (the cluster's resources are fixed by `ray start`)")  # fmt: skip
    return SimulationConfig(
        client_cpus=cpus,
        client_gpus=gpus,
        device=_choice(section, "device", p, DEVICES),  # type: ignore[arg-type]
        total_cpus=total,
        cohort_size=cohort,
        cohort_engine=_choice(section, "cohort_engine", p, COHORT_ENGINES),  # type: ignore[arg-type]
        ray_address=address,
    )


def validate(raw: Mapping[str, Any]) -> AppConfig:
    """Turn a plain composed config mapping into an :class:`AppConfig`, or raise :class:`ConfigError`."""
    groups = ("strategy", "client", "dataset", "model", "privacy", "simulation")
    top = {f.name for f in fields(AppConfig)}
    unknown = sorted(set(raw) - top - {"hydra"})
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(unknown)}; known: {', '.join(sorted(top))}")
    for group in groups:
        if not isinstance(raw.get(group), Mapping):
            raise ConfigError(f"config group {group!r} is missing or not a mapping")
    dataset = _validate_dataset(raw["dataset"])
    output_dir = raw.get("output_dir")
    _require(output_dir is None or isinstance(output_dir, str), "output_dir", output_dir, "a path or null")
    simulation = _validate_simulation(raw["simulation"])
    population = _choice(raw, "population", "", POPULATIONS)
    if population == "nodes":
        # Each SuperNode owns one partition and trains only it: a cohort of several would need other nodes' data.
        _require(simulation.cohort_size in (1, "auto"), "simulation.cohort_size", simulation.cohort_size,
                 "1 or 'auto' with population=nodes (one client per SuperNode)")  # fmt: skip
    strategy = _validate_strategy(raw["strategy"])
    strategy_class = _strategy_class(raw["strategy"])
    privacy = _validate_privacy(raw["privacy"], dataset.num_clients)
    _check_adaptive_support(privacy, strategy_class)
    return AppConfig(
        seed=_top_int(raw, "seed", 0),
        num_rounds=_top_int(raw, "num_rounds", 1),
        eval_every=_top_int(raw, "eval_every", 1),
        population=population,  # type: ignore[arg-type]
        round_timeout=_positive_top(raw, "round_timeout"),
        checkpoint_every=_top_int(raw, "checkpoint_every", 0),
        resume=_optional_path(raw, "resume"),
        output_dir=output_dir,
        strategy=strategy,
        client=_validate_client(raw["client"]),
        dataset=dataset,
        model=_validate_model(raw["model"]),
        privacy=privacy,
        simulation=simulation,
        fault_injection=_validate_faults(raw.get("fault_injection") or {}, dataset.num_clients),
        audit=_validate_audit(raw.get("audit") or {}, strategy_class),
        # Configs stored before server optimizers existed (checkpoints) resume with the plain server step.
        server_optimizer=_validate_server_optimizer(raw.get("server_optimizer") or {"name": "sgd"}),
    )


def _validate_server_optimizer(section: Mapping[str, Any]) -> ServerOptimizerConfig:
    _known_keys(section, ServerOptimizerConfig, "server_optimizer")
    p = "server_optimizer"
    defaults = ServerOptimizerConfig()
    name = _choice(section, "name", p, SERVER_OPTIMIZERS)
    momentum = _number(section, "momentum", p) if "momentum" in section else defaults.momentum
    _require(0 <= momentum < 1, "server_optimizer.momentum", momentum, "beta1 in [0, 1)")
    beta2 = _number(section, "beta2", p) if "beta2" in section else defaults.beta2
    _require(0 <= beta2 < 1, "server_optimizer.beta2", beta2, "beta2 in [0, 1)")
    eps = _number(section, "eps", p) if "eps" in section else defaults.eps
    _require(eps > 0, "server_optimizer.eps", eps, "tau > 0")
    return ServerOptimizerConfig(name=name, momentum=momentum, beta2=beta2, eps=eps)


def _top_int(raw: Mapping[str, Any], key: str, minimum: int) -> int:
    value = raw.get(key)
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= minimum
    _require(ok, key, value, f"an integer >= {minimum}")
    return int(value)  # type: ignore[arg-type]


def _optional_path(raw: Mapping[str, Any], key: str) -> str | None:
    value = raw.get(key)
    _require(value is None or (isinstance(value, str) and bool(value)), key, value, "a path or null")
    return value


def _positive_top(raw: Mapping[str, Any], key: str) -> float:
    value = raw.get(key)
    _require(_finite(value) and float(value) > 0, key, value, "a number > 0")  # type: ignore[arg-type]
    return float(value)  # type: ignore[arg-type]


def load_app_config(cfg: DictConfig | Mapping[str, Any]) -> AppConfig:
    """Validate a Hydra-composed config (``DictConfig``) or an equivalent plain mapping."""
    raw = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    assert isinstance(raw, dict)
    raw.pop("hydra", None)
    return validate(raw)


# --- the run's noise key (privacy.noise_stream=per_run) ---------------------------------------------------------

#: Top-level keys the noise key does not hash: where the run writes (a resume rewrites both to the run directory, and
#: must draw the noise it drew before).
NOISE_KEY_IGNORES: tuple[str, ...] = ("output_dir", "resume")


def noise_stream_key(config: AppConfig) -> int | None:
    """The extra key word of every seeded *noise* stream of the run, or None when its noise is the seed's shared one.

    With ``privacy.noise_stream=per_run``: a 63-bit integer from the SHA-256 of the canonical JSON of the validated
    config less :data:`NOISE_KEY_IGNORES`. Two runs whose configs differ in anything else (strategy, C, σ, ...) then
    draw independent noise, while a run re-run or resumed from its stored config draws the same noise again (a
    seeded resume must repeat its logged releases). A pure function of the config: the one place the key is made.
    """
    if config.privacy.noise_stream == "shared":
        return None
    keyed = {k: v for k, v in config.to_dict().items() if k not in NOISE_KEY_IGNORES}
    canonical = json.dumps(keyed, sort_keys=True, separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(canonical.encode()).digest()[:8], "big") >> 1


# --- flwr run front door ---------------------------------------------------------------------------------------

# Run-config keys (pyproject [tool.flwr.app.config]) that select a Hydra config group.
GROUP_KEYS = ("strategy", "client", "dataset", "model", "privacy", "simulation", "audit", "server_optimizer")
# Run-config keys that set a top-level scalar of conf/config.yaml.
SCALAR_KEYS = ("seed", "num_rounds", "eval_every", "population", "round_timeout", "checkpoint_every")


def overrides_from_run_config(run_config: Mapping[str, Any]) -> list[str]:
    """Translate ``flwr run --run-config`` values into Hydra overrides.

    Group choices and top-level scalars are keys of their own; anything else goes through the ``overrides`` key,
    a space-separated list of Hydra overrides (``overrides='privacy.clip_norm=0.5 dataset.alpha=0.3'``).
    """
    unknown = sorted(set(run_config) - set(GROUP_KEYS) - set(SCALAR_KEYS) - {"overrides", "output_dir"})
    if unknown:
        raise ConfigError(f"unknown run-config key(s) {', '.join(unknown)}")
    result = [f"{key}={run_config[key]}" for key in GROUP_KEYS if key in run_config]
    result += [f"{key}={run_config[key]}" for key in SCALAR_KEYS if key in run_config]
    output_dir = run_config.get("output_dir")
    if output_dir:
        result.append(f"output_dir={output_dir}")
    extra = run_config.get("overrides", "")
    if not isinstance(extra, str):
        raise _fail("overrides", extra, "a string of space-separated Hydra overrides")
    result += extra.split()
    return result


# --- keyword construction (a strategy built in a user's ServerApp) ---------------------------------------------

#: The sections a keyword setting can name a field of, in AppConfig order.
SETTING_SECTIONS: dict[str, type] = {
    "strategy": StrategyConfig,
    "client": ClientConfig,
    "dataset": DatasetConfig,
    "model": ModelConfig,
    "privacy": PrivacyConfig,
    "simulation": SimulationConfig,
    "audit": AuditConfig,
    "server_optimizer": ServerOptimizerConfig,
}


def settings_overrides(
    strategy: str, settings: Mapping[str, Any], strategy_settings: type[StrategyConfig] = StrategyConfig
) -> list[str]:
    """Hydra overrides for ``strategy`` (a conf/strategy name, whose settings class is ``strategy_settings``) and
    keyword ``settings``.

    A setting is a top-level key (``num_rounds=5``), a group choice given as a string (``dataset="cifar10"``,
    ``server_optimizer="adam"``), a section given as a dict (``privacy={"clip_norm": 0.5}``), a dotted key
    (``**{"client.momentum": 0.5}``), or the bare name of a field that exactly one section has
    (``clip_norm=0.5`` is ``privacy.clip_norm``). An unknown or ambiguous name raises TypeError naming the
    candidates, as a wrong keyword argument does.
    """
    overrides = [f"strategy={strategy}"]
    groups = [(key, value) for key, value in settings.items() if key in GROUP_KEYS and isinstance(value, str)]
    overrides += [f"{key}={value}" for key, value in groups]  # choices first: a field then overrides the choice
    for key, value in settings.items():
        if key == "strategy":
            raise TypeError("the strategy is the class; pass its settings, not strategy=")
        if key in GROUP_KEYS and isinstance(value, str):
            continue
        if key in SETTING_SECTIONS and isinstance(value, Mapping):
            overrides += [f"{key}.{name}={_override_value(v)}" for name, v in value.items()]
            continue
        overrides.append(f"{_setting_key(key, {**SETTING_SECTIONS, 'strategy': strategy_settings})}="
                         f"{_override_value(value)}")  # fmt: skip
    return overrides


def _setting_key(name: str, sections: Mapping[str, type]) -> str:
    if "." in name or name in SCALAR_KEYS or name in ("resume", "output_dir"):
        return name
    owners = [section for section, cls in sections.items() if name in {f.name for f in fields(cls)}]
    if len(owners) == 1:
        return f"{owners[0]}.{name}"
    if not owners:
        raise TypeError(f"unknown setting {name!r}: a top-level key ({', '.join(SCALAR_KEYS)}), a group, or a "
                        f"field of {', '.join(SETTING_SECTIONS)}")  # fmt: skip
    raise TypeError(
        f"ambiguous setting {name!r}: " + " or ".join(f"{o}.{name}" for o in owners) + " (pass the dotted key)"
    )


def _override_value(value: Any) -> str:
    """A Python value as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def compose_config(overrides: Iterable[str] = ()) -> AppConfig:
    """Compose ``conf/config.yaml`` with Hydra overrides outside a Hydra app, and validate it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc
    return load_app_config(cfg)
