"""strategies/flower_dp/: client-level DP (DP-FedAvg; docs/client_level_dp.md) as a wrapper around Flower's own
strategies, run by Flower's own ``Strategy.start`` over an in-process grid whose nodes run a test-local ``ClientApp``
(a few SGD steps of linear regression on synthetic data), every message through Flower's wire format; and its parity
with our strategies (section 7: the accountant, the privacy events, the privacy arguments' rules, the seeded
streams)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyAccountant,
    PrivacyConfig,
    RdpAccountant,
    SamplingMethod,
)
from flwr.serverapp.strategy import (
    Bulyan,
    DifferentialPrivacyServerSideFixedClipping,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedMedian,
    FedProx,
    FedTrimmedAvg,
    FedXgbBagging,
    FedYogi,
    Krum,
    MultiKrum,
    QFedAvg,
    Strategy,
)
from flwr.superlink.grid import InMemoryGrid

from fl_app.config import ConfigError
from fl_app.empty_rounds import NoUpdateAcceptedError
from fl_app.instructions import STREAM_SAMPLING, STREAM_SERVER_NOISE
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.accountants import SampledGaussianEvent, compute_epsilon
from fl_app.privacy.ledger import SampledGaussianLedger
from fl_app.releases import ReleaseLog, model_digest
from strategies import ClientLevelDP, DPFedAvg
from strategies.flower_dp import NOISE_STREAM, SAMPLING_STREAM, UNIT_WEIGHT, replies
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)

DIM = 5
SIGMA, CLIP, DELTA = 1.0, 1.0, 1e-3

# ----------------------------------------------------------------------------------------------------------------
# A test-local ClientApp: linear regression, a few steps of plain SGD on the node's own synthetic data
# ----------------------------------------------------------------------------------------------------------------

app = ClientApp()


def _data(node_id: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(node_id)
    n = 8 + 4 * (node_id % 3)  # unequal sizes: a num-examples-weighted mean would weight them differently
    x = rng.standard_normal((n, DIM))
    y = x @ np.arange(1.0, DIM + 1.0) + 0.5 + 0.1 * rng.standard_normal(n)
    return x, y


def _loss_and_grads(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    residual = x @ w + b[0] - y
    return float(np.mean(residual**2)), 2 * x.T @ residual / len(y), np.array([2 * residual.mean()])


@app.train()
def train(message: Message, context: Context) -> Message:
    arrays = message.content["arrays"]
    w, b = arrays["w"].numpy().astype(np.float64), arrays["b"].numpy().astype(np.float64)
    dtype = arrays["w"].numpy().dtype
    x, y = _data(context.node_id)
    for _ in range(3):
        _, gw, gb = _loss_and_grads(w, b, x, y)
        w, b = w - 0.05 * gw, b - 0.05 * gb
    trained = ArrayRecord({"w": Array(w.astype(dtype)), "b": Array(b.astype(dtype))})
    return Message(RecordDict({"arrays": trained, "metrics": MetricRecord({"num-examples": len(y)})}), reply_to=message)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    arrays = message.content["arrays"]
    x, y = _data(context.node_id)
    loss, _, _ = _loss_and_grads(arrays["w"].numpy(), arrays["b"].numpy(), x, y)
    metrics = MetricRecord({"loss": loss, "num-examples": len(y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=message)


def initial(dtype=np.float32) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(DIM, dtype=dtype)), "b": Array(np.zeros(1, dtype=dtype))})


def weights(record: ArrayRecord) -> list[np.ndarray]:
    return [record["w"].numpy(), record["b"].numpy()]


#: Rewrites a node's train reply (the grid's hostile clients): (node, the message, its honest reply) -> replies.
Tamper = Callable[[int, Message, Message], list[Message]]


class ClientAppGrid(InMemoryGrid):
    """Flower's simulation engine without Ray: each message goes through Flower's wire format to the test ClientApp
    in this process, and its reply back the same way (a ClientApp exception becomes an error reply)."""

    def __init__(self, nodes: int, tamper: Tamper | None = None) -> None:  # no LinkState needed
        self.node_ids = list(range(1, nodes + 1))
        self.tamper = tamper
        self.calls: list[tuple[str, list[int]]] = []  # (message type, destination nodes) per send_and_receive
        self.train_rounds: list[dict[str, object]] = []  # what each train call sent and received
        self._pushes = 0

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        kind = messages[0].metadata.message_type if messages else ""
        self.calls.append((kind, [m.metadata.dst_node_id for m in messages]))
        replies = []
        for i, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"m{self._pushes}-{i}"  # what a grid does on push
            received = message_from_proto(message_to_proto(message))
            node = received.metadata.dst_node_id
            context = Context(run_id=1, node_id=node, node_config={}, state=RecordDict(), run_config={})
            try:
                answer = app(received, context)
            except Exception as exc:
                answer = Message(Error(code=0, reason=str(exc)), reply_to=received)
            answers = [answer]
            if self.tamper is not None and kind == MessageType.TRAIN:
                answers = self.tamper(node, received, answer)
            replies.extend(message_from_proto(message_to_proto(a)) for a in answers)
        self._pushes += 1
        if kind == MessageType.TRAIN:
            sent = {m.metadata.dst_node_id: m for m in messages}
            self.train_rounds.append({"sent": sent, "replies": replies})
        return replies

    def train_calls(self) -> list[list[int]]:
        return [nodes for kind, nodes in self.calls if kind == MessageType.TRAIN]


def wrapper(inner: Strategy | None = None, **overrides) -> ClientLevelDP:
    settings = {
        "num_clients": 10,
        "sample_rate": 0.5,
        "clip_norm": CLIP,
        "noise_multiplier": SIGMA,
        "delta": DELTA,
        "secure": False,
        "seed": 3,
    }
    settings.update(overrides)
    return ClientLevelDP(FedAvg(weighted_by_key=UNIT_WEIGHT) if inner is None else inner, **settings)


def sampled_nodes(seed: int, k: int, population: int, q: float) -> list[int]:
    """The nodes the seeded Poisson sampler picks in the k-th round the wrapper starts (nodes 1..M, sorted): our
    strategies' sampling stream (seed, k, STREAM_SAMPLING)."""
    rng = mech.random_source(False, seed, k, STREAM_SAMPLING)
    return [int(i) + 1 for i in mech.poisson_sample(population, q, rng)]


