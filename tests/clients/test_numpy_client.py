"""Tests for clients/numpy_client.py and clients/numpy_mod.py: Flower NumPyClients under our strategies and Flower's.

:func:`numpy_client_mod` lets ``ClientApp(client_fn=...)`` (Flower's legacy handler, which reads ``fitins.*`` and
``evaluateins.*``) answer Message-API train and evaluate messages in Flower's convention, keeping the message's array
keys (``ArrayRecord(model.state_dict())`` under ``ClientLevelDP(FedAdam)``); :class:`InstructedNumPyClient` is our
client behind it, a cohort of one of :func:`clients.cohort.train_cohort`, which also evaluates the global model on
its partition. Every message and reply goes through Flower's wire format to the app, called as Flower's engine calls
a ClientApp (:class:`tests.helpers.InProcessGrid`); tests/integration/test_numpy_client_flwr_run.py runs both on
Flower's simulation engine.

Our ClientApp (``apps.client_app.train``) and the NumPyClient give the same client: the NumPyClient's trained model
is, bit for bit, the float32 rounding of global + our ClientApp's update (what a NumPyClient sends is a model, so the
server's Δ = trained − global is that update up to this one rounding), with the same statistics and example count.
The data are real Fashion-MNIST partitions of the first 200 training images, the model the paper CNN, one local step.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.common import FitIns, ndarrays_to_parameters
from flwr.compat.common.recorddict_compat import fitins_to_recorddict
from flwr.serverapp.strategy import FedAdam, FedAvg

import clients.numpy_client as numpy_client
from clients.cohort import CohortResult
from clients.local_update import client_data
from clients.numpy_client import ClientRejectedError, InstructedNumPyClient, numpy_client_mod, unpack_mask
from clients.numpy_mod import keyed
from fl_app.config import compose_config
from fl_app.instructions import CohortReply, FlowerReply
from fl_app.models import build_model_for_dataset, evaluate, get_weights, set_weights
from strategies import ClientLevelDP
from strategies.base import FederatedStrategy
from strategies.flower_dp import UNIT_WEIGHT
from strategies.rounds import RoundPlan
from tests.helpers import InProcessGrid, build
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

SMALL = (
    "dataset.num_clients=10",
    "dataset.max_train_samples=200",
    "privacy.sample_rate=0.2",  # m = 2
    "privacy.sampling=fixed",
    "simulation.cohort_size=1",
    "simulation.device=cpu",
    "client.batch_size=32",
)
SERVER_ROUND = 2


def _initial() -> list[np.ndarray]:
    return get_weights(build_model_for_dataset("cnn", "fashion_mnist", seed=0))


def _plan(strategy: FederatedStrategy, global_weights: list[np.ndarray]) -> RoundPlan:
    strategy.population.connect(InProcessGrid(nodes=2), timeout=1)
    return strategy.plan_round(SERVER_ROUND, ArrayRecord(global_weights))


def _push_ids(plan: RoundPlan) -> None:
    """The ids :class:`InProcessGrid` gives a round's messages on its first push (every grid gives the same)."""
    for i, message in enumerate(plan.messages):
        message.metadata.__dict__["_message_id"] = f"ip0-{i}"


