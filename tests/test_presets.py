"""The Hydra presets of conf/experiment, conf/scale, conf/split and conf/launcher compose into valid configs, and
the simulation's CPU share reaches Ray and the worker count."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import strategies  # noqa: F401  (registers the strategy names the configs here are validated by)
from apps.main import backend_config, simulation_nodes
from fl_app.config import ConfigError, compose_config

CONF = Path(__file__).resolve().parents[1] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def _sweep_params(experiment: str) -> dict[str, str]:
    return yaml.safe_load((CONF / "experiment" / f"{experiment}.yaml").read_text())["hydra"]["sweeper"]["params"]


def _first_job(experiment: str) -> list[str]:
    """The overrides of the sweep's first job (the first value of every swept key)."""
    return [f"{key}={str(values).split(',')[0]}" for key, values in _sweep_params(experiment).items()]


def test_every_table_and_ablation_has_a_preset() -> None:
    assert {"table1", "table2", "table3", "table4"} <= set(EXPERIMENTS)
    assert {"ablation_rho", "ablation_epochs", "ablation_clients"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("scale", ["cpu", "paper"])
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_preset_composes_at_both_scales(experiment: str, scale: str) -> None:
    config = compose_config([f"+experiment={experiment}", f"+scale={scale}", *_first_job(experiment)])
    assert config.dataset.name == "fashion_mnist"
    if scale == "paper":  # conf/scale/paper.yaml (the ablations sweep some of these)
        assert (config.dataset.num_clients, config.num_rounds, config.client.adaptive) == (500, 200, True)
        if experiment.startswith("table"):
            assert (config.privacy.sample_rate, config.client.local_epochs, config.client.rho) == (0.1, 30, 0.5)
    else:
        assert config.num_rounds <= 20 and config.dataset.max_train_samples is not None


def test_table_sweeps_cover_the_papers_axes_with_three_seeds() -> None:
    for experiment in EXPERIMENTS:
        assert _sweep_params(experiment)["seed"] == "0,1,2"
    assert _sweep_params("table1")["+split"] == "dir03,dir06,iid"
    assert _sweep_params("table2")["privacy.target_epsilon"] == "4,6,8,10"
    assert _sweep_params("table3")["strategy.sparsity"] == "0.1,0.2,0.4,0.6,0.8,1.0"


@pytest.mark.parametrize(("split", "partition", "alpha"), [("dir03", "dirichlet", 0.3), ("dir06", "dirichlet", 0.6)])
def test_split_presets_set_partition_and_alpha(split: str, partition: str, alpha: float) -> None:
    config = compose_config([f"+split={split}"])
    assert (config.dataset.partition, config.dataset.alpha) == (partition, alpha)
    assert compose_config(["+split=iid"]).dataset.partition == "iid"


def test_parallel_launcher_limits_each_simulation_to_its_cpu_share() -> None:
    config = compose_config(["+launcher=parallel"])
    assert config.simulation.total_cpus == 1
    assert backend_config(config)["init_args"]["num_cpus"] == 1
    assert simulation_nodes(config) == 1


def test_default_simulation_uses_every_core_and_no_ray_cpu_cap() -> None:
    config = compose_config([])
    assert config.simulation.total_cpus is None
    assert "num_cpus" not in backend_config(config)["init_args"]


@pytest.mark.parametrize("override", ["simulation.total_cpus=0", "simulation.total_cpus=1 simulation.client_cpus=2"])
def test_invalid_cpu_share_is_rejected(override: str) -> None:
    with pytest.raises(ConfigError, match="simulation"):
        compose_config(override.split())