def round_noise(seed: int, k: int, std: float) -> list[np.ndarray]:
    """Z of the k-th seeded round, drawn here independently of the wrapper: our strategies' server noise stream
    (seed, k, STREAM_SERVER_NOISE), tensor by tensor."""
    rng = mech.random_source(False, seed, k, STREAM_SERVER_NOISE)
    return mech.add_gaussian_noise([np.zeros(DIM), np.zeros(1)], std, rng)


def expected_release(grid: ClientAppGrid, index: int, strategy: ClientLevelDP, seed: int = 3) -> list[np.ndarray]:
    """w + (1/m) Σ clip(trained_i − w, C) + Z for train call ``index``, from the honest replies the grid returned."""
    record = grid.train_rounds[index]
    sent = list(record["sent"].values())
    w0 = [a.astype(np.float64) for a in weights(sent[0].content["arrays"])] if sent else None
    total = [np.zeros(DIM), np.zeros(1)]
    for reply in record["replies"]:
        if reply.has_error():
            continue
        trained = [a.astype(np.float64) for a in weights(reply.content["arrays"])]
        clipped, _ = mech.clip_update([t - g for t, g in zip(trained, w0, strict=True)], strategy.clip_norm)
        total = [s + c for s, c in zip(total, clipped, strict=True)]
    noise = round_noise(seed, index + 1, strategy.noise_std)
    return [g + s / strategy.expected_clients + z for g, s, z in zip(w0, total, noise, strict=True)]


# ----------------------------------------------------------------------------------------------------------------
# (1) FedAvg under Flower's own Strategy.start
# ----------------------------------------------------------------------------------------------------------------