class Spy(NumPyClient):
    """Records what Flower's legacy handler hands a NumPyClient; answers global + 1."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, context: Context) -> None:
        self.node_config = dict(context.node_config)

    def fit(self, parameters, config):
        Spy.seen.append({"parameters": parameters, "config": dict(config), "node_config": self.node_config})
        return [p + 1 for p in parameters], 7, {"accuracy": 0.5, "note": "a string is not a metric", "steps": 3}

    def evaluate(self, parameters, config):
        """Answers loss 1 + partition, 5 + partition examples (distinct per node, for the weighted mean)."""
        pid = int(self.node_config["partition-id"])
        Spy.seen.append({"evaluate": True, "parameters": parameters, "config": dict(config)})
        return 1.0 + pid, 5 + pid, {"accuracy": 0.25 * pid, "note": "a string is not a metric"}


def _spy_app() -> ClientApp:
    Spy.seen = []
    return ClientApp(client_fn=lambda context: Spy(context).to_client(), mods=[numpy_client_mod])


# ----- the mod ------------------------------------------------------------------------------------------------------


def test_the_mod_hands_a_numpy_client_the_message_as_fitins_and_answers_in_flowers_convention() -> None:
    strategy = build("strategy=dp_fedsam", *SMALL)
    initial = _initial()
    plan = _plan(strategy, initial)
    replies = InProcessGrid(nodes=2, app=_spy_app()).send_and_receive(plan.messages)
    assert len(Spy.seen) == len(plan.messages) == 2
    for (message, (pid,)), seen, answer in zip(plan.sent, Spy.seen, replies, strict=True):
        # The global model, as sent.
        assert all(np.array_equal(a, b) for a, b in zip(seen["parameters"], initial, strict=True))
        # Every scalar of the message's config (the instructions), the one partition's fault; no lists.
        sent = message.content["config"]
        scalars = {k: v for k, v in sent.items() if not isinstance(v, list)}
        assert seen["config"] == {**scalars, "fault": ""}
        # The node trains the partition the server sampled, of M (population=virtual: not the node's own).
        assert seen["node_config"]["partition-id"] == pid
        assert seen["node_config"]["num-partitions"] == 10
        # Flower's Message-API reply: the trained model, num-examples, the numeric metrics.
        assert sorted(answer.content.keys()) == ["arrays", "metrics"]
        assert answer.metadata.reply_to_message_id == message.metadata.message_id
        parsed = FlowerReply.from_record(answer.content)
        assert parsed.num_examples == 7
        assert all(np.array_equal(t, g + 1) for t, g in zip(parsed.trained, initial, strict=True))
        assert dict(answer.content["metrics"]) == {"accuracy": 0.5, "steps": 3, "num-examples": 7}


def test_the_mod_carries_the_round_mask() -> None:
    strategy = build("strategy=fed_smp_randk", *SMALL)
    plan = _plan(strategy, _initial())
    assert plan.mask is not None
    InProcessGrid(nodes=2, app=_spy_app()).send_and_receive(plan.messages)
    for seen in Spy.seen:
        mask = unpack_mask(seen["config"]["mask"])
        assert all(np.array_equal(a, b) for a, b in zip(mask, plan.mask, strict=True))
        assert all(m.dtype == np.bool_ for m in mask)


def test_the_mod_answers_the_partition_query() -> None:
    query = Message(
        RecordDict({"config": ConfigRecord({"query": "partition"})}), dst_node_id=2, message_type=MessageType.QUERY
    )
    (answer,) = InProcessGrid(nodes=3, app=_spy_app()).send_and_receive([query])
    assert dict(answer.content["partition"]) == {"partition-id": 1, "num-partitions": 3}


# ----- the array keys, evaluate, Flower's own strategies -------------------------------------------------------------


def _state_dict_arrays() -> tuple[ArrayRecord, list[str]]:
    """The Flower idiom for a model's arrays: ``ArrayRecord(model.state_dict())``, keyed by the state_dict (a small
    torch model: ``0.weight``, ``0.bias``, ``2.weight``, ``2.bias``)."""
    torch.manual_seed(0)
    state = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(36, 10)).state_dict()
    return ArrayRecord(state), list(state)


@pytest.mark.parametrize("record_key", ["arrays", "weights"])
def test_the_reply_carries_the_messages_array_keys_in_their_order(record_key: str) -> None:
    arrays, keys = _state_dict_arrays()
    grid = InProcessGrid(nodes=2, app=_spy_app())
    strategy = FedAvg(min_available_nodes=2, arrayrecord_key=record_key, configrecord_key=f"{record_key}-config")
    replies = grid.send_and_receive(strategy.configure_train(1, arrays, ConfigRecord({"lr": 0.1}), grid))
    assert len(replies) == len(Spy.seen) == 2
    sent = [arrays[key].numpy() for key in keys]
    for seen, answer in zip(Spy.seen, replies, strict=True):
        # In: the NumPyClient gets the arrays in the message's order, and the message's config.
        assert all(np.array_equal(p, a) for p, a in zip(seen["parameters"], sent, strict=True))
        assert seen["config"] == {"lr": 0.1, "server-round": 1}
        # Out: its list comes back under the key the model came under, with the message's array keys in order.
        assert sorted(answer.content.keys()) == sorted([record_key, "metrics"])
        record = answer.content[record_key]
        assert list(record.keys()) == keys
        assert all(np.array_equal(record[k].numpy(), a + 1) for k, a in zip(keys, sent, strict=True))
        assert dict(answer.content["metrics"]) == {"accuracy": 0.5, "steps": 3, "num-examples": 7}
    # A list of another length keeps Flower's numbered keys: the strategy rejects it as a model of other shapes.
    assert list(keyed(sent[:-1], keys).keys()) == [str(i) for i in range(len(keys) - 1)]


def test_client_level_dp_fedadam_takes_a_numpy_clients_state_dict_replies_and_its_evaluation() -> None:
    """``ClientLevelDP(FedAdam)`` run by Flower's ``start`` from ``ArrayRecord(model.state_dict())``
    with Flower's default ``fraction_evaluate=1.0``, every node a NumPyClient behind our mod."""
    arrays, keys = _state_dict_arrays()
    inner = FedAdam(weighted_by_key=UNIT_WEIGHT, min_available_nodes=4, min_train_nodes=4, min_evaluate_nodes=4)
    strategy = ClientLevelDP(inner, num_clients=4, sample_rate=0.5, sampling="fixed", clip_norm=1.0,
                             noise_multiplier=1.0, delta=1e-3, secure=False)  # fmt: skip
    result = strategy.start(InProcessGrid(nodes=4, app=_spy_app()), arrays, num_rounds=2)
    fits = [seen for seen in Spy.seen if "evaluate" not in seen]
    evaluations = [seen for seen in Spy.seen if "evaluate" in seen]
    assert len(fits) == 2 * 2 and len(evaluations) == 2 * 4  # m = 2 train a round; every node evaluates
    # Every reply bound, screened and accepted (before: every one rejected as "shape"); the release accounted.
    counts = strategy.last_round_counts
    assert counts is not None and counts["accepted"] == 2 and sum(counts["rejected"].values()) == 0
    assert strategy.account.rounds_released == 2
    assert list(result.arrays.keys()) == keys
    # The nodes evaluated the released model; FedAdam's mean of their metrics, each reply of unit weight
    # (ClientLevelDP): loss 1 + partition and accuracy 0.25 * partition over partitions 0..3.
    released = [result.arrays[key].numpy() for key in keys]
    for seen in evaluations[-4:]:
        assert all(np.array_equal(p, r) for p, r in zip(seen["parameters"], released, strict=True))
    for server_round in (1, 2):
        metrics = result.evaluate_metrics_clientapp[server_round]
        assert metrics["loss"] == pytest.approx(2.5) and metrics["accuracy"] == pytest.approx(0.375)


