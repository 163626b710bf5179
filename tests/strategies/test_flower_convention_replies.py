"""Replies in Flower's Message-API convention (any Flower ClientApp): screened into the same contribution as ours.

A reply that does not name its clients (``cohort_ids``: our :class:`~fl_app.instructions.CohortReply`) is read as
Flower's convention (:class:`~fl_app.instructions.FlowerReply`: the trained model under ``arrays``, ``num-examples``
in the MetricRecord ``metrics``). For the message of one partition the server computes Δ = trained − global itself
(float64), screens it like our replies and admits it as a cohort of one, re-clipped to C under server placement;
``num-examples`` is checked, never used as a weight. Under client placement (or a noisy-model recipe) such a reply is
refused: nothing in it says the client added its share of the noise.

The end-to-end tests drive the strategy's ``start()`` over :class:`tests.helpers.InProcessGrid` with Flower
ClientApps of this file's own (nothing of our ``clients/`` package on the client side): a Message-API ClientApp
(``@app.train()``) and a ``NumPyClient`` behind ``ClientApp(client_fn=..., mods=[numpy_client_mod])``, both plain SGD
in numpy on a tiny synthetic softmax regression.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp

from clients.numpy_client import numpy_client_mod
from fl_app.node_queries import answer_query
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.ledger import SampledGaussianLedger
from strategies.base import FederatedStrategy
from strategies.population import PopulationError
from strategies.rounds import RoundOutcome, RoundPlan
from strategies.screening import screen
from tests.helpers import (
    SCREENING_C,
    SCREENING_M,
    SCREENING_POPULATION,
    SCREENING_SHAPES,
    InProcessGrid,
    build,
    prime,
    reply,
    with_norm,
)

SHAPES, POP, C, M = SCREENING_SHAPES, SCREENING_POPULATION, SCREENING_C, SCREENING_M
COUNTERS = ("aggregated", "rejected_malformed", "rejected_nonfinite", "rejected_shape", "failed")


def _global() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]


def _trained(old: list[np.ndarray], update: list[np.ndarray]) -> list[np.ndarray]:
    """The model a client trained: global + update, in float32 as a client sends it."""
    return [(o + u).astype(np.float32) for o, u in zip(old, update, strict=True)]


def _delta(trained: list[np.ndarray], old: list[np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(t, np.float64) - np.asarray(o, np.float64) for t, o in zip(trained, old, strict=True)]


def _flower(to: Message, trained: Any, metrics: Any = None, **records: Any) -> Message:
    """A Flower-convention reply to ``to``: lists and dicts become the Array- and MetricRecord; ``records`` are
    added as they are."""
    if metrics is None:
        metrics = {"num-examples": 10, "train_loss": 0.5, "train_acc": 0.25}
    content = RecordDict(
        {
            "arrays": ArrayRecord(list(trained)) if isinstance(trained, list) else trained,
            "metrics": MetricRecord(metrics) if isinstance(metrics, dict) else metrics,
            **records,
        }
    )
    return Message(content, reply_to=to)


def _counts(stats: dict[str, Any]) -> dict[str, int]:
    return {key: int(stats[key]) for key in COUNTERS}


def _aggregate(strategy: FederatedStrategy, plan: RoundPlan, replies: list[Message]) -> RoundOutcome:
    return strategy.aggregator.aggregate(plan, replies)


# ----- admitted as a cohort of one -----------------------------------------------------------------------------


def test_a_flower_reply_is_admitted_beside_ours_as_a_cohort_of_one() -> None:
    strategy = build(*POP)
    old = _global()
    plan = prime(strategy, old, sampled=2, partitions=range(2))
    ours, theirs = with_norm(SHAPES, 0.1, seed=0), with_norm(SHAPES, 0.15, seed=1)
    trained = _trained(old, theirs)
    outcome = _aggregate(strategy, plan, [reply(0, ours), _flower(plan.messages[1], trained)])
    assert _counts(outcome.stats) == {"aggregated": 2, **dict.fromkeys(COUNTERS[1:], 0)}
    assert outcome.stats["reclipped"] == 0
    server_delta = _delta(trained, old)  # the update the server computes, in float64
    for new, o, a, b in zip(outcome.new_weights, old, ours, server_delta, strict=True):
        np.testing.assert_allclose(new, o + (a.astype(np.float64) + b) / M, rtol=1e-6, atol=1e-7)
    # Its statistics: train_loss and train_acc as it reported them, the pre-clip norm the server measured.
    assert outcome.stats["train_loss"] == pytest.approx((0.1 + 0.5) / 2)
    assert outcome.stats["train_accuracy"] == pytest.approx((0.5 + 0.25) / 2)
    assert outcome.stats["client_norms"][1] == pytest.approx(mech.global_l2_norm(server_delta), rel=1e-12)


def test_the_server_reclips_a_flower_reply_to_c() -> None:
    strategy = build(*POP)
    old = _global()
    plan = prime(strategy, old, sampled=1, partitions=[3])
    big = with_norm(SHAPES, 50 * C, seed=2)
    outcome = _aggregate(strategy, plan, [_flower(plan.messages[0], _trained(old, big))])
    assert outcome.stats["aggregated"] == 1 and outcome.stats["reclipped"] == 1
    moved = _delta(outcome.new_weights, old)
    assert mech.global_l2_norm(moved) == pytest.approx(C / M, rel=1e-5)
    assert mech.global_l2_norm(moved) <= C / M * (1 + 1e-6)
    cosine = float(np.dot(np.concatenate([m.ravel() for m in moved]), np.concatenate([b.ravel() for b in big])))
    assert cosine / (mech.global_l2_norm(moved) * mech.global_l2_norm(big)) == pytest.approx(1.0, abs=1e-5)
    assert outcome.stats["client_norms"] == [pytest.approx(50 * C, rel=1e-5)]  # before the server's clip


@pytest.mark.parametrize("name", ["dp_fedavg", "fedavg", "fedsam"])
def test_num_examples_is_not_a_weight(name: str) -> None:
    """The sum is unweighted: a client claiming a million examples counts as much as one claiming one. DP-FedAvg
    divides by m; the non-private references take the plain mean over the replies, without clipping."""
    strategy = build(f"strategy={name}", *POP[1:])
    old = _global()
    plan = prime(strategy, old, sampled=2, partitions=range(2))
    norm = 0.05 if name == "dp_fedavg" else 30.0  # the references do not clip
    updates = [with_norm(SHAPES, norm, seed=s) for s in (3, 4)]
    trained = [_trained(old, u) for u in updates]
    replies = [
        _flower(plan.messages[i], trained[i], {"num-examples": examples}) for i, examples in enumerate((1, 10**6))
    ]
    outcome = _aggregate(strategy, plan, replies)
    assert outcome.stats["aggregated"] == 2 and outcome.stats["reclipped"] == 0
    denominator = M if name == "dp_fedavg" else 2
    expected = [o + (a + b) / denominator for o, a, b in zip(old, *[_delta(t, old) for t in trained], strict=True)]
    for new, want in zip(outcome.new_weights, expected, strict=True):
        np.testing.assert_allclose(new, want, rtol=1e-6, atol=1e-6)
    assert math.isnan(outcome.stats["train_loss"])  # absent from both replies: no loss to average


# ----- hostile Flower-convention replies --------------------------------------------------------------------------


def _garbage_arrays() -> ArrayRecord:
    buffer = io.BytesIO()
    np.save(buffer, np.zeros(12, np.float32), allow_pickle=False)
    return ArrayRecord({"0": Array(dtype="float32", shape=(12,), stype="numpy.ndarray", data=buffer.getvalue()[:9])})


def _content(**records: Any) -> Callable[[Message, list[np.ndarray]], Message]:
    return lambda to, good: Message(RecordDict(records), reply_to=to)


HOSTILE: dict[str, tuple[Callable[[Message, list[np.ndarray]], Message], str]] = {
    # the model's shapes and dtype
    "wrong-shape": (lambda to, good: _flower(to, [np.zeros((4, 3), np.float32), good[1]]), "shape"),
    "missing-tensor": (lambda to, good: _flower(to, good[:1]), "shape"),
    "extra-tensor": (lambda to, good: _flower(to, [*good, np.zeros(2, np.float32)]), "shape"),
    "int-dtype": (lambda to, good: _flower(to, [g.astype(np.int32) for g in good]), "shape"),
    "empty-array-record": (lambda to, good: _flower(to, ArrayRecord()), "shape"),
    # values
    "nan": (lambda to, good: _flower(to, [np.full_like(good[0], np.nan), good[1]]), "nonfinite"),
    "inf": (lambda to, good: _flower(to, [good[0], np.full_like(good[1], -np.inf)]), "nonfinite"),
    "norm-overflows": (lambda to, good: _flower(to, [np.full(s, 1e200) for s in SHAPES]), "nonfinite"),
    # num-examples
    "no-num-examples": (lambda to, good: _flower(to, good, {"train_loss": 0.1}), "malformed"),
    "negative-num-examples": (lambda to, good: _flower(to, good, {"num-examples": -1}), "malformed"),
    "fractional-num-examples": (lambda to, good: _flower(to, good, {"num-examples": 2.5}), "malformed"),
    "nan-num-examples": (lambda to, good: _flower(to, good, {"num-examples": math.nan}), "malformed"),
    "inf-num-examples": (lambda to, good: _flower(to, good, {"num-examples": math.inf}), "malformed"),
    "list-num-examples": (lambda to, good: _flower(to, good, {"num-examples": [10]}), "malformed"),
    "num_examples-not-num-examples": (lambda to, good: _flower(to, good, {"num_examples": 10}), "malformed"),
    # the records
    "two-array-records": (lambda to, good: _flower(to, good, other=ArrayRecord(good)), "malformed"),
    "extra-config-record": (lambda to, good: _flower(to, good, config=ConfigRecord({"x": 1})), "malformed"),
    "extra-metric-record": (lambda to, good: _flower(to, good, more=MetricRecord({"num-examples": 1})), "malformed"),
    "metrics-as-config-record": (
        lambda to, good: _flower(to, good, ConfigRecord({"num-examples": 10, "train_loss": "low"})),
        "malformed",
    ),
    "arrays-under-another-key": (
        lambda to, good: _content(model=ArrayRecord(good), metrics=MetricRecord({"num-examples": 1}))(to, good),
        "malformed",
    ),
    "arrays-as-metric-record": (lambda to, good: _flower(to, MetricRecord({"0": 1.0})), "malformed"),
    "metrics-as-array-record": (lambda to, good: _flower(to, good, ArrayRecord(good)), "malformed"),
    "no-metrics": (lambda to, good: _content(arrays=ArrayRecord(good))(to, good), "malformed"),
    "nothing": (lambda to, good: _content()(to, good), "malformed"),
    "undecodable-arrays": (lambda to, good: _flower(to, _garbage_arrays()), "malformed"),
    # the statistics it may carry
    "loss-as-list": (lambda to, good: _flower(to, good, {"num-examples": 1, "train_loss": [0.1, 0.2]}), "malformed"),
    "nan-pre-clip-norm": (
        lambda to, good: _flower(to, good, {"num-examples": 1, "pre_clip_norm": math.nan}),
        "malformed",
    ),
    "negative-pre-clip-norm": (
        lambda to, good: _flower(to, good, {"num-examples": 1, "pre_clip_norm": -1.0}),
        "malformed",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_flower_reply_is_rejected_and_counted_never_fatal(case: str) -> None:
    bad, kind = HOSTILE[case]
    strategy = build(*POP)
    old = _global()
    plan = prime(strategy, old, sampled=3, partitions=range(3))
    honest = [with_norm(SHAPES, 0.1, seed=10 + p) for p in (1, 2)]
    good = _trained(old, with_norm(SHAPES, 0.1, seed=9))
    reasons: list[tuple[str, str]] = []
    taken = strategy.aggregator.receiver(plan)
    taken.reject = lambda server_round, kind_, reason: reasons.append((kind_, reason))
    taken.take([bad(plan.messages[0], good), reply(1, honest[0]), reply(2, honest[1])])
    outcome = strategy.aggregator.aggregate_taken(taken)
    expected = {"aggregated": 2, **dict.fromkeys(COUNTERS[1:], 0)}
    expected[f"rejected_{kind}"] = 1
    assert _counts(outcome.stats) == expected
    assert len(reasons) == 1 and reasons[0][0] == kind and reasons[0][1]
    for new, o, a, b in zip(outcome.new_weights, old, *honest, strict=True):
        np.testing.assert_allclose(new, o + (a.astype(np.float64) + b) / M, rtol=1e-6, atol=1e-7)


def test_a_flower_reply_to_a_cohort_message_is_malformed_for_every_client_of_it() -> None:
    strategy = build(*POP)
    old = _global()
    plan = prime(strategy, old, sampled=2, partitions=[])
    message = Message(
        RecordDict({"config": ConfigRecord({"partition_ids": [0, 1], "faults": ["", ""]})}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )
    message.metadata.__dict__["_message_id"] = "cohort"
    plan = RoundPlan(plan.server_round, plan.global_weights, plan.instructions, 2, sent=[(message, [0, 1])])
    answer = _flower(message, _trained(old, with_norm(SHAPES, 0.1, seed=0)))
    kind, reason = screen(plan, answer, [0, 1])
    assert kind == "malformed" and "one client" in str(reason)
    outcome = _aggregate(strategy, plan, [answer])
    assert outcome.stats["rejected_malformed"] == 2 and outcome.stats["aggregated"] == 0


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(
            ("strategy=dp_fedavg", "privacy.placement=client", "privacy.sampling=fixed"), id="client-placement"
        ),
        pytest.param(("strategy=noisy_fedavg",), id="noisy-model-recipe"),
    ],
)
def test_where_clients_add_the_noise_a_flower_reply_is_rejected_with_the_reason(overrides: tuple[str, ...]) -> None:
    strategy = build(*overrides, "dataset.num_clients=20", "privacy.sample_rate=0.5")
    old = _global()
    plan = prime(strategy, old, sampled=2, partitions=range(2))
    answer = _flower(plan.messages[0], _trained(old, with_norm(SHAPES, 0.1, seed=0)))
    kind, reason = screen(plan, answer, [0])
    assert kind == "malformed" and "carries no client noise" in str(reason)
    outcome = _aggregate(strategy, plan, [answer, reply(1, with_norm(SHAPES, 0.1, seed=1))])
    assert outcome.stats["rejected_malformed"] == 1 and outcome.stats["aggregated"] == 1


# ----- end to end: Flower ClientApps of this file's own under DP-FedAvg's start() -----------------------------

FEATURES, CLASSES = 8, 4
#: A plain client's lr, big enough that every update is far beyond C = 0.2: the server must clip them all.
BIG_LR = 50.0


def _local_data(partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + partition_id)
    x = rng.standard_normal((12, FEATURES)).astype(np.float32)
    return x, rng.integers(0, CLASSES, size=12)


def _sgd(weights: list[np.ndarray], partition_id: int, lr: float) -> tuple[list[np.ndarray], float]:
    """Full-batch gradient steps of a softmax regression on the partition's data; (trained weights, loss)."""
    w, b = (np.array(a, dtype=np.float32) for a in weights)
    x, y = _local_data(partition_id)
    loss = 0.0
    for _ in range(3):
        logits = x @ w + b
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        loss = float(-np.log(p[np.arange(len(y)), y]).mean())
        p[np.arange(len(y)), y] -= 1.0
        w -= lr * (x.T @ p / len(y))
        b -= lr * p.mean(axis=0)
    return [w, b], loss


