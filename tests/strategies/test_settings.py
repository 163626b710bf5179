"""strategies/settings.py: every environment-dependent ``auto`` resolved by one rule, for simulation and deployment."""

from __future__ import annotations

import pytest

from fl_app.config import ConfigError, compose_config
from strategies.settings import RunSettings, is_simulation
from tests.helpers import FakeGrid, build


def _resolve(simulation: bool, *overrides: str) -> RunSettings:
    """The settings of a run of ``overrides``; deployed, the default virtual population is allowed (its own rule is
    :func:`test_a_virtual_population_against_a_real_superlink_is_refused_unless_allowed`)."""
    if not simulation and not any(o.startswith(("population=", "allow_virtual_deployment=")) for o in overrides):
        overrides = (*overrides, "allow_virtual_deployment=true")
    return RunSettings.resolve(compose_config(list(overrides)), simulation)


@pytest.mark.parametrize(
    ("simulation", "overrides", "expected"),
    [
        # auto: seeded, raw and one cohort per node in simulation; CSPRNG, none and one message per client deployed
        (True, (), (True, False, "raw", "per_node")),
        (False, (), (False, True, "none", 1)),
        # explicit values are kept wherever the run happens
        (True, ("privacy.secure_noise=true", "privacy.client_statistics=noisy", "simulation.cohort_size=4"),
         (True, True, "noisy", 4)),
        (False, ("privacy.client_statistics=raw", "simulation.cohort_size=3"), (False, True, "raw", 3)),
        (False, ("privacy.secure_noise=false", "privacy.allow_seeded_deployment=true"), (False, False, "none", 1)),
        # one client per SuperNode: nothing to group, in simulation too
        (True, ("population=nodes",), (True, False, "raw", 1)),
    ],
)  # fmt: skip
def test_each_auto_setting_resolves_by_its_rule(simulation, overrides, expected) -> None:
    settings = _resolve(simulation, *overrides)
    assert (settings.simulation, settings.secure_noise, settings.client_statistics, settings.cohort_size) == expected


def test_seeded_randomness_against_a_real_superlink_is_refused_unless_allowed() -> None:
    with pytest.raises(ConfigError, match="allow_seeded_deployment"):
        _resolve(False, "privacy.secure_noise=false")
    assert not _resolve(True, "privacy.secure_noise=false").secure_noise  # the simulation's seed stays on the server


def test_a_virtual_population_against_a_real_superlink_is_refused_unless_allowed() -> None:
    with pytest.raises(ConfigError, match="population=virtual against a real SuperLink"):
        _resolve(False, "allow_virtual_deployment=false")
    assert _resolve(False, "allow_virtual_deployment=true").cohort_size == 1
    assert _resolve(False, "population=nodes").cohort_size == 1  # one client per SuperNode needs no allowance
    assert _resolve(True, "allow_virtual_deployment=false").cohort_size == "per_node"  # the simulation's workers


def test_the_first_resolution_decides_for_the_strategy() -> None:
    strategy = build("strategy=dp_fedavg", "privacy.secure_noise=auto", "privacy.client_statistics=auto")
    strategy.resolve_settings(simulation=False)
    strategy.resolve_settings(simulation=True)  # start() on the same grid again: nothing changes
    assert strategy.run_settings == _resolve(False, "strategy=dp_fedavg")
    assert strategy.randomness.secure and strategy.statistics.mode == "none" and strategy.cohort_size == 1


def test_a_grid_without_simulation_run_details_is_a_real_superlink() -> None:
    assert not is_simulation(FakeGrid())  # the engine's grids are the integration tests' (tests/integration/)