def test_an_evaluate_message_round_trips_through_the_numpy_clients_evaluate() -> None:
    """Flower's evaluate message (``arrays`` + ``config``) reaches ``NumPyClient.evaluate`` as
    ``EvaluateIns``, and the ``EvaluateRes`` comes back as the one MetricRecord ``FedAvg.aggregate_evaluate``
    averages by ``num-examples``."""
    arrays, keys = _state_dict_arrays()
    grid = InProcessGrid(nodes=2, app=_spy_app())
    strategy = FedAvg(min_available_nodes=2, min_evaluate_nodes=2)
    replies = grid.send_and_receive(strategy.configure_evaluate(3, arrays, ConfigRecord({"batch": 8}), grid))
    assert len(Spy.seen) == len(replies) == 2
    for seen in Spy.seen:
        assert all(np.array_equal(p, arrays[k].numpy()) for p, k in zip(seen["parameters"], keys, strict=True))
        assert seen["config"] == {"batch": 8, "server-round": 3}
    for answer in replies:
        pid = answer.metadata.src_node_id - 1  # the node's own partition: Flower's message names none
        assert list(answer.content.keys()) == ["metrics"]
        assert dict(answer.content["metrics"]) == {"accuracy": 0.25 * pid, "loss": 1.0 + pid, "num-examples": 5 + pid}
    aggregated = strategy.aggregate_evaluate(3, replies)
    assert aggregated is not None
    assert aggregated["loss"] == pytest.approx((1.0 * 5 + 2.0 * 6) / 11)
    assert aggregated["accuracy"] == pytest.approx((0.0 * 5 + 0.25 * 6) / 11)


