"""bench/distributed_rounds.py: its runs are valid configs of both placements over the same clients, and a run's
summary is the median over rounds 2..T of its timings and sample sizes."""

from __future__ import annotations

import pytest

from bench.distributed_rounds import overrides, summarise
from fl_app.config import compose_config


@pytest.mark.parametrize("m", [10, 50, 100])
def test_both_placements_run_the_same_clients_one_a_message(m: int) -> None:
    central = compose_config(overrides(m, 3, "central"))
    distributed = compose_config(overrides(m, 3, "distributed"))
    assert (central.privacy.placement, distributed.privacy.placement) == ("server", "distributed")
    for config in (central, distributed):
        assert config.dataset.num_clients == 2 * m and config.privacy.sample_rate == 0.5
        assert config.simulation.cohort_size == 1 and config.num_rounds == 3


def test_the_summary_is_the_median_over_the_rounds_after_the_first() -> None:
    metrics = [{"round": r, "clients_phase_s": p, "aggregate_s": a} for r, p, a in [(1, 9.0, 1.0), (2, 2.0, 0.5),
                                                                                   (3, 4.0, 0.1), (4, 3.0, 0.2)]]
    counts = [{"round": r, "sampled": n} for r, n in [(1, 50), (2, 40), (3, 60), (4, 52)]]
    assert summarise(metrics, counts) == {"clients_phase_s": 3.0, "aggregate_s": 0.2, "round_s": 3.2, "sampled": 52.0}