class PlainNumPyClient(NumPyClient):
    """A user's NumPyClient: plain SGD on its partition, Flower's fit contract, nothing of ours."""

    def __init__(self, partition_id: int) -> None:
        self.partition_id = partition_id

    def fit(self, parameters, config):
        trained, loss = _sgd(parameters, self.partition_id, BIG_LR)
        return trained, 12, {"train_loss": loss}


def _numpy_client_app() -> ClientApp:
    def client_fn(context: Context):
        return PlainNumPyClient(int(context.node_config["partition-id"])).to_client()

    return ClientApp(client_fn=client_fn, mods=[numpy_client_mod])


def _message_api_app() -> ClientApp:
    """A Message-API ClientApp as Flower's templates write one (``@app.train()``), with no mod of ours. It trains
    the partition the message names, and says so to the server's ``binding`` query (population=virtual refuses
    a ClientApp that does not: fl_app/node_queries.py) with our answer function."""
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return answer_query(msg, context.node_config)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        (partition_id,) = msg.content["config"]["partition_ids"]  # the partition our strategy sampled
        trained, loss = _sgd(msg.content["arrays"].to_numpy_ndarrays(), int(partition_id), BIG_LR)
        metrics = MetricRecord({"train_loss": loss, "num-examples": 12})
        return Message(RecordDict({"arrays": ArrayRecord(trained), "metrics": metrics}), reply_to=msg)

    return app


