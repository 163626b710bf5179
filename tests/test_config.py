"""Tests for fl_app/config/: the composed Hydra config, its validation (one ConfigError naming the key and the
allowed range), and the ``flwr run`` front door (run-config → Hydra overrides), which must not drift from
conf/config.yaml.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fl_app.config import (
    CONF_DIR,
    GROUP_KEYS,
    SCALAR_KEYS,
    AppConfig,
    ConfigError,
    StrategyConfig,
    compose_config,
    load_app_config,
    noise_stream_key,
    overrides_from_run_config,
    upgrade_stored_config,
    validate,
)
from fl_app.data.datasets import DATASETS
from strategies.blur import BlurSparseConfig
from strategies.dp_fedsam_topk import TopKConfig
from strategies.fed_smp import RandKConfig, SMPTopKConfig
from strategies.noisy import NoisyProxConfig
from strategies.registry import build_strategy, strategy_class

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (pytest depends on tomli there)
    import tomli as tomllib

PYPROJECT = CONF_DIR.parent / "pyproject.toml"
STRATEGIES = ("dp_fedavg", "dp_fedsam", "fedavg", "fedsam")


def run_config_defaults() -> dict:
    with PYPROJECT.open("rb") as fh:
        return dict(tomllib.load(fh)["tool"]["flwr"]["app"]["config"])


def hydra_group_defaults() -> dict[str, str]:
    """The group choices of conf/config.yaml's defaults list."""
    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))
    choices: dict[str, str] = {}
    for entry in raw["defaults"]:
        if isinstance(entry, dict):
            ((group, choice),) = entry.items()
            choices[group] = choice
    return choices


def raw_composed(overrides=()) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


# ----- defaults ---------------------------------------------------------------------------------------------------


def test_default_config_composes_and_validates():
    config = compose_config([])
    assert isinstance(config, AppConfig)
    assert config.strategy.name == "dp_fedsam"
    assert config.strategy.server_lr == 1.0
    assert config.dataset.name == "fashion_mnist"
    assert config.dataset.num_clients == 500
    assert config.model.name == "cnn"
    p = config.privacy
    assert p.clip_norm == 0.2
    assert p.noise_multiplier == 0.95
    assert p.sample_rate == 0.1
    assert p.sampling == "poisson"
    assert p.placement == "server"
    assert p.accountant == "rdp"
    assert p.delta == pytest.approx(1 / 500)
    assert p.max_epsilon is None and p.target_epsilon is None
    assert p.secure_noise == "auto"
    assert config.client.momentum == 0.5 and config.client.weight_decay == 5e-4 and config.client.rho == 0.05
    assert config.client.adaptive is False
    assert (config.seed, config.num_rounds, config.eval_every, config.population) == (0, 20, 1, "virtual")
    assert config.output_dir is None


def test_delta_defaults_to_one_over_population_and_can_be_set():
    assert compose_config(["dataset.num_clients=80"]).privacy.delta == pytest.approx(1 / 80)
    assert compose_config(["privacy.delta=1e-5"]).privacy.delta == 1e-5


def test_the_same_config_through_every_validation_entry():
    reference = compose_config([])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config")
    assert load_app_config(cfg) == reference
    raw = OmegaConf.to_container(cfg, resolve=True)
    assert validate(raw) == reference
    assert load_app_config(raw) == reference


@pytest.mark.parametrize("name", STRATEGIES)
def test_every_strategy_group_option_composes(name):
    config = compose_config([f"strategy={name}"])
    assert config.strategy.name == name
    assert strategy_class(name).config_name == name


@pytest.mark.parametrize(
    "overrides",
    [
        ["privacy.sample_rate=1"],
        ["privacy.noise_multiplier=0"],
        ["privacy.sampling=fixed"],  # q*M = 0.1 * 500 = 50
        ["privacy.sampling=fixed", "privacy.placement=client"],
        ["privacy.max_epsilon=8", "privacy.target_epsilon=4"],
        ["privacy.accountant=prv"],
        ["privacy.accountant=pld"],
        ["dataset=cifar10", "model=resnet18"],
    ],
)
def test_valid_edge_values_are_accepted(overrides):
    compose_config(overrides)


