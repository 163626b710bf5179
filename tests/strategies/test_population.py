"""The privacy unit under ``population=virtual``: a reply counts as the sampled client's data only if the node's
ClientApp trains the partition the message names. Before the first train message the server asks every node
(fl_app/node_queries.py); a ClientApp that does not confirm it (a plain Flower ClientApp that trains its node's own
``partition-id``) stops the run with an error that says what to use, and nothing is released."""

from __future__ import annotations

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp

from clients.numpy_mod import numpy_client_mod
from fl_app.models import build_model_for_dataset, get_weights
from fl_app.node_queries import BINDING_QUERY, PARTITION_QUERY, answer_query, confirms_binding, query_message
from strategies.population import Population, PopulationError
from tests.helpers import InProcessGrid, build

SMALL = ["dataset.num_clients=20", "dataset.max_train_samples=400", "dataset.max_test_samples=100",
         "privacy.sample_rate=0.5", "num_rounds=1"]  # fmt: skip


def _initial() -> ArrayRecord:
    return ArrayRecord(get_weights(build_model_for_dataset("cnn", "fashion_mnist", seed=0)))


def _own_partition_app() -> ClientApp:
    """A Flower ClientApp as a user writes it from Flower's quickstart: it trains its node's own partition
    (``context.node_config["partition-id"]``) whatever the message says, and has no query handler."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        _ = context.node_config["partition-id"]  # the node's own data
        metrics = MetricRecord({"num-examples": 10})
        return Message(RecordDict({"arrays": msg.content["arrays"], "metrics": metrics}), reply_to=msg)

    return app


def test_a_clientapp_that_trains_its_own_partition_is_refused_before_the_first_train_message() -> None:
    grid = InProcessGrid(nodes=2, app=_own_partition_app())
    strategy = build("strategy=dp_fedavg", *SMALL)
    with pytest.raises(PopulationError, match=r"population=virtual needs a ClientApp that trains the partition") as exc:
        strategy.start(grid, _initial(), num_rounds=1, timeout=5)
    message = str(exc.value)
    assert message.startswith("use this project's ClientApp")  # the fix first: it ends a long log
    assert "numpy_client_mod" in message and "population=nodes" in message and "error:" in message
    assert "\n" not in message  # the ClientApp's traceback cut to its last line
    assert grid.sent == []  # no train message went out
    assert strategy.account.rounds_released == 0  # nothing was released, no epsilon spent


def test_a_query_handler_that_does_not_confirm_the_binding_is_refused() -> None:
    app = _own_partition_app()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"status": ConfigRecord({"ok": 1})}), reply_to=msg)

    population = Population("virtual", 20)
    with pytest.raises(PopulationError, match="an answer without 'binding'"):
        population.connect(InProcessGrid(nodes=2, app=app), timeout=5)


def test_our_clientapp_and_a_numpy_client_behind_the_mod_confirm_the_binding() -> None:
    class Plain(NumPyClient):
        def fit(self, parameters, config):  # pragma: no cover - not reached: only the query is sent
            return parameters, 1, {}

    numpy_app = ClientApp(client_fn=lambda context: Plain().to_client(), mods=[numpy_client_mod])
    for app in (None, numpy_app):  # None: apps.client_app
        population = Population("virtual", 20)
        population.connect(InProcessGrid(nodes=3, app=app), timeout=5)
        assert population.num_nodes == 3


def test_the_query_answers() -> None:
    binding = answer_query(query_message(BINDING_QUERY, 4), {})
    assert confirms_binding(binding)
    partition = answer_query(query_message(PARTITION_QUERY, 4), {"partition-id": 3, "num-partitions": 9})
    assert dict(partition.content["partition"]) == {"partition-id": 3, "num-partitions": 9}
    assert not confirms_binding(partition)
    with pytest.raises(ValueError, match="unknown query 'other'"):
        answer_query(query_message("other", 4), {})
