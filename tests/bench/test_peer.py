"""The peer benchmark's replay (bench/pfl_peer.py): what pfl is handed is the app's run — its clients per round, their
rows, their mini-batch order, the initial weights, the hyperparameters. pfl itself lives in its own virtualenv and
is not needed here; ``python -m bench.pfl_peer --check`` runs it (σ = 0, 2 rounds, agreement with the reference
loop to float tolerance)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.baseline import partition_indices, sampled_partitions, shuffle_generator
from bench.floors import round_batches
from bench.peer import peer_ratios, pooled, round_samples
from bench.pfl_peer import check_peer_supported, replay_step, write_replay
from bench.run import to_markdown
from clients.training import sgd_kernels
from fl_app.config import compose_config
from fl_app.models import build_model_for_dataset, get_weights
from tests.helpers import TINY_PEER_RUN as TINY


def test_the_replay_is_the_app_s_run(tmp_path: Path) -> None:
    config = compose_config(TINY)
    spec = write_replay(config, 2, tmp_path)
    arrays = np.load(tmp_path / "replay.npz")
    assert json.loads((tmp_path / "replay.json").read_text()) == spec
    c = spec["config"]
    assert (c["cohort_size"], c["use_sam"], c["local_epochs"], c["clip_norm"]) == (5, True, 2, config.privacy.clip_norm)
    for t in (1, 2):
        users = [u for u in spec["users"] if u["round"] == t]
        assert [u["partition"] for u in users] == sampled_partitions(config, t)
        for user in users:
            rows = partition_indices(config, user["partition"])
            replay_rows = arrays[f"rows_{user['uid']}"]
            # The replay's rows are positions in its own x; the images there are the partition's.
            assert np.array_equal(arrays["y"][replay_rows], np.asarray(_labels(config))[rows])
            generator = shuffle_generator(config, t, user["partition"])
            perms = arrays[f"perms_{user['uid']}"]
            for epoch in range(2):  # drawn exactly as bench/baseline.py's local_train draws them
                assert np.array_equal(perms[epoch], torch.randperm(len(rows), generator=generator).numpy())
    initial = get_weights(build_model_for_dataset("cnn", "fashion_mnist", seed=config.seed))
    assert all(np.array_equal(arrays[f"w{i}"], w) for i, w in enumerate(initial))
    assert round_samples(spec, 2) == [2 * sum(u["samples"] for u in spec["users"] if u["round"] == t) for t in (1, 2)]
    batches = round_batches(spec, 2, config.client.batch_size)
    for t, counts in zip((1, 2), batches, strict=True):  # two epochs of every client's batches, short ones included
        assert sum(b * n for b, n in counts.items()) == round_samples(spec, 2)[t - 1]
        steps = sum(2 * -(-u["samples"] // config.client.batch_size) for u in spec["users"] if u["round"] == t)
        assert sum(counts.values()) == steps


def test_the_replay_trains_the_app_s_step_unless_told_torch_s_defaults(tmp_path: Path) -> None:
    """Like with like: pfl is handed the app's compute layout, allocator setting and SGD kernels (one source:
    the app's own functions), so the timing compares the frameworks; ``torch_defaults`` is pfl without them."""
    spec = write_replay(compose_config(TINY), 1, tmp_path)
    assert spec["config"]["step"] == {
        "name": "app",
        "compute_layout": True,
        "keep_freed_memory": True,
        "sgd_kernels": {"cpu": sgd_kernels("cpu"), "cuda": sgd_kernels("cuda")},
    }
    assert sgd_kernels("cpu") == {"fused": True}
    defaults = replay_step("torch_defaults")
    assert not defaults["compute_layout"] and not defaults["keep_freed_memory"]
    assert defaults["sgd_kernels"] == {"cpu": {}, "cuda": {}}
    with pytest.raises(ValueError, match="step must be one of"):
        replay_step("fast")


def _labels(config) -> torch.Tensor:  # type: ignore[no-untyped-def]
    from fl_app.data.datasets import load_dataset

    train, _ = load_dataset(config.dataset.name, config.dataset.data_dir)
    return train.y


def test_the_replay_refuses_what_pfl_cannot_run() -> None:
    with pytest.raises(ValueError, match="sampling=fixed"):
        check_peer_supported(compose_config(["strategy=dp_fedavg"]))
    with pytest.raises(ValueError, match="covers"):
        check_peer_supported(compose_config(["strategy=fed_smp_randk", "privacy.sampling=fixed"]))