# ----- invalid values ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "key", "allowed"),
    [
        (["privacy.clip_norm=0"], "privacy.clip_norm", "C > 0"),
        (["privacy.clip_norm=-1"], "privacy.clip_norm", "C > 0"),
        (["privacy.clip_norm=nan"], "privacy.clip_norm", "finite"),
        (["privacy.clip_norm=true"], "privacy.clip_norm", "finite"),
        (["privacy.noise_multiplier=-0.1"], "privacy.noise_multiplier", "sigma >= 0"),
        (["privacy.noise_multiplier=nan"], "privacy.noise_multiplier", "finite"),
        (["privacy.noise_multiplier=inf"], "privacy.noise_multiplier", "finite"),
        (["privacy.sample_rate=0"], "privacy.sample_rate", "(0, 1]"),
        (["privacy.sample_rate=1.5"], "privacy.sample_rate", "(0, 1]"),
        (["privacy.sample_rate=nan"], "privacy.sample_rate", "finite"),
        (["privacy.delta=2"], "privacy.delta", "(0, 1)"),
        (["privacy.delta=0"], "privacy.delta", "(0, 1)"),
        (["privacy.delta=nan"], "privacy.delta", "(0, 1)"),
        (["privacy.sampling=fixed", "privacy.sample_rate=0.013"], "privacy.sample_rate", "whole number"),
        (["privacy.sampling=fixed", "privacy.sample_rate=0.001"], "privacy.sample_rate", "whole number >= 1"),
        (["privacy.sampling=uniform"], "privacy.sampling", "poisson, fixed"),
        (["privacy.placement=both"], "privacy.placement", "client, server"),
        (["privacy.accountant=gdp"], "privacy.accountant", "rdp, prv, pld"),
        (["privacy.max_epsilon=0"], "privacy.max_epsilon", "> 0"),
        (["privacy.target_epsilon=-1"], "privacy.target_epsilon", "> 0"),
        (["privacy.secure_noise=maybe"], "privacy.secure_noise", "auto, true or false"),
        (["privacy.noise_stream=per_client"], "privacy.noise_stream", "one of shared, per_run"),
        (["audit=canaries", "audit.guess_rule=both"], "audit.guess_rule", "one_sided, two_sided"),
        (["client.lr=0"], "client.lr", "> 0"),
        (["client.lr=nan"], "client.lr", "finite"),
        (["client.momentum=1"], "client.momentum", "[0, 1)"),
        (["client.lr_decay=0"], "client.lr_decay", "(0, 1]"),
        (["client.rho=-0.1"], "client.rho", ">= 0"),
        (["client.local_epochs=0"], "client.local_epochs", ">= 1"),
        (["client.batch_size=1.5"], "client.batch_size", "integer"),
        (["dataset.alpha=0"], "dataset.alpha", "> 0"),
        (["dataset.alpha=nan"], "dataset.alpha", "finite"),
        (["dataset.num_clients=0"], "dataset.num_clients", "integer >= 1"),
        (["dataset.name=foo"], "dataset.name", "fashion_mnist, emnist, cifar10, cifar100"),
        (["dataset.partition=foo"], "dataset.partition", "dirichlet"),
        (["model.name=foo"], "model.name", "cnn, resnet18"),
        (["strategy.server_lr=0"], "strategy.server_lr", "> 0"),
        (["strategy.name=foo"], "strategy.name", "a registered strategy (dp_fedavg, "),
        (["simulation.client_gpus=2"], "simulation.client_gpus", "[0, 1]"),
        (["simulation.device=tpu"], "simulation.device", "auto, cpu, cuda"),
        (["num_rounds=0"], "num_rounds", "integer >= 1"),
        (["eval_every=0"], "eval_every", "integer >= 1"),
        (["seed=-1"], "seed", "integer >= 0"),
        (["population=all"], "population", "virtual, nodes"),
        (["round_timeout=0"], "round_timeout", "> 0"),
    ],
)
def test_invalid_value_names_key_and_allowed_range(overrides, key, allowed):
    with pytest.raises(ConfigError) as info:
        compose_config(overrides)
    message = str(info.value)
    assert f"{key}=" in message
    assert allowed in message


