"""``privacy.placement=distributed`` and ``privacy.distributed`` (fl_app/config/distributed.py): the preset, the
threshold, and every refusal, before any worker starts."""

from __future__ import annotations

import pytest

import strategies  # noqa: F401 - registers the strategies the config checks
from fl_app.config import ConfigError, compose_config
from fl_app.config.distributed import DistributedConfig


def test_the_preset_sets_placement_and_settings() -> None:
    config = compose_config(["privacy=distributed", "privacy.distributed.bits=20", "privacy.distributed.threshold=0.8"])
    assert config.privacy.placement == "distributed"
    assert config.privacy.client_statistics == "none"
    assert config.privacy.distributed == DistributedConfig(bits=20, threshold=0.8)


def test_the_settings_may_be_left_out() -> None:
    config = compose_config(["privacy.placement=distributed", "privacy.client_statistics=none"])
    assert config.privacy.distributed == DistributedConfig()


@pytest.mark.parametrize(("threshold", "m", "expected"), [(None, 10, 6), (None, 3, 2), (0.8, 10, 8), (5, 10, 5)])
def test_the_threshold(threshold: int | float | None, m: float, expected: int) -> None:
    assert DistributedConfig(threshold=threshold).resolved_threshold(m) == expected


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["privacy.sampling=fixed"], "privacy.sampling"),
        (["privacy.clipping=adaptive"], "privacy.clipping"),
        (["privacy.client_statistics=raw"], "privacy.client_statistics"),
        (["privacy.accountant=prv"], "privacy.accountant"),
        (["simulation.cohort_size=5"], "simulation.cohort_size"),
        (["privacy.distributed.bits=40"], "privacy.distributed.bits"),
        (["privacy.distributed.threshold=1"], "privacy.distributed.threshold"),
        (["privacy.distributed.neighbours=1"], "privacy.distributed.neighbours"),
        (["privacy.distributed.neighbours=4"], "privacy.distributed.neighbours"),  # t = 26 of m = 50 needs more
        (["privacy.distributed.neighbours=4", "privacy.distributed.threshold=6"], "privacy.distributed.threshold"),
        (["privacy.distributed.threshold=600"], "privacy.distributed.threshold"),  # M = 500
        (["strategy=fedavg"], "privacy.placement"),
        (["strategy=fedsam"], "privacy.placement"),
        (["privacy.distributed.rounding_beta=1.0"], "privacy.distributed.rounding_beta"),
        (["+privacy.distributed.modulus=7"], "privacy.distributed.modulus"),
        (["privacy.placement=server"], "privacy.distributed"),
        (["strategy=dp_fedsam_topk"], "privacy.placement"),
        (["strategy=fed_smp_randk"], "privacy.placement"),
        (["strategy=noisy_fedavg"], "privacy.placement"),
        (["strategy=dp_ftrl_fedavg"], "privacy.sampling"),  # its participation rule is not Poisson sampling
    ],
)
def test_what_distributed_dp_refuses(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        compose_config(["privacy=distributed", *overrides])


@pytest.mark.parametrize("strategy", ["dp_fedavg", "dp_fedsam", "dp_fedavg_blur", "dp_fedavg_blurs"])
def test_the_dense_client_level_dp_strategies_run_under_it(strategy: str) -> None:
    assert compose_config(["privacy=distributed", f"strategy={strategy}"]).privacy.placement == "distributed"