def test_fedavg_run_by_flowers_start_is_sampled_clipped_noised_logged_and_accounted(tmp_path: Path) -> None:
    strategy = wrapper(release_dir=tmp_path)
    grid = ClientAppGrid(nodes=10)
    result = Strategy.start(strategy, grid, initial(), num_rounds=3)

    assert strategy.ledger.rounds == 3 and strategy.rounds_released == 3
    expected = compute_epsilon(SIGMA, 0.5, 3, DELTA)
    assert strategy.epsilon() == pytest.approx(expected, rel=1e-12) and 0 < expected < math.inf
    releases = ReleaseLog(tmp_path).read()
    assert [r.round for r in releases] == [1, 2, 3]
    assert {(r.noise_multiplier, r.sample_rate, r.randomness) for r in releases} == {(SIGMA, 0.5, "seeded")}
    assert releases[-1].digest == model_digest(result.arrays.to_numpy_ndarrays())
    # The wrapper's sampler chose who trained (the inner FedAvg addressed every node); FedAvg evaluated on its own.
    assert grid.train_calls() == [sampled_nodes(3, r, 10, 0.5) for r in (1, 2, 3)]
    assert all(sorted(nodes) == list(range(1, 11)) for kind, nodes in grid.calls if kind == MessageType.EVALUATE)
    # No training metrics reach Flower's ClientApp-side record; the mechanism's are kept apart, none client-derived.
    assert result.train_metrics_clientapp == {}
    published = {key for record in strategy.privacy_metrics.values() for key in record}
    assert published == {"dp-epsilon", "dp-delta", "dp-rounds-released", "dp-noise-std"}
    assert strategy.privacy_metrics[3]["dp-epsilon"] == pytest.approx(expected, rel=1e-12)
    assert "loss" in result.evaluate_metrics_clientapp[3]  # evaluation: the inner strategy's, outside ε
    assert strategy.last_round_counts is not None and strategy.last_round_counts["accepted"] == len(
        sampled_nodes(3, 3, 10, 0.5)
    )
    # The released model keeps the model's dtypes, and is the fixed-denominator noisy average (float32 rounding).
    assert [a.dtype for a in weights(result.arrays)] == [np.float32, np.float32]
    for got, want in zip(weights(result.arrays), expected_release(grid, 2, strategy), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    guarantee = strategy.dp_guarantee()
    assert guarantee["rounds_released"] == 3 and guarantee["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert guarantee["expected_clients"] == 5.0 and guarantee["noise_std"] == pytest.approx(SIGMA * CLIP / 5)
    assert "-DP" in guarantee["dp_guarantee"]

    # Releases logged in release_dir are spent: a later CSPRNG wrapper on it starts with them accounted; a seeded
    # one would draw their noise again and is refused.
    again = wrapper(release_dir=tmp_path, secure=True)
    assert again.ledger.rounds == 3 and again.epsilon() == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="noise"):
        wrapper(release_dir=tmp_path, secure=False)


# ----------------------------------------------------------------------------------------------------------------
# (2) FedAdam: the Adam step is post-processing of the noisy mean
# ----------------------------------------------------------------------------------------------------------------


def test_fedadam_steps_on_the_fixed_denominator_noisy_mean_and_is_accounted(tmp_path: Path) -> None:
    inner = FedAdam(weighted_by_key=UNIT_WEIGHT, fraction_evaluate=0.0, eta=0.05)
    strategy = wrapper(inner, release_dir=tmp_path)
    grid = ClientAppGrid(nodes=10)
    result = Strategy.start(strategy, grid, initial(np.float64), num_rounds=1)
    # FedAdam's first moment after one round is (1 − β1)·(mean − w): the mean it got is w + ΣΔ̃/m + Z exactly.
    w0 = [np.zeros(DIM), np.zeros(1)]
    mean = expected_release(grid, 0, strategy)
    assert inner.m_t is not None
    for key, got_mean, g in zip(("w", "b"), mean, w0, strict=True):
        np.testing.assert_allclose(inner.m_t[key], (1 - inner.beta_1) * (got_mean - g), rtol=0, atol=1e-12)
    # A second start() counts its rounds from 1 again; the seeded streams are keyed by the rounds started (k = 2,
    # 3), so no release reuses round 1's noise.
    result = Strategy.start(strategy, grid, result.arrays, num_rounds=2)
    assert strategy.rounds_started == 3
    assert strategy.ledger.rounds == 3 and len(ReleaseLog(tmp_path).read()) == 3
    assert strategy.epsilon() == pytest.approx(compute_epsilon(SIGMA, 0.5, 3, DELTA), rel=1e-12)
    assert all(np.isfinite(a).all() for a in weights(result.arrays))
    assert ReleaseLog(tmp_path).read()[-1].digest == model_digest(result.arrays.to_numpy_ndarrays())


def test_secure_randomness_samples_and_noises_from_the_os_csprng(tmp_path: Path) -> None:
    strategy = wrapper(secure=True, sampling="fixed", release_dir=tmp_path)
    grid = ClientAppGrid(nodes=10)
    result = Strategy.start(strategy, grid, initial(), num_rounds=2)
    assert [len(nodes) for nodes in grid.train_calls()] == [5, 5]  # exactly m = qM without replacement
    assert strategy.epsilon() == pytest.approx(compute_epsilon(SIGMA, 0.5, 2, DELTA, sampling="fixed", population=10))
    assert [r.randomness for r in ReleaseLog(tmp_path).read()] == ["os-csprng", "os-csprng"]
    assert strategy.dp_guarantee()["neighbouring"] == "replace one client"
    assert all(np.isfinite(a).all() for a in weights(result.arrays))


@pytest.mark.parametrize("inner_class", [FedAvgM, FedProx, FedYogi, FedAdagrad])
def test_other_mean_aggregators_run_and_account(inner_class) -> None:
    extra = {"server_momentum": 0.9} if inner_class is FedAvgM else {}
    extra |= {"proximal_mu": 0.1} if inner_class is FedProx else {}
    strategy = wrapper(inner_class(weighted_by_key=UNIT_WEIGHT, fraction_evaluate=0.0, **extra))
    grid = ClientAppGrid(nodes=10)
    result = Strategy.start(strategy, grid, initial(), num_rounds=2)
    assert strategy.ledger.rounds == 2
    assert all(np.isfinite(a).all() and a.dtype == np.float32 for a in weights(result.arrays))
    if inner_class is FedProx:  # the inner strategy's config goes along to the sampled clients
        sent = next(iter(grid.train_rounds[0]["sent"].values()))
        assert sent.content["config"]["proximal-mu"] == 0.1


# ----------------------------------------------------------------------------------------------------------------
# (3) Exactness and clipping
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_release_is_exactly_global_plus_clipped_sum_over_m_plus_the_rounds_noise(sampling: str) -> None:
    strategy = wrapper(sampling=sampling, clip_norm=0.3)  # C small enough that some updates are clipped
    grid = ClientAppGrid(nodes=10)
    result = Strategy.start(strategy, grid, initial(np.float64), num_rounds=2)
    want = expected_release(grid, 1, strategy)
    norms = []
    for reply in grid.train_rounds[1]["replies"]:
        sent = grid.train_rounds[1]["sent"][reply.metadata.src_node_id]
        update = [t - g for t, g in zip(weights(reply.content["arrays"]), weights(sent.content["arrays"]), strict=True)]
        norms.append(mech.global_l2_norm(update))
    assert max(norms) > 0.3  # clipping was exercised
    if sampling == "fixed":
        assert all(len(nodes) == 5 for nodes in grid.train_calls())
    for got, expected in zip(weights(result.arrays), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def huge_update_from_node_1(node: int, message: Message, honest: Message) -> list[Message]:
    """Node 1 moves the model by 1e6 along (1, ..., 1); every other node returns the global model unchanged."""
    arrays = message.content["arrays"]
    w, b = arrays["w"].numpy(), arrays["b"].numpy()
    shift = 1e6 if node == 1 else 0.0
    trained = ArrayRecord({"w": Array(w + shift), "b": Array(b + shift)})
    claims = MetricRecord({"num-examples": 10**9})
    return [Message(RecordDict({"arrays": trained, "metrics": claims}), reply_to=message)]


def test_one_huge_update_moves_the_model_by_at_most_c_over_m_plus_the_noise() -> None:
    # q = 1: every node is sampled, m = M = 10; node 1 claims a billion examples too (ignored: unit weights).
    strategy = wrapper(sample_rate=1.0)
    grid = ClientAppGrid(nodes=10, tamper=huge_update_from_node_1)
    result = Strategy.start(strategy, grid, initial(np.float64), num_rounds=1)
    noise = round_noise(3, 1, strategy.noise_std)
    moved = [got - z for got, z in zip(weights(result.arrays), noise, strict=True)]  # from w = 0
    assert mech.global_l2_norm(moved) == pytest.approx(CLIP / 10, rel=1e-9)
    direction = np.concatenate(moved) / np.linalg.norm(np.concatenate(moved))
    np.testing.assert_allclose(direction, np.full(DIM + 1, 1 / math.sqrt(DIM + 1)), atol=1e-9)


# ----------------------------------------------------------------------------------------------------------------
# (4) Refusals before the first message
# ----------------------------------------------------------------------------------------------------------------


def test_a_num_examples_weighted_fedavg_is_refused_for_its_sensitivity() -> None:
    with pytest.raises(ValueError, match="sensitivity") as raised:
        wrapper(FedAvg())
    assert UNIT_WEIGHT in str(raised.value) and "num-examples" in str(raised.value)
    with pytest.raises(ValueError, match="sensitivity"):
        wrapper(FedAdam(weighted_by_key="my-weight"))


@pytest.mark.parametrize(
    "inner",
    [
        FedMedian(weighted_by_key=UNIT_WEIGHT),
        FedTrimmedAvg(weighted_by_key=UNIT_WEIGHT),
        Krum(weighted_by_key=UNIT_WEIGHT),
        MultiKrum(weighted_by_key=UNIT_WEIGHT),
        Bulyan(weighted_by_key=UNIT_WEIGHT),
        QFedAvg(client_learning_rate=0.1, weighted_by_key=UNIT_WEIGHT),
        FedXgbBagging(weighted_by_key=UNIT_WEIGHT),
    ],
    ids=lambda s: type(s).__name__,
)
def test_strategies_that_do_not_aggregate_by_the_mean_are_refused(inner: FedAvg) -> None:
    with pytest.raises(ValueError, match="not FedAvg's unweighted mean"):
        wrapper(inner)


def test_non_fedavg_strategies_and_fedavg_subclasses_with_their_own_aggregation_are_refused() -> None:
    flower_dp = DifferentialPrivacyServerSideFixedClipping(FedAvg(), 1.0, 1.0, 5)
    with pytest.raises(ValueError, match="FedAvg-family"):
        wrapper(flower_dp)

    class Sneaky(FedAvg):
        def aggregate_train(self, server_round, replies):
            return super().aggregate_train(server_round, list(replies)[:1])

    with pytest.raises(ValueError, match="aggregate_train"):
        wrapper(Sneaky(weighted_by_key=UNIT_WEIGHT))

    patched = FedAvg(weighted_by_key=UNIT_WEIGHT)
    patched.aggregate_train = Sneaky.aggregate_train.__get__(patched)
    with pytest.raises(ValueError, match="aggregate_train"):
        wrapper(patched)

    class Logged(FedAdam):  # a subclass that does not touch the aggregation is fine
        pass

    wrapper(Logged(weighted_by_key=UNIT_WEIGHT))


@pytest.mark.parametrize(
    ("inner", "match"),
    [
        (FedAvg(weighted_by_key=UNIT_WEIGHT, fraction_train=0.5), "fraction_train=1.0"),
        (FedAvg(weighted_by_key=UNIT_WEIGHT, min_available_nodes=11), "min_available_nodes"),
        (FedAvg(weighted_by_key=UNIT_WEIGHT, min_train_nodes=11), "min_train_nodes"),
        (FedAvg(weighted_by_key=UNIT_WEIGHT, train_metrics_aggr_fn=lambda records, key: MetricRecord()),
         "train_metrics_aggr_fn"),
    ],
)  # fmt: skip
def test_inner_settings_that_sample_wait_or_read_the_replies_are_refused(inner: FedAvg, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        wrapper(inner)


@pytest.mark.parametrize(
    ("overrides", "argument"),
    [
        ({"num_clients": 0}, "num_clients"),
        ({"num_clients": 10.0}, "num_clients"),
        ({"num_clients": True}, "num_clients"),
        ({"sample_rate": 0.0}, "sample_rate"),
        ({"sample_rate": 1.5}, "sample_rate"),
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"clip_norm": math.inf}, "clip_norm"),
        ({"noise_multiplier": -0.5}, "noise_multiplier"),
        ({"noise_multiplier": math.nan}, "noise_multiplier"),
        ({"noise_multiplier": math.inf}, "noise_multiplier"),
        ({"noise_multiplier": True}, "noise_multiplier"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"sampling": "uniform"}, "sampling"),
        ({"sampling": "cyclic"}, "sampling"),  # a participation-rule sampler: not what this accounting assumes
        ({"accountant": "gdp"}, "accountant"),
        ({"sampling": "fixed", "sample_rate": 0.25}, "sample_rate"),  # q*M = 2.5 is not a whole number
        ({"sampling": "fixed", "accountant": "prv"}, "accountant"),
        ({"max_epsilon": 0.0}, "max_epsilon"),
        ({"max_epsilon": math.inf}, "max_epsilon"),
        ({"secure": 1}, "secure"),
        ({"seed": -1}, "seed"),
    ],
)
def test_arguments_are_validated_and_the_message_names_the_argument(overrides: dict, argument: str) -> None:
    with pytest.raises(ValueError, match=f"^ClientLevelDP argument {argument}="):
        wrapper(**overrides)