def test_a_numpy_client_without_evaluate_answers_an_error_and_legacy_messages_pass_through() -> None:
    class FitOnly(NumPyClient):
        def fit(self, parameters, config):
            return parameters, 1, {}

    app = ClientApp(client_fn=lambda context: FitOnly().to_client(), mods=[numpy_client_mod])
    grid = InProcessGrid(nodes=1, app=app)
    arrays, _ = _state_dict_arrays()
    strategy = FedAvg(min_available_nodes=1, min_evaluate_nodes=1)
    (answer,) = grid.send_and_receive(strategy.configure_evaluate(1, arrays, ConfigRecord(), grid))
    assert answer.has_error() and "evaluate failed" in answer.error.reason  # not KeyError: 'evaluateins.parameters'
    # A legacy message (fitins.*) is Flower's legacy handler's: the mod leaves it and its reply alone.
    legacy = fitins_to_recorddict(FitIns(ndarrays_to_parameters([np.ones(3, np.float32)]), {"lr": 0.1}), True)
    (answer,) = grid.send_and_receive([Message(legacy, dst_node_id=1, message_type=MessageType.TRAIN)])
    assert "fitres.parameters" in answer.content and "arrays" not in answer.content


# ----- InstructedNumPyClient ----------------------------------------------------------------------------------------


def _fit_config(strategy: FederatedStrategy, fault: str = "") -> dict[str, Any]:
    instructions = strategy.train_instructions(SERVER_ROUND).to_config_record()
    return {**instructions, "fault": fault}


def test_fit_returns_global_plus_the_cohort_paths_update_and_raises_for_a_rejected_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    strategy = build("strategy=dp_fedsam", *SMALL)
    initial = _initial()
    update = [np.full(w.shape, 1e-3, np.float64) for w in initial]
    calls: list[tuple[Any, ...]] = []

    def fake(parameters, ins, partition_ids, faults, engine, shared_mask):
        calls.append((ins.server_round, partition_ids, faults, engine, shared_mask))
        stats = {"pre_clip_norm": [0.3], "train_loss": [1.5], "train_accuracy": [0.25], "num_steps": [2.0]}
        return CohortResult(total=update, accepted=list(partition_ids), metrics=stats, num_examples=21)

    monkeypatch.setattr(numpy_client, "train_cohort", fake)
    client = InstructedNumPyClient(4)
    assert client.get_parameters({}) == []
    named = client.get_parameters({"model": "cnn", "data.dataset": "fashion_mnist", "seed": 0})
    assert all(np.array_equal(a, b) for a, b in zip(named, initial, strict=True))  # the ServerApp's initial model
    trained, examples, metrics = client.fit(initial, _fit_config(strategy))
    assert calls == [(SERVER_ROUND, [4], [""], "sequential", None)]
    assert examples == 21
    assert metrics == {"pre_clip_norm": 0.3, "train_loss": 1.5, "train_accuracy": 0.25, "num_steps": 2.0}
    for t, g, u in zip(trained, initial, update, strict=True):
        assert t.dtype == np.float32
        assert np.array_equal(t, (g.astype(np.float64) + u).astype(np.float32))
    assert all(np.array_equal(a, b) for a, b in zip(client.get_parameters({}), trained, strict=True))

    def rejected(parameters, ins, partition_ids, faults, engine, shared_mask):
        result = CohortResult(total=update)
        result.rejected["nonfinite"].append(partition_ids[0])
        return result

    monkeypatch.setattr(numpy_client, "train_cohort", rejected)
    with pytest.raises(ClientRejectedError, match="partition 4: nonfinite"):
        client.fit(initial, _fit_config(strategy))


