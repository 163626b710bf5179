"""The whole validated configuration of a run: :class:`AppConfig`, :func:`validate` (a composed mapping, every
group checked and the checks across groups) and :func:`load_app_config` (a Hydra-composed ``DictConfig``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fl_app.config.audit import AuditConfig, _validate_audit
from fl_app.config.faults import FaultInjectionConfig, _validate_faults
from fl_app.config.privacy import DPConfig, _check_adaptive_support, _check_placement_support, _validate_privacy
from fl_app.config.readers import ConfigError, _choice, _finite, _require
from fl_app.config.server_optimizer import DEFAULT_SERVER_LR, ServerOptimizerConfig, _validate_server_optimizer
from fl_app.config.simulation import SimulationConfig, _validate_simulation
from fl_app.config.strategy_rules import strategy_rules
from fl_app.config.strategy_settings import StrategyConfig, _validate_strategy
from fl_app.config.training import (
    ClientConfig,
    DatasetConfig,
    ModelConfig,
    _validate_client,
    _validate_dataset,
    _validate_model,
)
from fl_app.core.choices import POPULATIONS, PopulationMode


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
    privacy: DPConfig
    simulation: SimulationConfig
    # Frozen dataclasses, so immutable defaults (ruff sees that only in the module that defines them).
    fault_injection: FaultInjectionConfig = FaultInjectionConfig()  # noqa: RUF009
    audit: AuditConfig = AuditConfig()  # noqa: RUF009
    server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig()  # noqa: RUF009
    #: Consecutive rounds in which clients were sampled but no update was accepted before the run fails (0 = never):
    #: such rounds release noise only and spend ε while nobody trains (fl_app/empty_rounds.py).
    max_empty_rounds: int = 3
    #: ``population=virtual`` against a real SuperLink: each SuperNode is sent the ids of the sampled clients whose
    #: partitions it trains, so the sample is not secret from SuperNodes; refused unless this is true
    #: (strategies/settings.py, docs/PRIVACY.md).
    allow_virtual_deployment: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_raw(self) -> dict[str, Any]:
        """The composed-config form that :func:`validate` accepts (round trip: ``validate(c.to_raw()) == c``)."""
        raw = asdict(self)
        raw["fault_injection"] = {k: list(v) for k, v in raw["fault_injection"].items()}
        return raw


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
    rules = strategy_rules(raw["strategy"].get("name"))  # what the strategy registered under that name checks
    strategy = _validate_strategy(raw["strategy"], rules.settings_class)
    privacy = _validate_privacy(
        raw["privacy"], dataset.num_clients, _top_int(raw, "num_rounds", 1), rules.samplings, strategy.name
    )
    _check_adaptive_support(privacy, rules.adaptive_clipping_refusal)
    _check_placement_support(privacy, rules.client_placement_refusal, rules.distributed_placement_refusal)
    if privacy.placement == "distributed":
        # Secure aggregation's participant is one client: a message holds one, each with its own masks.
        _require(simulation.cohort_size in (1, "auto"), "simulation.cohort_size", simulation.cohort_size,
                 "1 or 'auto' with privacy.placement=distributed (one client per message)")  # fmt: skip
    # Configs stored before server optimizers existed (checkpoints) resume with the plain server step.
    server_optimizer = _validate_server_optimizer(raw.get("server_optimizer") or {"name": "sgd"})
    if strategy.server_lr is None:  # the server optimizer's own default step size
        strategy = replace(strategy, server_lr=DEFAULT_SERVER_LR[server_optimizer.name])
    _require(server_optimizer.name != "flower_fedavg" or strategy.server_lr == 1, "strategy.server_lr",
             strategy.server_lr, "1 (or null) with server_optimizer=flower_fedavg: Flower's FedAvg takes the mean "
             "itself, with no step size")  # fmt: skip
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
        audit=_validate_audit(raw.get("audit") or {}, rules.audit_refusal),
        server_optimizer=server_optimizer,
        # Configs stored before the setting existed (checkpoints) resume with its default.
        max_empty_rounds=_top_int({"max_empty_rounds": 3, **raw}, "max_empty_rounds", 0),
        allow_virtual_deployment=_top_bool(raw, "allow_virtual_deployment", default=False),
    )


def _top_bool(raw: Mapping[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)  # configs stored before the setting existed (checkpoints) get its default
    _require(isinstance(value, bool), key, value, "true or false")
    return bool(value)


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


#: Top-level keys the noise key does not hash: where the run writes (a resume rewrites both to the run directory, and
#: must draw the noise it drew before), when a run with nobody training is stopped and whether a virtual population may
#: run against a real SuperLink (what it releases is the same).
NOISE_KEY_IGNORES: tuple[str, ...] = ("output_dir", "resume", "max_empty_rounds", "allow_virtual_deployment")


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


def flat_settings(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config's settings (a nested mapping such as :meth:`AppConfig.to_dict`) by dotted key."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flat_settings(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(given: AppConfig, stored: AppConfig) -> list[str]:
    """The settings (dotted keys) in which two configs differ, where the run writes and ``resume`` aside."""
    mine, theirs = flat_settings(given.to_dict()), flat_settings(stored.to_dict())
    return sorted(k for k in mine.keys() | theirs.keys()
                  if k.split(".")[0] not in ("resume", "output_dir") and mine.get(k) != theirs.get(k))  # fmt: skip