def test_client_placement_with_poisson_sampling_is_rejected():
    with pytest.raises(ConfigError) as info:
        compose_config(["privacy.placement=client"])
    message = str(info.value)
    assert "privacy.placement" in message and "sampling=fixed" in message


def test_unknown_strategy_lists_the_available_ones():
    with pytest.raises(ConfigError) as info:
        compose_config(["strategy=nonexistent"])
    message = str(info.value)
    assert "strategy" in message and "nonexistent" in message
    for name in STRATEGIES:
        assert name in message


@pytest.mark.parametrize(
    ("override", "key", "known"),
    [
        ("+privacy.foo=1", "privacy.foo", "clip_norm"),
        ("+client.bar=2", "client.bar", "lr"),
        ("+dataset.baz=3", "dataset.baz", "num_clients"),
        ("+foo=1", "foo", "num_rounds"),
        ("privacy.foo=1", "privacy.foo", None),  # without '+': Hydra refuses to add the key
    ],
)
def test_unknown_key_is_rejected(override, key, known):
    with pytest.raises(ConfigError) as info:
        compose_config([override])
    message = str(info.value)
    assert key in message
    if known is not None:
        assert "unknown config key" in message and known in message


@pytest.mark.parametrize(
    ("override", "fix"),
    [("privacy.clip_nrom=1", "did you mean privacy.clip_norm"), ("num_round=3", "did you mean num_rounds"),
     ("client.learning_rate=0.1", "unknown setting client.learning_rate"),
     ("strategy=dp_fedsmm", "the options are dp_fedavg"), ("server_optimizer=adma", "adam")],
)  # fmt: skip
def test_a_misspelt_key_or_choice_is_named_with_its_fix_instead_of_hydras_plus_advice(override, fix):
    with pytest.raises(ConfigError) as info:
        compose_config([override])
    assert fix in str(info.value) and "+" not in str(info.value)


def test_every_key_of_every_composed_config_is_known():
    """No false alarm: each key the default config, each strategy and each experiment compose is known."""
    from fl_app.config.known_keys import check_override_keys, known_keys
    from fl_app.config.overrides import CONF_DIR

    def dotted(tree, prefix=""):
        for key, value in tree.items():
            yield f"{prefix}{key}"
            if isinstance(value, dict):
                yield from dotted(value, f"{prefix}{key}.")

    composed = [raw_composed([f"strategy={name}"]) for name in STRATEGIES]
    composed += [raw_composed([f"+experiment={path.stem}"]) for path in sorted((CONF_DIR / "experiment").glob("*"))]
    keys = {key for raw in composed for key in dotted(raw)}
    assert keys - known_keys(CONF_DIR) == set()
    check_override_keys([f"{key}=1" for key in sorted(keys) if not (CONF_DIR / key).is_dir()], CONF_DIR)


def test_missing_group_is_rejected():
    raw = raw_composed()
    del raw["privacy"]
    with pytest.raises(ConfigError, match="privacy"):
        validate(raw)


@pytest.mark.parametrize("accountant", ["prv", "pld"])
def test_fixed_sampling_with_unsupported_accountant_fails_at_validation(accountant):
    overrides = ["privacy.sampling=fixed", f"privacy.accountant={accountant}"]
    try:
        config = compose_config(overrides)
    except ConfigError as exc:
        assert "privacy.accountant" in str(exc)
        return
    # If validation accepts it, the run must be able to start with it.
    build_strategy(config)