def test_numpy_scalars_are_taken_as_the_numbers_they_hold() -> None:
    strategy = wrapper(
        num_clients=np.int64(10), sample_rate=np.float32(0.5), clip_norm=np.float64(1.0), seed=np.int32(3)
    )
    assert (strategy.num_clients, strategy.sample_rate, strategy.clip_norm, strategy.seed) == (10, 0.5, 1.0, 3)
    assert type(strategy.sample_rate) is float and strategy.expected_clients == 5.0


def test_a_grid_whose_nodes_are_not_the_population_is_refused_before_any_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replies, "CONNECT_WAIT_S", 0.2)  # the first round waits that long for the missing node
    strategy = wrapper()  # M = 10
    grid = ClientAppGrid(nodes=9)
    with pytest.raises(ValueError, match="9 connected nodes"):
        Strategy.start(strategy, grid, initial(), num_rounds=1)
    assert grid.calls == [] and strategy.ledger.rounds == 0


def test_a_model_with_integer_tensors_is_refused_before_any_message() -> None:
    grid = ClientAppGrid(nodes=10)
    arrays = ArrayRecord({"w": Array(np.zeros(DIM, np.float32)), "steps": Array(np.zeros(1, np.int64))})
    with pytest.raises(ValueError, match="floating point"):
        Strategy.start(wrapper(), grid, arrays, num_rounds=1)
    assert grid.calls == []


