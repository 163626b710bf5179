"""Real Flower simulations on a small real Fashion-MNIST subset, through both front doors."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.baseline import run_baseline
from fl_app.config import compose_config
from fl_app.metrics import ROUND_FIELDS, read_metrics
from fl_app.privacy.accountants import compute_epsilon
from tests.integration.conftest import SMALL, flwr_run_simulation, kill_after_a_round_then_resume, run_hydra
from tests.integration.test_first_screen import first_screen_problems

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROUNDS = 3
DP_FEDSAM = ["strategy=dp_fedsam", f"num_rounds={ROUNDS}", *SMALL]


def _completed(tmp: Path, overrides: list[str]) -> Path:
    proc = run_hydra(tmp, overrides)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert first_screen_problems(proc.stdout + proc.stderr) == [], proc.stdout + proc.stderr
    return tmp / "out"


@pytest.fixture(scope="module")
def dp_fedsam_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A Ray of its own: the Hydra front door's first screen as a user gets it by default.
    return _completed(tmp_path_factory.mktemp("dpfedsam_a"), DP_FEDSAM)


@pytest.fixture(scope="module")
def dp_fedsam_rerun(tmp_path_factory: pytest.TempPathFactory, shared_ray: str) -> Path:
    return _completed(tmp_path_factory.mktemp("dpfedsam_b"), [*DP_FEDSAM, shared_ray])


def _comparable(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith(("_s", "_unix"))} for r in records]


def test_app_equals_the_plain_pytorch_loop(dp_fedsam_run: Path) -> None:
    """bench/baseline.py (no Flower, no Ray) reaches the app's global model for the same config and seed: the
    sampling, the local SAM steps, clipping, noise and the weight round trips through Flower messages agree."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the app's Ray workers (client_cpus=1): same float reduction order, same bits
    try:
        baseline = run_baseline(compose_config(DP_FEDSAM))
    finally:
        torch.set_num_threads(threads)
    with np.load(dp_fedsam_run / "final_model.npz") as saved:
        app_weights = list(saved.values())
    assert baseline.clients_per_round == [r["aggregated"] for r in read_metrics(dp_fedsam_run / "metrics.jsonl")]
    for app_w, loop_w in zip(app_weights, baseline.weights, strict=True):
        np.testing.assert_array_equal(app_w, loop_w)
    # Not trivially equal because nothing moved: the rounds changed the model.
    initial = run_baseline(compose_config(DP_FEDSAM), num_rounds=0).weights
    assert max(float(np.abs(a - b).max()) for a, b in zip(app_weights, initial, strict=True)) > 1e-3


def test_dp_fedsam_writes_metrics_run_metadata_and_model(dp_fedsam_run: Path) -> None:
    records = read_metrics(dp_fedsam_run / "metrics.jsonl")
    assert [r["round"] for r in records] == list(range(1, ROUNDS + 1))
    delta = 1 / 50
    for r in records:
        assert set(ROUND_FIELDS) <= set(r)
        # ε every round, from the accountant of the sampling actually used (Poisson, q = 0.2, δ = 1/M).
        assert r["epsilon"] == pytest.approx(compute_epsilon(0.95, 0.2, r["round"], delta), rel=1e-9)
        assert r["delta"] == pytest.approx(delta)
        assert r["sampled"] == r["received"] == r["aggregated"] > 0
        assert r["failed"] == r["rejected_nonfinite"] == r["rejected_shape"] == r["reclipped"] == 0
        assert 0 <= r["test_accuracy"] <= 1 and math.isfinite(r["test_loss"])
        assert len(r["client_norms"]) == r["aggregated"]
        assert r["norm_max"] >= r["norm_median"] > 0
        assert 0 < r["alpha_mean"] <= 1 and 0 <= r["fraction_clipped"] <= 1
    meta = json.loads((dp_fedsam_run / "run.json").read_text())
    assert meta["status"] == "completed"
    assert meta["strategy"] == "DPFedSAM"
    assert meta["accountant"] == "rdp" and meta["epsilon"] == pytest.approx(records[-1]["epsilon"])
    assert meta["dp_guarantee"].startswith("client-level (")
    model = np.load(dp_fedsam_run / "final_model.npz")
    assert sum(model[k].size for k in model.files) == meta["num_parameters"] == 1_663_370


@pytest.mark.slow  # determinism is also pinned by flwr run == Hydra and by SIGKILL + resume == uninterrupted
def test_same_config_and_seed_give_the_same_metrics_and_model(dp_fedsam_run: Path, dp_fedsam_rerun: Path) -> None:
    first = read_metrics(dp_fedsam_run / "metrics.jsonl")
    second = read_metrics(dp_fedsam_rerun / "metrics.jsonl")
    assert _comparable(first) == _comparable(second)
    a, b = np.load(dp_fedsam_run / "final_model.npz"), np.load(dp_fedsam_rerun / "final_model.npz")
    assert a.files == b.files
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])


def test_dp_fedsam_learns_something(dp_fedsam_run: Path) -> None:
    records = read_metrics(dp_fedsam_run / "metrics.jsonl")
    assert records[-1]["test_accuracy"] > 0.15  # above chance after 3 noisy rounds