class Rounds:
    """A round observer that keeps every round's released model and statistics."""

    def __init__(self) -> None:
        self.models: list[list[np.ndarray]] = []
        self.stats: list[dict[str, Any]] = []

    def round_completed(self, strategy: FederatedStrategy, server_round: int, outcome: RoundOutcome, record) -> None:
        self.models.append([np.array(w, copy=True) for w in outcome.new_weights])
        self.stats.append(dict(outcome.stats))


E2E = (
    "strategy=dp_fedavg",
    "dataset.num_clients=20",
    "privacy.sample_rate=0.25",  # m = 5
    "privacy.sampling=fixed",
    "privacy.placement=server",
    "simulation.cohort_size=1",
    "population=virtual",
    "checkpoint_every=0",
)
SIGMA, Q, M_E2E = 0.95, 0.25, 5.0


def _initial() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [0.1 * rng.standard_normal((FEATURES, CLASSES)).astype(np.float32), np.zeros(CLASSES, np.float32)]


def _run(app: ClientApp, sigma: float, rounds: int = 2, seed: int = 0) -> tuple[FederatedStrategy, Rounds]:
    observer = Rounds()
    strategy = build(*E2E, f"privacy.noise_multiplier={sigma}", f"seed={seed}", observers=[observer])
    strategy.start(InProcessGrid(nodes=2, app=app), ArrayRecord(_initial()), num_rounds=rounds)
    return strategy, observer