# ----------------------------------------------------------------------------------------------------------------
# (5) Hostile replies
# ----------------------------------------------------------------------------------------------------------------


def _reply(message: Message, content: RecordDict) -> Message:
    return Message(content, reply_to=message)


def hostile(node: int, message: Message, honest: Message) -> list[Message]:
    arrays = message.content["arrays"]
    w, b = arrays["w"].numpy(), arrays["b"].numpy()
    metrics = MetricRecord({"num-examples": 10})

    def record(**tensors: np.ndarray) -> RecordDict:
        return RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in tensors.items()}), "metrics": metrics})

    if node == 1:
        return [_reply(message, record(w=np.full_like(w, np.nan), b=b))]
    if node == 2:
        return [_reply(message, record(w=np.zeros(DIM + 1), b=b))]  # wrong shape
    if node == 3:  # two ArrayRecords
        two = RecordDict({"a": ArrayRecord({"w": Array(w), "b": Array(b)}), "c": ArrayRecord({"w": Array(w),
                          "b": Array(b)}), "metrics": metrics})  # fmt: skip
        return [_reply(message, two)]
    if node == 4:
        return [Message(Error(code=1, reason="boom"), reply_to=message)]
    if node == 5:
        return [_reply(message, record(weights=w, bias=b))]  # wrong keys
    if node == 6:  # an Array whose bytes are not a numpy array
        garbage = Array(dtype="float64", shape=(DIM,), stype="numpy.ndarray", data=b"not an array")
        return [_reply(message, RecordDict({"arrays": ArrayRecord({"w": garbage, "b": Array(b)}),
                                            "metrics": metrics}))]  # fmt: skip
    if node == 7:  # the honest reply, then a second answer to the same message
        return [honest, _reply(message, record(w=w + 100.0, b=b))]
    if node == 8:  # a reply forged as node 99 to node 8's message, then the honest one
        forged_to = Message(RecordDict(), dst_node_id=99, message_type=MessageType.TRAIN)
        forged_to.metadata.__dict__["_message_id"] = message.metadata.message_id
        return [_reply(forged_to, record(w=w + 100.0, b=b)), honest]
    if node == 9:  # the honest reply, and one to a message this round never sent
        unknown = Message(RecordDict(), dst_node_id=9, message_type=MessageType.TRAIN)
        unknown.metadata.__dict__["_message_id"] = "never-sent"
        return [honest, _reply(unknown, record(w=w + 100.0, b=b))]
    if node == 10:
        return []  # never answers
    return [honest]


def test_hostile_replies_are_rejected_and_counted_and_the_round_is_still_released(tmp_path: Path) -> None:
    strategy = wrapper(num_clients=12, sample_rate=1.0, release_dir=tmp_path)  # every node sampled, m = 12
    grid = ClientAppGrid(nodes=12, tamper=hostile)
    result = Strategy.start(strategy, grid, initial(np.float64), num_rounds=1)
    assert strategy.last_round_counts == {
        "sampled": 12,
        "replies": 14,  # 12 nodes: node 10 silent, 7, 8 and 9 two replies each
        "accepted": 5,  # nodes 7, 8, 9, 11, 12
        "missing": 1,
        # Our strategies' vocabulary: the two answers to no message of node 8's and 9's, node 7's second answer and
        # nodes 3's and 6's layouts are malformed; node 4's error failed.
        "rejected": {"failed": 1, "malformed": 5, "shape": 2, "nonfinite": 1},
    }
    assert strategy.ledger.rounds == 1 and len(ReleaseLog(tmp_path).read()) == 1
    # The release is w + (1/m) Σ over the accepted honest replies + Z.
    w0 = [np.zeros(DIM), np.zeros(1)]
    total = [np.zeros(DIM), np.zeros(1)]
    for node in (7, 8, 9, 11, 12):
        honest = app(grid.train_rounds[0]["sent"][node], Context(1, node, {}, RecordDict(), {}))
        clipped, _ = mech.clip_update(weights(honest.content["arrays"]), CLIP)
        total = [s + c for s, c in zip(total, clipped, strict=True)]
    noise = round_noise(3, 1, strategy.noise_std)
    for got, g, s, z in zip(weights(result.arrays), w0, total, noise, strict=True):
        np.testing.assert_allclose(got, g + s / 12 + z, rtol=0, atol=1e-12)