@pytest.mark.parametrize(
    ("dataset", "model"),
    [("fashion_mnist", "cnn"), ("emnist", "cnn"), ("fashion_mnist", "resnet18"), ("cifar10", "resnet18")],
)
def test_validated_dataset_model_pair_is_runnable(dataset, model):
    _check_model_accepts_dataset(dataset, model)


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_cnn_on_cifar_is_rejected_or_runnable(dataset):
    _check_model_accepts_dataset(dataset, "cnn")


def _check_model_accepts_dataset(dataset: str, model: str) -> None:
    """A config that validates must be runnable: the client's model takes a batch of the dataset's images."""
    from clients.local_update import _model

    try:
        config = compose_config([f"dataset={dataset}", f"model={model}"])
    except ConfigError as exc:
        assert "model" in str(exc)
        return
    info = DATASETS[config.dataset.name]
    net = _model(config.model.name, config.dataset.name, "cpu")
    with torch.no_grad():
        out = net(torch.zeros(2, info.in_channels, info.image_size, info.image_size))
    assert tuple(out.shape) == (2, info.num_classes)


# ----- the flwr run front door ----------------------------------------------------------------------------------


def test_overrides_from_run_config_maps_groups_scalars_and_overrides():
    run_config = {
        "overrides": "privacy.clip_norm=0.5 dataset.alpha=0.3",
        "num_rounds": 5,
        "strategy": "dp_fedavg",
        "seed": 3,
        "privacy": "default",
        "round_timeout": 60.0,
        "output_dir": "",
    }
    overrides = overrides_from_run_config(run_config)
    assert overrides == [
        "strategy=dp_fedavg",
        "privacy=default",
        "seed=3",
        "num_rounds=5",
        "round_timeout=60.0",
        "privacy.clip_norm=0.5",
        "dataset.alpha=0.3",
    ]
    config = compose_config(overrides)
    assert config.strategy.name == "dp_fedavg"
    assert (config.seed, config.num_rounds, config.round_timeout) == (3, 5, 60.0)
    assert config.privacy.clip_norm == 0.5
    assert config.dataset.alpha == 0.3
    assert config.output_dir is None


def test_run_config_output_dir_and_empty_mapping():
    assert overrides_from_run_config({}) == []
    assert overrides_from_run_config({"output_dir": "runs/x"}) == ["output_dir=runs/x"]
    assert compose_config(overrides_from_run_config({"output_dir": "runs/x"})).output_dir == "runs/x"


def test_unknown_run_config_key_is_rejected():
    with pytest.raises(ConfigError, match="clip_norm"):
        overrides_from_run_config({"strategy": "fedavg", "clip_norm": 0.5})


def test_run_config_overrides_must_be_a_string():
    with pytest.raises(ConfigError, match="overrides"):
        overrides_from_run_config({"overrides": 5})


def test_invalid_value_through_the_run_config_is_rejected():
    with pytest.raises(ConfigError, match="num_rounds=0"):
        compose_config(overrides_from_run_config({"num_rounds": 0}))
    with pytest.raises(ConfigError, match=r"privacy\.clip_norm"):
        compose_config(overrides_from_run_config({"overrides": "privacy.clip_norm=-1"}))


def test_pyproject_run_config_keys_are_exactly_the_front_door_keys():
    assert set(run_config_defaults()) == set(GROUP_KEYS) | set(SCALAR_KEYS) | {"overrides", "output_dir"}


def test_pyproject_group_choices_equal_the_hydra_defaults_list():
    defaults = run_config_defaults()
    groups = hydra_group_defaults()
    assert set(groups) == set(GROUP_KEYS)
    assert {key: defaults[key] for key in GROUP_KEYS} == groups


