"""strategies/registry.py: every ``strategy=<name>`` is the class registered under it; a strategy of one's own is
registered by name and runs from a config; the config package finds strategies by name and never imports them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fl_app.config import CONF_DIR, ConfigError, StrategyConfig, compose_config, registered_strategy_names
from strategies import DPFedSAM
from strategies.base import FederatedStrategy
from strategies.registry import PROJECT_STRATEGIES, build_strategy, register_strategy, strategy_class

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["dataset.num_clients=20", "dataset.max_train_samples=400", "dataset.max_test_samples=100"]
YAML_NAMES = sorted(path.stem for path in (Path(CONF_DIR) / "strategy").glob("*.yaml"))


def test_each_conf_strategy_is_one_registered_class_and_each_project_class_has_its_conf() -> None:
    for name in YAML_NAMES:
        conf = yaml.safe_load((Path(CONF_DIR) / "strategy" / f"{name}.yaml").read_text())
        assert conf["name"] == name and strategy_class(name).config_name == name
    assert sorted(cls.config_name for cls in PROJECT_STRATEGIES) == YAML_NAMES
    assert set(YAML_NAMES) <= set(registered_strategy_names())


def test_an_unregistered_name_is_refused_with_the_registered_ones() -> None:
    with pytest.raises(ConfigError, match=r"strategy.name='dp_fedsma'.*registered strategy \(dp_fedavg, .*dp_fedsam,"):
        compose_config(["strategy.name=dp_fedsma"])
    with pytest.raises(ConfigError, match=r"strategy\.name='nope'"):
        strategy_class("nope")


class SmallerServerSteps(DPFedSAM):
    """A user's strategy: DP-FedSAM's rounds under a name of its own."""

    config_name = "test_registry_dp_fedsam_variant"


def test_a_strategy_of_ones_own_is_registered_by_name_and_built_from_a_config() -> None:
    assert register_strategy(SmallerServerSteps) is SmallerServerSteps
    assert register_strategy(SmallerServerSteps) is SmallerServerSteps  # again: nothing changes
    config = compose_config(["strategy=dp_fedsam", f"strategy.name={SmallerServerSteps.config_name}", *SMALL])
    assert type(config.strategy) is StrategyConfig
    strategy = build_strategy(config)
    assert type(strategy) is SmallerServerSteps and strategy.local_optimizer == "sam"


def test_a_name_another_class_holds_and_a_class_that_is_no_strategy_are_refused() -> None:
    class Impostor(FederatedStrategy):
        config_name = "dp_fedsam"

    class Nameless(FederatedStrategy):
        pass

    with pytest.raises(ValueError, match=r"'dp_fedsam' is strategies.dp_fedsam.DPFedSAM's"):
        register_strategy(Impostor)
    with pytest.raises(ValueError, match="no config_name"):
        register_strategy(Nameless)
    with pytest.raises(ValueError, match="not a subclass"):
        register_strategy(dict)  # type: ignore[type-var]
    assert strategy_class("dp_fedsam") is DPFedSAM


def test_the_config_package_validates_by_name_without_importing_strategies() -> None:
    """In a fresh interpreter: fl_app.config alone loads no strategy module and refuses a config whose strategy
    nobody registered, saying how to register it; importing strategies registers them."""
    code = (
        "import sys\n"
        "from fl_app.config import ConfigError, compose_config\n"
        "try:\n"
        "    compose_config([])\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'strategies'], 'strategies imported'\n"
        "import strategies\n"
        "print(compose_config([]).strategy.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    refused, built = done.stdout.strip().splitlines()
    assert "strategy.name='dp_fedsam'" in refused and "importing strategies registers" in refused
    assert built == "dp_fedsam"
