"""Tests for clients/numpy_client.py: Flower NumPyClients under our strategies.

:func:`numpy_client_mod` lets ``ClientApp(client_fn=...)`` (Flower's legacy handler, which reads ``fitins.*``) answer
our Message-API train messages in Flower's convention; :class:`InstructedNumPyClient` is our client behind it, a
cohort of one of :func:`clients.cohort.train_cohort`. Every message and reply goes through Flower's wire format to
the app, called as Flower's engine calls a ClientApp (:class:`tests.helpers.InProcessGrid`).

Our ClientApp (``apps.client_app.train``) and the NumPyClient give the same client: the NumPyClient's trained model
is, bit for bit, the float32 rounding of global + our ClientApp's update (what a NumPyClient sends is a model, so the
server's Δ = trained − global is that update up to this one rounding), with the same statistics and example count.
The data are real Fashion-MNIST partitions of the first 200 training images, the model the paper CNN, one local step.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp

import clients.numpy_client as numpy_client
from clients.cohort import CohortResult
from clients.numpy_client import ClientRejectedError, InstructedNumPyClient, numpy_client_mod, unpack_mask
from fl_app.instructions import CohortReply, FlowerReply
from fl_app.models import build_model_for_dataset, get_weights
from strategies.base import FederatedStrategy
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


def test_a_message_carrying_a_cohort_is_refused() -> None:
    overrides = [o for o in SMALL if not o.startswith("simulation.cohort_size=")]
    strategy = build("strategy=dp_fedsam", *overrides, "simulation.cohort_size=2")
    plan = _plan(strategy, _initial())
    assert [len(ids) for _, ids in plan.sent] == [2]
    (answer,) = InProcessGrid(nodes=2, app=_spy_app()).send_and_receive(plan.messages)
    assert answer.has_error() and "simulation.cohort_size=1" in answer.error.reason
    assert Spy.seen == []


def test_the_mod_answers_the_partition_query() -> None:
    query = Message(
        RecordDict({"config": ConfigRecord({"query": "partition"})}), dst_node_id=2, message_type=MessageType.QUERY
    )
    (answer,) = InProcessGrid(nodes=3, app=_spy_app()).send_and_receive([query])
    assert dict(answer.content["partition"]) == {"partition-id": 1, "num-partitions": 3}


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
    outcome = strategy.aggregate(plan, replies)
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
    outcome_ours = strategy.aggregate(plan, ours)
    plan = _plan(strategy, initial)
    _push_ids(plan)
    outcome_theirs = strategy.aggregate(plan, theirs)
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
