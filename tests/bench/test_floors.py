"""The limits and floors of the peer benchmark (bench/floors.py): the compute limit at the workload's batch sizes,
the workload floor, and Flower's engine floors to the first local step and for a round, through the real engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.baseline import partition_indices, sampled_partitions
from bench.floors import (
    compute_limit,
    flower_engine_floor,
    flower_round_floor,
    round_batches,
    round_floor_plan,
    workload_floor,
)
from fl_app.config import compose_config
from tests.helpers import TINY_PEER_RUN as TINY


def test_the_workload_floor_spreads_every_step_at_its_batch_size_over_the_cores() -> None:
    # Clients of 70 and 40 samples at B = 32, one epoch: batches 32, 32, 6 and 32, 8.
    spec = {"users": [{"round": 1, "samples": 70}, {"round": 1, "samples": 40}, {"round": 2, "samples": 32}]}
    batches = round_batches(spec, 1, 32)
    assert batches == [{32: 3, 6: 1, 8: 1}, {32: 1}]
    step_s = {"32": 0.016, "6": 0.004, "8": 0.005}
    assert workload_floor(batches, step_s, 2) == pytest.approx([(3 * 0.016 + 0.004 + 0.005) / 2, 0.016 / 2])


def test_the_round_floor_trains_the_app_s_cohorts_at_their_clients_batch_sizes() -> None:
    from fl_app.instructions import local_training_config
    from strategies.cohorts import balance_cohorts, local_work

    config = compose_config([*TINY, "num_rounds=2"])
    plan = round_floor_plan(config, 2)
    assert plan["spec"]["sam"] and plan["spec"]["batch_size"] == config.client.batch_size
    training = local_training_config(config, "sam")
    for t, cohorts in zip((1, 2), plan["rounds"], strict=True):
        pids = sampled_partitions(config, t)
        expected = balance_cohorts(pids, [local_work(config, training, pid) for pid in pids], 2)
        assert len(cohorts) == len(expected)
        for cohort, want in zip(cohorts, expected, strict=True):
            assert [sum(sizes) for sizes in cohort] == [2 * len(partition_indices(config, pid)) for pid in want]


# Slow: the benchmark harness's floors on Flower's Ray engine (~80 s of the 2-core machine, beside the integration
# runs); `python -m bench` runs them, and the product's own Ray runs are the integration tests.
@pytest.mark.slow
def test_the_round_floor_runs_its_rounds_on_flower_s_engine(tmp_path: Path) -> None:
    """bench/flower_floor.py --rounds through Flower's real simulation engine: every planned round completes."""
    floor = flower_round_floor(TINY, tmp_path, 4)
    assert floor["nodes"] == floor["workers"] >= 1
    assert len(floor["round_s_each"]) == 1  # rounds 3..T-1 of 4
    assert 0.0 < floor["round_s"] < 60


def test_the_compute_limit_times_the_step_at_every_batch_size_asked() -> None:
    limit = compute_limit(["strategy=dp_fedavg"], cores=2, steps=8, batch_sizes=[6, 32])
    assert set(limit["step_s_by_batch"]) == {"6", "32"}
    assert limit["step_s_by_batch"]["32"] == limit["step_s"] > 0
    assert limit["samples_per_s_machine"] == pytest.approx(2 * limit["samples_per_s_one_thread"])


# Slow: the benchmark harness's floors on Flower's Ray engine (~80 s of the 2-core machine, beside the integration
# runs); `python -m bench` runs them, and the product's own Ray runs are the integration tests.
@pytest.mark.slow
def test_the_flower_engine_floor_reaches_a_first_step(tmp_path: Path) -> None:
    """bench/flower_floor.py through Flower's real simulation engine: the P2 config's backend and node count, a
    ClientApp that only imports torch, Ray started the app's way and Flower's; the first step is timed from the
    command's start."""
    overrides = ["strategy=dp_fedavg", "dataset.num_clients=500", "privacy.sampling=fixed"]
    for ray_start in ("app", "flower"):
        floor = flower_engine_floor(overrides, tmp_path, ray_start)
        assert floor["nodes"] == floor["workers"] >= 1  # cohort mode: one SuperNode per worker of the pool
        assert 0.5 < floor["first_step_s"] < 300
        assert floor["cpu_s"] > 0.5
