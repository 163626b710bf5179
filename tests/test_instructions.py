"""The server-to-client instructions survive the trip through a flat Flower ConfigRecord."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord

import strategies  # noqa: F401  (registers the strategy names the configs here are validated by)
from fl_app.config import compose_config
from fl_app.instructions import (
    COHORT_CLIENT_METRICS,
    CohortReply,
    RecipeSpec,
    TrainInstructions,
    local_training_config,
    make_train_instructions,
)


def _instructions() -> TrainInstructions:
    config = compose_config(["dataset.max_train_samples=600", "client.local_epochs=3", "client.adaptive=true"])
    return make_train_instructions(
        config,
        7,
        recipe=RecipeSpec(kind="topk_noisy", sparsity=0.4),
        training=local_training_config(config, "sam"),
        clip_norm=0.2,
        add_noise=True,
        noise_multiplier=0.9,
        expected_clients=50.0,
    )


def test_round_trip_through_config_record() -> None:
    ins = _instructions()
    record = ins.to_config_record()
    assert isinstance(record, ConfigRecord)
    assert record["training.optimizer"] == "sam" and record["data.max_train_samples"] == 600
    assert "training.max_steps" not in record  # None is not representable; the default is restored
    back = TrainInstructions.from_config(dict(record))
    assert back == ins
    assert back.training.epochs == 3 and back.training.adaptive is True and back.training.max_steps is None
    assert back.noisy_training is None and back.recipe == RecipeSpec(kind="topk_noisy", sparsity=0.4)


def test_noisy_training_round_trip() -> None:
    from clients.training import NoisyLocalConfig

    config = compose_config(["strategy=noisy_fedprox"])
    noisy = NoisyLocalConfig(steps=5, batch_size=16, lr=0.05, schedule="cyclic", grad_clip=2.0, prox_coef=3.0)
    ins = make_train_instructions(
        config,
        2,
        recipe=RecipeSpec(kind="noisy_model", noise_std=0.01),
        training=noisy,
        clip_norm=0.0,
        add_noise=False,
        noise_multiplier=0.0,
        expected_clients=5.0,
    )
    back = TrainInstructions.from_config(dict(ins.to_config_record()))
    assert back == ins and back.training is None and back.noisy_training == noisy


def test_missing_key_is_a_clear_error() -> None:
    record = dict(_instructions().to_config_record())
    del record["clip_norm"]
    with pytest.raises(ValueError, match="clip_norm"):
        TrainInstructions.from_config(record)
    record = dict(_instructions().to_config_record())
    del record["data.dataset"]
    with pytest.raises(ValueError, match="dataset"):
        TrainInstructions.from_config(record)


def test_a_cohort_reply_reads_back_what_was_written_and_refuses_other_record_types():
    written = CohortReply(
        total=[np.ones((2, 3)), np.zeros(3)],
        accepted=[4.0, 9.0],
        metrics={k: [0.5, 1.5] for k in COHORT_CLIENT_METRICS},
        rejected={"failed": [1.0], "nonfinite": [], "shape": [7.0]},
        reclipped=1,
        num_examples=40,
        timestamps={"fit_started_unix": 12.5},
    )
    read = CohortReply.from_record(written.to_record())
    assert (read.accepted, read.metrics, read.rejected, read.reclipped) == (
        written.accepted,
        written.metrics,
        written.rejected,
        1.0,
    )
    assert read.timestamps == {"fit_started_unix": 12.5}
    assert all(np.array_equal(a, b) for a, b in zip(read.total, written.total, strict=True))
    smuggled = written.to_record()
    smuggled["metrics"] = ConfigRecord({"cohort_ids": [True], "reclipped": "0"})
    with pytest.raises(TypeError, match="MetricRecord"):
        CohortReply.from_record(smuggled)