@pytest.mark.parametrize("make_app", [_numpy_client_app, _message_api_app], ids=["numpy-client", "message-api"])
def test_a_flower_client_app_of_our_own_under_dp_fedavg_is_clipped_noised_and_accounted(make_app) -> None:
    # Noise-free first: every reply accepted and re-clipped by the server, each round moving the model by at most
    # (aggregated)·C/m.
    _, clean_rounds = _run(make_app(), sigma=0.0)
    previous = _initial()
    for stats, model in zip(clean_rounds.stats, clean_rounds.models, strict=True):
        assert stats["aggregated"] == stats["sampled"] == M_E2E
        assert stats["failed"] == stats["rejected_malformed"] == stats["rejected_shape"] == 0
        assert stats["reclipped"] == stats["aggregated"]  # the clients' updates are far beyond C: all clipped
        assert min(stats["client_norms"]) > 10 * C
        assert math.isfinite(stats["train_loss"])  # the clients' own train_loss, averaged
        step = mech.global_l2_norm(_delta(model, previous))
        assert 0 < step <= stats["aggregated"] * C / M_E2E * (1 + 1e-6)
        previous = model

    # Noised: the same run with σ draws the same clients and updates in round 1; the released models differ from
    # the noise-free ones by the server's noise, N(0, σ²C²/m²) per coordinate.
    noisy, noisy_rounds = _run(make_app(), sigma=SIGMA)
    assert all(s["reclipped"] == s["aggregated"] == M_E2E for s in noisy_rounds.stats)
    noise = np.concatenate([d.ravel() for d in _delta(noisy_rounds.models[0], clean_rounds.models[0])])
    assert np.all(noise != 0)
    assert float(noise.std()) == pytest.approx(SIGMA * C / M_E2E, rel=0.3)  # 36 coordinates
    # Accounted: two releases of the subsampled Gaussian mechanism, as a fresh accountant says.
    assert noisy.account.ledger is not None and noisy.account.ledger.rounds == 2
    fresh = SampledGaussianLedger(1 / 20, "rdp", "fixed", 20)
    fresh.step(SIGMA, Q, rounds=2)
    assert noisy.epsilon() == pytest.approx(fresh.epsilon(), rel=1e-12)
    assert 0 < noisy.epsilon() < math.inf
    # Another seed draws other clients and other noise.
    _, other = _run(make_app(), sigma=SIGMA, rounds=1, seed=1)
    assert not all(np.array_equal(a, b) for a, b in zip(other.models[0], noisy_rounds.models[0], strict=True))


def test_a_bare_client_fn_app_is_refused_before_the_first_train_message() -> None:
    """Why clients.numpy_client has a mod: without it Flower's legacy handler looks for ``fitins.*`` records, which
    no Message-API strategy sends, and the client would train its node's own partition; under population=virtual
    the server refuses it at the binding query, before any message or release."""

    def client_fn(context: Context):
        return PlainNumPyClient(int(context.node_config["partition-id"])).to_client()

    observer = Rounds()
    strategy = build(*E2E, observers=[observer])
    grid = InProcessGrid(nodes=2, app=ClientApp(client_fn=client_fn))
    with pytest.raises(PopulationError, match="numpy_client_mod"):
        strategy.start(grid, ArrayRecord(_initial()), num_rounds=1)
    assert observer.stats == [] and grid.sent == [] and strategy.account.rounds_released == 0
