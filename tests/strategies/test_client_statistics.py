"""What the published files say about clients (``privacy.client_statistics``): raw, noisy (one
Gaussian release of the clipped count, accounted jointly with the update) or none."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import ArrayRecord

from fl_app.config import ConfigError
from fl_app.metrics import CLIENT_COUNTS, OPERATOR_FILE, MetricsWriter, read_metrics
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.accountants import calibrate_noise_multiplier, compute_epsilon
from strategies.statistics import CLIENT_DERIVED
from tests.helpers import FakeGrid, build, error_reply, prime, reply, with_norm, zeros

SHAPES = [(4, 5), (5,)]
POP = ("strategy=dp_fedavg", "dataset.num_clients=50", "privacy.sample_rate=0.2")


def _stats(strategy, norms=(0.1, 0.5, 1.0, 0.05)):
    plan = prime(strategy, zeros(SHAPES), sampled=len(norms) + 1)
    replies = [reply(i, with_norm(SHAPES, n, seed=i)) for i, n in enumerate(norms)]
    return strategy.aggregator.aggregate(plan, [*replies, error_reply(len(norms))]).stats


@pytest.mark.parametrize("mode", ["none", "noisy"])
def test_none_and_noisy_publish_no_client_derived_value_and_no_count_of_clients(mode):
    strategy = build(*POP, f"privacy.client_statistics={mode}")
    stats = _stats(strategy)
    assert stats["aggregated"] == 4 and stats["failed"] == 1  # what the round knows...
    published = strategy.aggregator.published_statistics(1, stats)
    assert not set(CLIENT_DERIVED) & set(published)
    assert not set(CLIENT_COUNTS) & set(published)  # ...is not published: the batch size is secret under Poisson
    assert "no count of clients" in strategy.dp_guarantee()["client_statistics"]


@pytest.mark.parametrize("mode", ["none", "noisy"])
def test_counts_go_only_to_the_operators_record(tmp_path, mode, caplog):
    metrics = MetricsWriter(tmp_path, 2, progress=False)
    strategy = build(*POP, f"privacy.client_statistics={mode}", metrics=metrics)
    with caplog.at_level(logging.INFO):
        strategy.start(FakeGrid("errors"), ArrayRecord(zeros(SHAPES)), num_rounds=2)
    metrics.close()
    published = read_metrics(tmp_path / "metrics.jsonl")
    operator = read_metrics(tmp_path / OPERATOR_FILE)
    assert [r["round"] for r in published] == [r["round"] for r in operator] == [1, 2]
    for record, counts in zip(published, operator, strict=True):
        assert not (set(CLIENT_COUNTS) | set(CLIENT_DERIVED)) & set(record)
        assert set(counts) == {"round", *CLIENT_COUNTS}
        assert counts["failed"] == counts["sampled"] > 0 and counts["aggregated"] == 0  # every client errs
    # The logs are published: no rejection line (each would count a client), no progress "clients a/s".
    assert "rejected" not in caplog.text.replace("answering and rejected clients go only to", "")
    assert "clients 0/" not in caplog.text


def test_raw_publishes_counts_and_writes_no_operator_record(tmp_path):
    metrics = MetricsWriter(tmp_path, 1, progress=False)
    strategy = build(*POP, "privacy.client_statistics=raw", metrics=metrics)
    strategy.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=1)
    metrics.close()
    assert set(CLIENT_COUNTS) <= set(read_metrics(tmp_path / "metrics.jsonl")[0])
    assert not (tmp_path / OPERATOR_FILE).exists()
    assert "counts of sampled, answering and rejected clients" in strategy.dp_guarantee()["client_statistics"]


def test_raw_publishes_everything_and_says_it_is_not_covered():
    strategy = build(*POP, "privacy.client_statistics=raw")
    stats = _stats(strategy)
    assert strategy.aggregator.published_statistics(1, stats) == stats
    assert stats["client_norms"] == pytest.approx([0.1, 0.5, 1.0, 0.05], rel=1e-5)
    assert "epsilon does not cover" in strategy.dp_guarantee()["client_statistics"]


def test_noisy_releases_the_clipped_fraction_with_sigma_s_over_m():
    strategy = build(*POP, "privacy.client_statistics=noisy", "privacy.statistics_noise_multiplier=2.0")
    stats = _stats(strategy)  # C = 0.2: two of the four norms are clipped
    aggregator = strategy.aggregator
    draws = np.array([aggregator.published_statistics(t, stats)["fraction_clipped_noisy"] for t in range(1, 4001)])
    m = strategy.expected_clients
    assert abs(draws.mean() - 2 / m) < 5 * (2.0 / m) / math.sqrt(len(draws))
    assert draws.std() == pytest.approx(2.0 / m, rel=0.05)  # std of the estimate of a std from 4000 draws: ~1.1%
    assert not set(CLIENT_DERIVED) & set(strategy.aggregator.published_statistics(1, stats))


def test_noisy_statistics_are_accounted_jointly():
    sigma, sigma_s, q, delta = 0.95, 2.5, 0.2, 1 / 50
    strategy = build(*POP, "privacy.client_statistics=noisy", f"privacy.statistics_noise_multiplier={sigma_s}")
    joint = (sigma**-2 + sigma_s**-2) ** -0.5
    assert strategy.account.accounted_noise_multiplier == pytest.approx(joint, rel=1e-12)
    strategy.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=3)
    assert strategy.epsilon() == pytest.approx(compute_epsilon(joint, q, 3, delta), rel=1e-9)
    assert strategy.epsilon() > compute_epsilon(sigma, q, 3, delta)  # the extra release costs privacy
    # The default sigma_s is m / 20 (Andrew et al.).
    assert build(*POP, "privacy.client_statistics=noisy").statistics.noise_multiplier == pytest.approx(10 / 20)


def test_target_epsilon_calibrates_the_joint_multiplier():
    target, sigma_s = 4.0, 3.0
    strategy = build(*POP, "num_rounds=20", f"privacy.target_epsilon={target}", "privacy.client_statistics=noisy",
                     f"privacy.statistics_noise_multiplier={sigma_s}")  # fmt: skip
    joint = calibrate_noise_multiplier(target, 1 / 50, 0.2, 20, accountant="rdp", sampling="poisson", population=50)
    assert strategy.account.accounted_noise_multiplier == pytest.approx(joint, rel=1e-9)
    assert strategy.noise_multiplier == pytest.approx(mech.update_noise_for_joint(joint, sigma_s), rel=1e-12)
    with pytest.raises(ConfigError, match="statistics_noise_multiplier"):
        build(*POP, "num_rounds=20", f"privacy.target_epsilon={target}", "privacy.client_statistics=noisy",
              "privacy.statistics_noise_multiplier=0.1")  # fmt: skip


@pytest.mark.parametrize("name", ["fedavg", "noisy_fedavg"])
def test_noisy_statistics_are_refused_without_the_sampled_gaussian_accountant(name):
    with pytest.raises(ConfigError, match="client_statistics=noisy"):
        build(f"strategy={name}", "privacy.client_statistics=noisy")


def test_auto_is_raw_in_simulation_and_none_in_deployment(caplog):
    from flwr.superlink.grid import InMemoryGrid

    class SimulationGrid(FakeGrid, InMemoryGrid):
        def __init__(self) -> None:
            FakeGrid.__init__(self)

    simulated = build(*POP, "privacy.client_statistics=auto")
    simulated.start(SimulationGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=1)
    assert simulated.statistics.mode == "raw"
    deployed = build(*POP, "privacy.client_statistics=auto")
    deployed.start(FakeGrid(), ArrayRecord(zeros(SHAPES)), num_rounds=1)
    assert deployed.statistics.mode == "none"
    # No rejection is logged (each line would count a client; a reason can name a partition): the operator's
    # record holds the counts.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        plan = prime(deployed, zeros(SHAPES), sampled=2)
        assert deployed.aggregator.aggregate(plan, [error_reply(7)]).stats["failed"] == 2
    assert "rejected" not in caplog.text and "boom" not in caplog.text
    with caplog.at_level(logging.WARNING):
        plan = prime(simulated, zeros(SHAPES), sampled=2)
        simulated.aggregator.aggregate(plan, [error_reply(7)])
    assert "reply rejected (failed): boom" in caplog.text  # raw statistics: the reason is logged


def test_joint_noise_multiplier_formula():
    assert mech.joint_noise_multiplier(1.0, 1.0) == pytest.approx(1 / math.sqrt(2))
    assert mech.update_noise_for_joint(mech.joint_noise_multiplier(0.8, 4.0), 4.0) == pytest.approx(0.8)
    with pytest.raises(ValueError):
        mech.update_noise_for_joint(1.0, 0.9)