def test_a_reply_with_integer_arrays_is_rejected_as_shape_as_our_strategies_screen_it() -> None:
    """One dtype policy (strategies/screening.py's trained_update): every released coordinate gets noise, so a
    trained model must be floating, whoever screens it."""

    def integers(node: int, message: Message, honest: Message) -> list[Message]:
        if node != 1:
            return [honest]
        arrays = honest.content["arrays"]
        cast = ArrayRecord({k: Array(np.round(arrays[k].numpy()).astype(np.int64)) for k in arrays})
        return [_reply(message, RecordDict({"arrays": cast, "metrics": MetricRecord({"num-examples": 10})}))]

    strategy = wrapper(sample_rate=1.0)
    Strategy.start(strategy, ClientAppGrid(nodes=10, tamper=integers), initial(np.float64), num_rounds=1)
    assert strategy.last_round_counts["accepted"] == 9
    assert strategy.last_round_counts["rejected"] == {"failed": 0, "malformed": 0, "shape": 1, "nonfinite": 0}


def test_a_round_with_no_accepted_reply_still_releases_the_noise_and_is_accounted() -> None:
    def everyone_fails(node: int, message: Message, honest: Message) -> list[Message]:
        return [Message(Error(code=1, reason="boom"), reply_to=message)]

    strategy = wrapper(sample_rate=1.0)
    grid = ClientAppGrid(nodes=10, tamper=everyone_fails)
    result = Strategy.start(strategy, grid, initial(np.float64), num_rounds=1)
    assert strategy.last_round_counts["accepted"] == 0 and strategy.last_round_counts["rejected"]["failed"] == 10
    assert strategy.ledger.rounds == 1
    for got, z in zip(weights(result.arrays), round_noise(3, 1, strategy.noise_std), strict=True):
        np.testing.assert_allclose(got, z, rtol=0, atol=1e-15)  # w = 0: the release is Z