def test_pyproject_scalars_equal_the_hydra_defaults():
    defaults = run_config_defaults()
    raw_yaml = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))
    composed = compose_config([])
    for key in SCALAR_KEYS:
        value = defaults[key]
        assert value == raw_yaml[key], key
        assert value == getattr(composed, key), key
        assert type(value) is type(getattr(composed, key)), key
    assert defaults["overrides"] == ""
    assert defaults["output_dir"] == "" and raw_yaml["output_dir"] is None


def test_composing_from_pyproject_defaults_gives_the_default_config():
    from_pyproject = compose_config(overrides_from_run_config(run_config_defaults()))
    assert from_pyproject == compose_config([])
    # Not vacuous: every field compared, including floats that must not be NaN.
    for field in dataclasses.fields(from_pyproject.privacy):
        value = getattr(from_pyproject.privacy, field.name)
        assert not (isinstance(value, float) and math.isnan(value))


def test_to_raw_round_trips_through_validate():
    from fl_app.config import validate

    for overrides in ([], ["strategy=noisy_fedprox", "dataset.max_train_samples=100"], ["strategy=fed_smp_topk"]):
        config = compose_config(overrides)
        assert validate(config.to_raw()) == config


# ----- strategy settings: one class per strategy, each validating its own fields ----------------------------------


@pytest.mark.parametrize(
    ("name", "settings", "fields"),
    [
        ("dp_fedavg", StrategyConfig, {"server_lr"}),
        ("dp_fedsam_topk", TopKConfig, {"server_lr", "sparsity", "mask_source"}),
        ("fed_smp_randk", RandKConfig, {"server_lr", "sparsity", "rescale"}),
        ("fed_smp_topk", SMPTopKConfig, {"server_lr", "sparsity", "mask_source"}),
        ("dp_fedavg_blurs", BlurSparseConfig, {"server_lr", "blur_coef", "sparsity"}),
        (
            "noisy_fedprox",
            NoisyProxConfig,
            {
                "server_lr",
                "local_steps",
                "noisy_lr",
                "lr_schedule",
                "grad_clip",
                "noise_std",
                "smoothness",
                "prox_coef",
            },
        ),
    ],
)
def test_each_strategy_is_validated_for_its_own_settings_only(name: str, settings: type, fields: set[str]) -> None:
    config = compose_config([f"strategy={name}"])
    assert type(config.strategy) is settings
    assert {f.name for f in dataclasses.fields(settings)} - {"name"} == fields
    # A setting of another strategy is an unknown key here (it would be silently ignored otherwise).
    foreign = "+strategy.noise_std=0.1" if "noise_std" not in fields else "+strategy.sparsity=0.5"
    with pytest.raises(ConfigError, match="unknown"):
        compose_config([f"strategy={name}", foreign])


def test_a_stored_config_with_every_strategy_s_flat_settings_still_validates() -> None:
    """Checkpoints written while every strategy carried every setting resume: the foreign ones were never read."""
    config = compose_config(["strategy=fed_smp_topk", "strategy.mask_source=global"])
    raw = config.to_raw()
    legacy = {**raw, "strategy": {**raw["strategy"], "blur_coef": 1.0, "noise_std": 0.01, "rescale": True,
                                  "lr_schedule": "constant", "local_steps": 10}}  # fmt: skip
    with pytest.raises(ConfigError, match="unknown"):
        validate(legacy)
    assert validate(upgrade_stored_config(legacy)) == config
    assert upgrade_stored_config(raw) == raw


@pytest.mark.parametrize("key", ["_target_", "target"])
def test_a_stored_config_naming_its_strategy_class_validates_by_its_name(key: str) -> None:
    """Checkpoints (``_target_``) and run.json files (``target``) written before strategies were registered by name
    carry the class path beside the name: it is dropped, the name decides; a config of today carrying it is refused."""
    config = compose_config(["strategy=dp_fedavg_blur"])
    raw = config.to_raw()
    stored = {**raw, "strategy": {**raw["strategy"], key: "strategies.blur.DPFedAvgBLUR"}}
    with pytest.raises(ConfigError, match=f"unknown config key.*strategy.{key}"):
        validate(stored)
    assert validate(upgrade_stored_config(stored)) == config


