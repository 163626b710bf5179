"""Central evaluation: the global model on the test split, on the server, in the shape of Flower's ``evaluate_fn``.

Our strategies train on the clients and evaluate centrally (clients only train): :func:`central_evaluate_fn` builds
the model and loads the test split of ``config.dataset`` once, and returns the function ``strategy.start(...,
evaluate_fn=...)`` calls with each released model. The Hydra and ``flwr run`` ServerApp uses it, and so can a
user's own ServerApp (docs/architecture.md, Using a strategy from your own ServerApp). It reads only released models,
so it is post-processing: ε is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import ArrayRecord, MetricRecord

from fl_app.config import AppConfig
from fl_app.data.datasets import load_split
from fl_app.models import build_model_for_dataset, evaluate, resolve_device, set_weights

#: Flower's centralized evaluation: (server round, global model) -> metrics.
CentralEvaluateFn = Callable[[int, ArrayRecord], MetricRecord]


def central_evaluate_fn(config: AppConfig) -> CentralEvaluateFn:
    """``test_loss`` and ``test_accuracy`` of a released model on the first ``dataset.max_test_samples`` test
    examples (all when null), on ``simulation.device``; the model and the test set are built once."""
    test = load_split(config.dataset.name, config.dataset.data_dir, train=False, download=config.dataset.download)
    n = config.dataset.max_test_samples or len(test)
    test_x, test_y = test.x[:n], test.y[:n]
    device = resolve_device(config.simulation.device)
    model = build_model_for_dataset(config.model.name, config.dataset.name, seed=config.seed).to(device)

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        set_weights(model, arrays.to_numpy_ndarrays())
        loss, accuracy = evaluate(model, test_x, test_y, device)
        return MetricRecord({"test_loss": loss, "test_accuracy": accuracy})

    return evaluate_fn