def test_a_run_in_which_nobody_trains_fails_after_max_empty_rounds_with_every_release_accounted() -> None:
    """The same policy as our strategies' (fl_app/empty_rounds.py): noise-only rounds are warned about, and after
    ``max_empty_rounds`` of them in a row the run fails, naming the causes, with each release accounted."""

    def everyone_fails(node: int, message: Message, honest: Message) -> list[Message]:
        return [Message(Error(code=1, reason="boom"), reply_to=message)]

    strategy = wrapper(sample_rate=1.0, max_empty_rounds=2)
    grid = ClientAppGrid(nodes=10, tamper=everyone_fails)
    with pytest.raises(NoUpdateAcceptedError, match=r"2 consecutive rounds .*failed: 10 reply\(ies\)"):
        Strategy.start(strategy, grid, initial(np.float64), num_rounds=5)
    assert strategy.ledger.rounds == 2
    assert strategy.epsilon() == pytest.approx(compute_epsilon(SIGMA, 1.0, 2, DELTA), rel=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# (6) Budget guard
# ----------------------------------------------------------------------------------------------------------------


def test_budget_guard_stops_before_the_round_that_would_pass_max_epsilon(tmp_path: Path) -> None:
    eps2, eps3 = (compute_epsilon(SIGMA, 0.5, t, DELTA) for t in (2, 3))
    strategy = wrapper(max_epsilon=(eps2 + eps3) / 2, release_dir=tmp_path)
    grid = ClientAppGrid(nodes=10)
    result = Strategy.start(strategy, grid, initial(), num_rounds=5)
    assert strategy.ledger.rounds == 2 and strategy.epsilon() == pytest.approx(eps2, rel=1e-12)
    assert strategy.stop_reason is not None and "max_epsilon" in strategy.stop_reason
    # Rounds 3-5 sent no training message; the model is round 2's release.
    train_calls = [nodes for kind, nodes in grid.calls if kind != MessageType.EVALUATE]
    assert [len(nodes) > 0 for nodes in train_calls] == [True, True, False, False, False]
    assert sorted(strategy.privacy_metrics) == [1, 2] and result.train_metrics_clientapp == {}
    assert ReleaseLog(tmp_path).read()[-1].digest == model_digest(result.arrays.to_numpy_ndarrays())
    assert strategy.aggregate_train(6, []) == (None, None)


# ----------------------------------------------------------------------------------------------------------------
# (7) Parity with our strategies (strategies/base.py): accountant, privacy events, σ rules, seeded streams
# ----------------------------------------------------------------------------------------------------------------


def ours(**overrides) -> DPFedAvg:
    """Our DP-FedAvg over the wrapper's default settings (M = 10, q = 0.5, C, σ, δ, seed 3, seeded randomness)."""
    settings = {"num_clients": 10, "sample_rate": 0.5, "clip_norm": CLIP, "noise_multiplier": SIGMA, "delta": DELTA,
                "seed": 3, "secure_noise": False}  # fmt: skip
    settings.update(overrides)
    return DPFedAvg(**settings)


def flower_config(population: int = 10, fixed: bool = False) -> PrivacyConfig:
    sampling = SamplingMethod.WITHOUT_REPLACEMENT if fixed else SamplingMethod.POISSON
    relation = NeighboringRelation.REPLACE_ONE if fixed else NeighboringRelation.ADD_OR_REMOVE_ONE
    return PrivacyConfig(target_delta=DELTA, population_size=population, neighboring_relation=relation,
                         sampling_method=sampling)  # fmt: skip


@pytest.mark.parametrize("name", ["rdp", "prv", "pld"])
def test_the_accountant_is_our_ledgers_with_flowers_interface(name: str) -> None:
    strategy = wrapper(accountant=name)
    assert strategy.accountant is strategy.ledger.accountant
    assert PrivacyAccountant in type(strategy.accountant).__mro__  # Flower's Protocol, subclassed explicitly
    assert isinstance(strategy.ledger, SampledGaussianLedger)  # the ledger our strategies keep (make_ledger)
    reference = SampledGaussianLedger(DELTA, name, "poisson", 10).accountant
    assert type(strategy.accountant) is type(reference)
    assert strategy.accountant.state_dict() == reference.state_dict()
    assert strategy.dp_guarantee()["accountant"] == name


def test_the_accountant_accounts_every_release_and_answers_flowers_questions() -> None:
    strategy = wrapper()
    Strategy.start(strategy, ClientAppGrid(nodes=10), initial(), num_rounds=2)
    accountant = strategy.accountant
    assert accountant.num_releases == 2
    assert accountant.get_epsilon(DELTA) == pytest.approx(compute_epsilon(SIGMA, 0.5, 2, DELTA), rel=1e-12)
    assert accountant.get_epsilon(DELTA) == strategy.epsilon()
    assert accountant.get_privacy_spent(DELTA).num_releases == 2


def test_releases_compose_our_strategies_privacy_events_through_the_same_ledger() -> None:
    strategy, reference = wrapper(), ours()
    assert strategy.account.budget.events(SIGMA, 0.5) == reference.account.budget.events(SIGMA, 0.5)
    assert strategy.account.budget.events(SIGMA, 0.5) == [SampledGaussianEvent(SIGMA, 0.5)]
    Strategy.start(strategy, ClientAppGrid(nodes=10), initial(), num_rounds=3)
    for _ in range(3):
        reference.account.budget.account()
    assert strategy.ledger.state_dict() == reference.ledger.state_dict()  # the same composition, event for event
    assert strategy.epsilon() == reference.epsilon() == pytest.approx(compute_epsilon(SIGMA, 0.5, 3, DELTA), rel=1e-12)


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_a_flower_accountant_instance_accounts_the_releases_as_it_does_for_our_strategies(sampling: str) -> None:
    fixed = sampling == "fixed"
    flowers = RdpAccountant(flower_config(fixed=fixed))
    strategy = wrapper(accountant=flowers, sampling=sampling)
    assert strategy.accountant is flowers
    Strategy.start(strategy, ClientAppGrid(nodes=10), initial(), num_rounds=2)
    assert flowers.num_releases == 2 and strategy.rounds_released == 2
    # Flower's event: m = qM = 5 of M = 10; the multiplier over the relation's sensitivity (2C under replace-one).
    expected = RdpAccountant(flower_config(fixed=fixed))
    expected.compose(GaussianPrivacyEvent(SIGMA / 2 if fixed else SIGMA, sample_size=5, population_size=10), 2)
    assert strategy.epsilon() == pytest.approx(expected.get_epsilon(DELTA), rel=1e-12)
    assert strategy.privacy_metrics[2]["dp-epsilon"] == pytest.approx(expected.get_epsilon(DELTA), rel=1e-12)
    assert strategy.dp_guarantee()["accountant"] == "flwr-rdp"
    # Our strategy given the same kind of accountant spends the same.
    reference = ours(sampling=sampling, accountant=RdpAccountant(flower_config(fixed=fixed)))
    for _ in range(2):
        reference.account.budget.account()
    assert reference.epsilon() == strategy.epsilon()


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: {"accountant": RdpAccountant(flower_config(population=11))}, ValueError, "population_size"),
        (lambda: {"accountant": RdpAccountant(flower_config(fixed=True))}, ValueError, "sampling_method"),
        (lambda: {"accountant": RdpAccountant(flower_config()), "noise_multiplier": 0.0}, ValueError,
         "^ClientLevelDP argument accountant=flwr-rdp: .*σ > 0"),
        (lambda: {"accountant": RdpAccountant(flower_config()), "sample_rate": 0.25}, ValueError,
         "^ClientLevelDP argument accountant=flwr-rdp: .*not an integer"),
        (lambda: {"accountant": object()}, TypeError, "PrivacyAccountant interface"),
    ],
    ids=["population", "sampling", "sigma-0", "fractional-m", "not-an-accountant"],
)  # fmt: skip
def test_a_flower_accountant_that_cannot_account_the_run_is_refused_at_construction(make, error, match) -> None:
    with pytest.raises(error, match=match):
        wrapper(**make())