# ----- privacy.noise_stream: the run's noise key --------------------------------------------------------------------


def test_noise_stream_defaults_to_shared_and_a_stored_config_without_it_is_shared() -> None:
    config = compose_config([])
    assert config.privacy.noise_stream == "shared" and noise_stream_key(config) is None
    raw = config.to_raw()
    del raw["privacy"]["noise_stream"]  # a checkpoint written before the key existed drew the shared streams
    assert validate(raw) == config
    per_run = compose_config(["privacy.noise_stream=per_run"])
    assert validate(per_run.to_raw()) == per_run


def test_noise_key_is_a_pure_function_of_the_config_less_where_the_run_writes() -> None:
    base = ["privacy.noise_stream=per_run"]
    key = noise_stream_key(compose_config(base))
    assert isinstance(key, int) and 0 <= key < 2**63  # a word of numpy's SeedSequence, an int64 on the wire
    assert noise_stream_key(compose_config(base)) == key
    # A resume rewrites resume and output_dir to the run directory: the same noise again.
    assert noise_stream_key(compose_config([*base, "output_dir=/tmp/a", "resume=/tmp/a"])) == key
    others = [
        ["strategy=dp_fedavg"],
        ["privacy.clip_norm=0.5"],
        ["privacy.noise_multiplier=1.1"],
        ["num_rounds=21"],
        ["seed=1"],
        ["dataset.alpha=0.3"],
    ]
    keys = {noise_stream_key(compose_config([*base, *o])) for o in others}
    assert len(keys) == len(others) and key not in keys


def test_noise_stream_reaches_the_flwr_run_front_door() -> None:
    overrides = overrides_from_run_config({"overrides": "privacy.noise_stream=per_run"})
    assert compose_config(overrides).privacy.noise_stream == "per_run"


@pytest.mark.parametrize(
    ("overrides", "server_lr"),
    [
        ([], 1.0),  # FedAvg's server step: eta = 1 is FedAvg itself
        (["server_optimizer=momentum"], 1.0),
        (["server_optimizer=adagrad"], 0.1),
        (["server_optimizer=adam"], 0.01),  # an adaptive step of 1 moves every coordinate by ~1 a round: diverges
        (["server_optimizer=yogi"], 0.01),
        (["server_optimizer=adam", "strategy.server_lr=0.5"], 0.5),  # a value given is kept
        (["strategy=dp_ftrl_fedsam", "server_optimizer=momentum"], 1.0),
    ],
)
def test_the_server_learning_rate_defaults_to_the_optimizers_own(overrides: list[str], server_lr: float) -> None:
    assert compose_config(overrides).strategy.server_lr == server_lr


def test_a_server_learning_rate_must_be_positive_or_null() -> None:
    with pytest.raises(ConfigError, match=r"strategy\.server_lr"):
        compose_config(["strategy.server_lr=0"])


@pytest.mark.parametrize(
    ("override", "federation_key"),
    [("simulation.client_gpus=1", "client-resources-num-gpus"),
     ("simulation.client_cpus=2", "client-resources-num-cpus"),
     ("simulation.total_cpus=4", "init-args-num-cpus"),
     ("simulation.ray_address=auto", "RAY_ADDRESS")],
)  # fmt: skip
def test_flwr_run_refuses_the_hydra_engines_settings_it_would_ignore(override: str, federation_key: str) -> None:
    """Under flwr run the engine is Flower's (--federation-config): these settings would be ignored silently."""
    with pytest.raises(ConfigError, match=federation_key):
        overrides_from_run_config({"overrides": f"num_rounds=2 {override}"})
    assert overrides_from_run_config({"overrides": "simulation.cohort_size=1"}) == ["simulation.cohort_size=1"]
