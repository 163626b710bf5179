"""fl_app/central_evaluation.py: the global model on the test split, as Flower's evaluate_fn."""

from __future__ import annotations

from flwr.app import ArrayRecord

import strategies  # noqa: F401  (registers the strategy names the configs here are validated by)
from fl_app.central_evaluation import central_evaluate_fn
from fl_app.config import compose_config
from fl_app.models import build_model_for_dataset, get_weights


def test_the_central_evaluate_fn_scores_a_model_on_the_test_split() -> None:
    config = compose_config(["dataset.max_test_samples=200"])
    evaluate_fn = central_evaluate_fn(config)
    initial = get_weights(build_model_for_dataset(config.model.name, config.dataset.name, seed=0))
    metrics = evaluate_fn(0, ArrayRecord(initial))
    assert set(metrics) == {"test_loss", "test_accuracy"}
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and metrics["test_loss"] > 0
    assert evaluate_fn(1, ArrayRecord(initial)) == metrics  # deterministic: the same model, the same score