@pytest.mark.slow  # both front doors are also held equal by test_adaptive_clipping.py (C_t moving) and test_audit.py
def test_flwr_run_gives_the_same_training_as_the_hydra_entry_point(
    short_tmp: Path, dp_fedsam_run: Path, shared_superlink: tuple
) -> None:
    out = short_tmp / "flwr_out"
    run_config = f"num_rounds={ROUNDS} overrides='{' '.join(SMALL)}' output_dir='{out}'"  # same config and seed
    proc = flwr_run_simulation(shared_superlink, run_config)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert first_screen_problems(proc.stdout + proc.stderr) == [], proc.stdout + proc.stderr
    assert (out / "final_model.npz").exists(), proc.stdout[-3000:]
    # flwr run against a --simulation SuperLink is a simulation: seeded, reproducible noise (secure_noise=auto).
    assert json.loads((out / "run.json").read_text())["noise_source"].startswith("seeded")
    assert _comparable(read_metrics(out / "metrics.jsonl")) == _comparable(
        read_metrics(dp_fedsam_run / "metrics.jsonl")
    )
    a, b = np.load(out / "final_model.npz"), np.load(dp_fedsam_run / "final_model.npz")
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("privacy.clip_norm=0", "privacy.clip_norm"),
        # Each key's range is pinned in tests/test_config.py; here, that a bad value stops the real entry point.
        pytest.param("privacy.noise_multiplier=-1", "privacy.noise_multiplier", marks=pytest.mark.slow),
        pytest.param("privacy.sample_rate=1.5", "privacy.sample_rate", marks=pytest.mark.slow),
        ("strategy=no_such_strategy", "strategy"),
        pytest.param("simulation.cohort_size=0", "simulation.cohort_size", marks=pytest.mark.slow),
        ("simulation.cohort_engine=gpu", "simulation.cohort_engine"),
    ],
)
def test_invalid_config_fails_with_one_clear_message_before_ray(short_tmp: Path, override: str, key: str) -> None:
    start = time.monotonic()
    proc = run_hydra(short_tmp, [override], timeout=120)
    assert proc.returncode != 0
    assert key in proc.stderr
    assert "Ray" not in proc.stdout + proc.stderr and "ActorPool" not in proc.stdout + proc.stderr
    assert not (short_tmp / "out" / "metrics.jsonl").exists()
    assert time.monotonic() - start < 60


@pytest.mark.slow  # the same kill + resume with a C that moves every round: test_adaptive_clipping.py
def test_sigkill_mid_run_then_resume_gives_the_uninterrupted_result(
    short_tmp: Path, dp_fedsam_run: Path, shared_ray: str
) -> None:
    out, checkpointed = kill_after_a_round_then_resume(short_tmp, [*DP_FEDSAM, shared_ray], ROUNDS)
    resumed = read_metrics(out / "metrics.jsonl")
    assert [r["round"] for r in resumed] == list(range(1, ROUNDS + 1))
    reference = read_metrics(dp_fedsam_run / "metrics.jsonl")
    assert resumed[-1]["epsilon"] == reference[-1]["epsilon"]
    assert _comparable(resumed) == _comparable(reference)
    a, b = np.load(out / "final_model.npz"), np.load(dp_fedsam_run / "final_model.npz")
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
    assert json.loads((out / "run.json").read_text())["resumed_after_round"] == checkpointed


# Per-client replies (cohort_size=1, what deployments send) are screened through the real server path in
# tests/strategies/test_hostile_replies.py; a node failing mid-run is test_deployment.py's.
@pytest.mark.parametrize("cohort_size", [pytest.param("1", marks=pytest.mark.slow), "auto"])
def test_faulty_clients_are_rejected_counted_and_the_rounds_complete(
    short_tmp: Path, cohort_size: str, shared_ray: str
) -> None:
    """A client that raises, one that sends NaN, one with a huge unclipped update and one with wrong shapes: each
    rejected (or re-clipped) alone, by the server for per-client messages and inside the worker for a cohort."""
    proc = run_hydra(
        short_tmp,
        [
            f"simulation.cohort_size={cohort_size}",
            "num_rounds=2",
            "dataset.num_clients=10",
            "dataset.max_train_samples=1200",
            "dataset.max_test_samples=1000",
            "privacy.sample_rate=1.0",  # everyone, every round
            "fault_injection.raise_partitions=[1]",
            "fault_injection.nan_partitions=[2]",
            "fault_injection.huge_norm_partitions=[3]",
            "fault_injection.wrong_shape_partitions=[4]",
            shared_ray,
        ],
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = read_metrics(short_tmp / "out" / "metrics.jsonl")
    assert len(records) == 2
    for r in records:
        assert r["sampled"] == 10 and r["received"] == 10
        assert r["failed"] == 1  # raised in fit
        assert r["rejected_nonfinite"] == 1 and r["rejected_shape"] == 1
        assert r["reclipped"] == 1  # the huge update was clipped to C by the server, not trusted
        assert r["aggregated"] == 7  # 10 - raised - NaN - wrong shapes; the huge one was clipped and kept
        assert math.isfinite(r["test_loss"]) and r["epsilon"] > 0
    model = np.load(short_tmp / "out" / "final_model.npz")
    assert all(np.isfinite(model[k]).all() for k in model.files)


def test_missing_dataset_fails_before_ray_with_how_to_get_it(short_tmp: Path) -> None:
    proc = run_hydra(short_tmp, ["dataset=cifar10", "model=resnet18", f"dataset.data_dir={short_tmp / 'nodata'}"])
    assert proc.returncode == 2
    assert "download" in proc.stderr and str(short_tmp / "nodata") in proc.stderr
    assert "ActorPool" not in proc.stdout + proc.stderr


def test_a_config_the_strategy_refuses_fails_before_ray_with_the_setting(short_tmp: Path) -> None:
    """The strategy is built once, before Ray starts (apps/main.py's preflight): what only its construction finds
    is an exit 2 naming the setting, with no run.json."""
    proc = run_hydra(short_tmp, ["privacy.clipping=adaptive", "privacy.clipped_count_stddev=0.1"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: invalid config value privacy.clipped_count_stddev=0.1" in proc.stderr
    assert "ActorPool" not in proc.stdout + proc.stderr and "Ray" not in proc.stdout + proc.stderr
    assert not (short_tmp / "out" / "run.json").exists()