def test_both_layers_state_one_run_json_claim_from_one_account() -> None:
    """ClientLevelDP over Flower's FedAvg and our DP-FedAvg with the same settings: the same account (client_dp/
    account.py), so the same claim, key for key and value for value, beside what only the Flower layer adds."""
    strategy, reference = wrapper(), ours()
    ours_claim = reference.dp_guarantee()
    flower_claim = strategy.dp_guarantee()
    flower_only = {"sampling", "num_clients", "noise_std", "not_covered"}
    ours_only = {"client_statistics"}  # what our rounds publish about clients; the Flower layer publishes none
    assert set(flower_claim) - flower_only == set(ours_claim) - ours_only
    for key in set(ours_claim) - ours_only:
        assert flower_claim[key] == ours_claim[key], key
    assert type(strategy.account) is type(reference.account)


def test_sigma_zero_runs_without_noise_and_states_epsilon_as_our_strategies_do(tmp_path: Path) -> None:
    strategy = wrapper(noise_multiplier=0.0, release_dir=tmp_path)
    assert strategy.noise_std == 0.0
    grid = ClientAppGrid(nodes=10)
    result = Strategy.start(strategy, grid, initial(np.float64), num_rounds=2)
    # w + (1/m) Σ clip(Δ_i, C), no noise (round_noise of std 0 is zeros).
    for got, want in zip(weights(result.arrays), expected_release(grid, 1, strategy), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    assert strategy.rounds_released == 2 and [r.noise_multiplier for r in ReleaseLog(tmp_path).read()] == [0.0, 0.0]
    assert strategy.epsilon() == math.inf and strategy.accountant.get_epsilon(DELTA) == math.inf
    assert strategy.privacy_metrics[2]["dp-epsilon"] == math.inf
    # Our DP-FedAvg with σ = 0 accounts the same events and states the same claim.
    reference = ours(noise_multiplier=0.0)
    for _ in range(2):
        reference.account.budget.account()
    assert reference.epsilon() == math.inf
    assert (
        strategy.dp_guarantee()["dp_guarantee"]
        == reference.dp_guarantee()["dp_guarantee"]
        == (f"client-level (inf, {DELTA:.3g})-DP")
    )
    assert strategy.ledger.state_dict() == reference.ledger.state_dict()


def test_sigma_zero_under_a_budget_stops_before_the_first_round_as_our_strategies_do() -> None:
    strategy = wrapper(noise_multiplier=0.0, max_epsilon=10.0)
    grid = ClientAppGrid(nodes=10)
    result = Strategy.start(strategy, grid, initial(), num_rounds=3)
    assert [nodes for kind, nodes in grid.calls if kind != MessageType.EVALUATE] == [[], [], []]  # nothing sent
    assert strategy.rounds_released == 0 and strategy.epsilon() == 0.0
    assert strategy.stop_reason is not None and "max_epsilon" in strategy.stop_reason
    assert result.train_metrics_clientapp == {} and strategy.privacy_metrics == {}
    assert ours(noise_multiplier=0.0, max_epsilon=10.0).account.budget.over_budget(1) is not None


@pytest.mark.parametrize(
    "overrides",
    [
        {"noise_multiplier": 0.0},
        {"noise_multiplier": -1.0},
        {"delta": None},
        {"sampling": "fixed", "accountant": "prv"},
    ],
    ids=["sigma-0", "sigma-negative", "delta-none", "fixed-prv"],
)
def test_privacy_arguments_are_accepted_and_refused_as_our_strategies_config_does(overrides: dict) -> None:
    try:
        reference = ours(**overrides)
    except ConfigError as refused:
        key = str(refused).split("=")[0].removeprefix("invalid config value privacy.")
        with pytest.raises(ConfigError, match=f"^ClientLevelDP argument {key}="):
            wrapper(**overrides)
        return
    strategy = wrapper(**overrides)
    p = reference.config.privacy
    assert (strategy.noise_multiplier, strategy.delta, strategy.sampling) == (p.noise_multiplier, p.delta, p.sampling)
    assert strategy.accountant_name == p.accountant


def test_seeded_sampling_and_noise_are_our_strategies_streams() -> None:
    assert (SAMPLING_STREAM, NOISE_STREAM) == (STREAM_SAMPLING, STREAM_SERVER_NOISE)
    strategy, reference = wrapper(), ours()
    grid = ClientAppGrid(nodes=10)
    result = Strategy.start(strategy, grid, initial(np.float64), num_rounds=2)
    # Round k samples the clients our DP-FedAvg of the same seed samples in round k (node = client + 1)...
    assert grid.train_calls() == [[int(c) + 1 for c in reference.sample_clients(k)] for k in (1, 2)]
    # ... and draws its noise from the stream our strategies' server noise of round k comes from.
    assert reference.noise_key is None  # privacy.noise_stream=shared: the seed's stream
    ours_noise = mech.add_gaussian_noise([np.zeros(DIM), np.zeros(1)], strategy.noise_std,
                                         reference.randomness.noise_rng(2, STREAM_SERVER_NOISE))  # fmt: skip
    for a, b in zip(ours_noise, round_noise(3, 2, strategy.noise_std), strict=True):
        np.testing.assert_array_equal(a, b)
    for got, want in zip(weights(result.arrays), expected_release(grid, 1, strategy), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