def test_the_peer_rows_state_ratios_against_their_targets() -> None:
    entry = {
        "app": {"round_s": 2.0, "startup_s": 12.0, "peak_rss_mib": 4000.0},
        "pfl": {"round_s": 1.6, "startup_s": 8.0, "peak_rss_mib": 3000.0},
        "limit": {"round_s": 1.4, "samples_per_s_one_thread": 880.0, "workload_round_s": 1.5},
        "ratio_app_over_pfl": 1.25,
        "ratio_app_over_limit": 2.0 / 1.4,
        "ratio_pfl_over_limit": 1.6 / 1.4,
        "pfl_torch_defaults": {"round_s": 2.2},
        "ratio_workload_floor_over_pfl": 1.5 / 1.6,
        "flower_round_floor": {"round_s": 1.5},
        "ratio_flower_round_floor_over_pfl": 1.5 / 1.6,
        "ratio_app_over_pfl_torch_defaults": 2.0 / 2.2,
    }
    results = {
        "machine": {"date": "d", "cpu_count": 2, "processor": "x", "cuda": None, "torch": "t"},
        "overrides": [],
        "command": "python -m bench --peer pfl",
        "PEER": {
            "cores": 2,
            "dp_fedavg": entry,
            "flower_engine_floor": {"first_step_s": 5.2, "cpu_s": 7.4, "nodes": 2, "workers": 2},
            "flower_engine_floor_flower_ray": {"first_step_s": 6.3, "cpu_s": 8.1, "nodes": 2, "workers": 2},
        },
    }
    text = to_markdown(results)
    assert "| PEER dp_fedavg app / pfl | **1.250** | ≤ 0.9 | **no** |" in text
    assert "2.00 / 1.60 / 1.40" in text
    defaults = next(line for line in text.splitlines() if "torch's defaults" in line)
    assert "| 2.20, 0.909 |" in defaults
    engine = next(line for line in text.splitlines() if "Flower's engine floor" in line)
    assert "| 1.50, **0.938** |" in engine and engine.endswith("| out of reach on Flower's engine |")
    floor = next(line for line in text.splitlines() if "workload floor" in line)
    assert "| 1.50, **0.938** |" in floor and floor.endswith("| out of reach for any framework |")
    floor = next(line for line in text.splitlines() if "Flower's simulation engine alone" in line)
    assert "2 nodes" in floor and "| 5.2 (7.4) (dp_fedavg app 12.0 / pfl 8.0) |" in floor
    flower_ray = next(line for line in text.splitlines() if "Ray started by Flower's backend" in line)
    assert flower_ray.endswith("| 6.3 (8.1) | | |")


def test_every_ratio_divides_its_own_pair() -> None:
    entry = {
        "app": {"round_s": 0.8},
        "pfl": {"round_s": 0.72},
        "pfl_torch_defaults": {"round_s": 0.9},
        "flower_round_floor": {"round_s": 0.75},
        "limit": {"round_s": 0.55, "workload_round_s": 0.6},
    }
    ratios = peer_ratios(entry)
    assert ratios == pytest.approx(
        {
            "ratio_app_over_pfl": 0.8 / 0.72,
            "ratio_app_over_pfl_torch_defaults": 0.8 / 0.9,
            "ratio_flower_round_floor_over_pfl": 0.75 / 0.72,
            "ratio_workload_floor_over_pfl": 0.6 / 0.72,
            "ratio_app_over_limit": 0.8 / 0.55,
            "ratio_pfl_over_limit": 0.72 / 0.55,
        }
    )
    assert peer_ratios({"app": {"round_s": 0.8}, "pfl": None, "limit": None})["ratio_app_over_pfl"] is None


def test_repeated_runs_pool_into_one_contender() -> None:
    runs = [
        {"round_s": 0.9, "round_s_each": [0.8, 0.9, 1.0], "startup_s": 8.0, "peak_rss_mib": 4000.0,
         "peak_rss_by_kind_mib": {"driver": 1.0}, "model_file": "a"},
        {"round_s": 0.7, "round_s_each": [0.6, 0.7, 0.75], "startup_s": 9.0, "peak_rss_mib": 4100.0,
         "peak_rss_by_kind_mib": {"driver": 2.0}, "model_file": "b"},
    ]  # fmt: skip
    one = pooled(runs)
    assert one is not None
    assert one["round_s"] == pytest.approx(0.775)  # the median of all six steady rounds, not of the two medians
    assert one["startup_s"] == pytest.approx(8.5)
    assert (one["peak_rss_mib"], one["peak_rss_by_kind_mib"]) == (4100.0, {"driver": 2.0})  # the larger run's
    assert [run["round_s"] for run in one["runs"]] == [0.9, 0.7]
    assert pooled([]) is None