def test_train_config_has_our_client_train_with_sam_and_no_client_mechanism_in_flowers_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a Flower strategy (no instructions of its own): the config's data, model and local SAM, no client
    clipping or noise, and the round of Flower's ``server-round`` key (lr decay and shuffles move on)."""
    seen: list[Any] = []

    def fake(parameters, ins, partition_ids, faults, engine, shared_mask):
        seen.append(ins)
        return CohortResult(total=[np.zeros_like(p, np.float64) for p in parameters], accepted=list(partition_ids),
                            metrics={}, num_examples=3)  # fmt: skip

    monkeypatch.setattr(numpy_client, "train_cohort", fake)
    config = compose_config(list(SMALL))
    record = numpy_client.train_config(config)
    for server_round in (1, 3):
        InstructedNumPyClient(2).fit(_initial(), {**record, "server-round": server_round})
    assert [ins.server_round for ins in seen] == [1, 3]
    ins = seen[-1]
    assert ins.training is not None and ins.training.optimizer == "sam" and ins.training.rho == config.client.rho
    assert ins.training.lr == config.client.lr and ins.recipe.kind == "dense"
    assert ins.clip_norm == 0.0 and not ins.add_noise  # the wrapper's server-side mechanism clips and noises
    assert ins.data.num_clients == 10 and ins.data.max_train_samples == 200 and ins.model == "cnn"
    assert numpy_client.train_config(config, "sgd")["training.optimizer"] == "sgd"


def _evaluated_directly(weights: list[np.ndarray], strategy: FederatedStrategy, pid: int) -> tuple[float, float, int]:
    """Loss, accuracy and size of partition ``pid`` for a freshly built model holding ``weights``."""
    x, y = client_data(strategy.train_instructions(SERVER_ROUND).data, pid)
    model = build_model_for_dataset("cnn", "fashion_mnist", seed=1)
    set_weights(model, weights)
    loss, accuracy = evaluate(model, x, y, torch.device("cpu"))
    return loss, accuracy, len(y)


def test_our_client_evaluates_the_global_model_on_its_partition() -> None:
    strategy = build("strategy=dp_fedsam", *SMALL)
    initial = _initial()
    loss, examples, metrics = InstructedNumPyClient(3).evaluate(initial, _fit_config(strategy))
    want_loss, want_accuracy, size = _evaluated_directly(initial, strategy, 3)
    assert examples == size > 0
    assert loss == pytest.approx(want_loss, rel=1e-5) and metrics == {"accuracy": pytest.approx(want_accuracy)}
    with pytest.raises(ValueError, match="evaluate needs the data and model"):
        InstructedNumPyClient(3).evaluate(initial, {"server-round": 1})  # no instructions, no fit before


def test_our_app_evaluates_with_the_instructions_of_the_nodes_last_fit() -> None:
    """Flower's evaluate config is ``{"server-round": t}``: a node evaluates the data and model of its last fit, on
    its own partition (an evaluate message names none)."""
    strategy = build("strategy=dp_fedsam", *SMALL)
    initial = _initial()
    plan = _plan(strategy, initial)
    grid = InProcessGrid(nodes=2, app=numpy_client.app)
    assert not any(reply.has_error() for reply in grid.send_and_receive(plan.messages))
    content = RecordDict({"arrays": ArrayRecord(initial), "config": ConfigRecord({"server-round": 1})})
    nodes = sorted({message.metadata.dst_node_id for message in plan.messages})
    messages = [Message(content, dst_node_id=node, message_type=MessageType.EVALUATE) for node in nodes]
    for answer in grid.send_and_receive(messages):
        loss, accuracy, size = _evaluated_directly(initial, strategy, answer.metadata.src_node_id - 1)
        metrics = answer.content["metrics"]
        assert sorted(metrics.keys()) == ["accuracy", "loss", "num-examples"] and metrics["num-examples"] == size
        assert metrics["loss"] == pytest.approx(loss, rel=1e-5) and metrics["accuracy"] == pytest.approx(accuracy)


def test_a_client_that_raises_is_an_error_reply_counted_as_failed() -> None:
    strategy = build("strategy=dp_fedsam", *SMALL)
    initial = _initial()
    plan = _plan(strategy, initial)
    pids = [ids[0] for _, ids in plan.sent]
    strategy = build("strategy=dp_fedsam", *SMALL, f"fault_injection.raise_partitions=[{pids[0]}]")
    plan = _plan(strategy, initial)
    replies = InProcessGrid(nodes=2, app=numpy_client.app).send_and_receive(plan.messages)
    failed = [r for r in replies if r.has_error()]
    assert len(failed) == 1 and "failed" in failed[0].error.reason
    # Only the faulty client failed: the round counts it as failed (the other trained for real: one local step).
    outcome = strategy.aggregator.aggregate(plan, replies)
    assert outcome.stats["failed"] == 1 and outcome.stats["aggregated"] == len(pids) - 1


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(("strategy=dp_fedsam", "privacy.placement=server"), id="dp_fedsam-server-placement"),
        pytest.param(("strategy=dp_fedsam", "privacy.placement=client"), id="dp_fedsam-client-placement"),
        pytest.param(("strategy=fed_smp_randk", "privacy.placement=server"), id="fed_smp_randk-shared-mask"),
    ],
)
def test_the_numpy_client_trains_what_our_client_app_trains(overrides: tuple[str, ...]) -> None:
    strategy = build(*overrides, *SMALL)
    initial = _initial()
    plan = _plan(strategy, initial)
    ours = InProcessGrid(nodes=2).send_and_receive(plan.messages)  # apps.client_app.train
    theirs = InProcessGrid(nodes=2, app=numpy_client.app).send_and_receive(plan.messages)
    assert len(ours) == len(theirs) == 2
    for mine, other in zip(ours, theirs, strict=True):
        assert not mine.has_error() and not other.has_error()
        cohort = CohortReply.from_record(mine.content)
        flower = FlowerReply.from_record(other.content)
        # The trained model is global + our update, rounded once to float32: bit for bit.
        for trained, g, total in zip(flower.trained, initial, cohort.total, strict=True):
            assert trained.dtype == np.float32
            assert np.array_equal(trained, (g.astype(np.float64) + total).astype(np.float32))
        # The update moved the model (and the server's Δ is within half a float32 ulp of ours, coordinate by
        # coordinate: the one rounding).
        assert any(np.any(t != 0) for t in cohort.total)
        for trained, g, total in zip(flower.trained, initial, cohort.total, strict=True):
            server_delta = trained.astype(np.float64) - g
            assert np.all(np.abs(server_delta - total) <= np.spacing(np.abs(trained)) / 2)
        assert flower.metrics == {k: v[0] for k, v in cohort.metrics.items()}
        assert flower.num_examples == int(mine.content["metrics"]["num_examples"])

    # What the server makes of them.
    outcome_ours = strategy.aggregator.aggregate(plan, ours)
    plan = _plan(strategy, initial)
    _push_ids(plan)
    outcome_theirs = strategy.aggregator.aggregate(plan, theirs)
    assert outcome_ours.stats["aggregated"] == 2
    if strategy.placement.clients_add_noise:
        # Flower's convention cannot say that the client added its noise: refused, counted.
        assert outcome_theirs.stats["rejected_malformed"] == 2 and outcome_theirs.stats["aggregated"] == 0
        return
    for key in ("aggregated", "reclipped", "failed", "rejected_malformed", "rejected_shape", "rejected_nonfinite"):
        assert outcome_theirs.stats[key] == outcome_ours.stats[key], key
    assert outcome_theirs.stats["client_norms"] == outcome_ours.stats["client_norms"]
    assert outcome_theirs.stats["train_loss"] == outcome_ours.stats["train_loss"]
    for a, b in zip(outcome_theirs.new_weights, outcome_ours.new_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
