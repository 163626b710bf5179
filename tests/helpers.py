"""Shared test helpers: updates of known norm, strategies built from conf/, real flwr Messages without a
ServerApp, and a fake Grid with the two methods ``FederatedStrategy.start()`` uses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.superlink.grid import InMemoryGrid

from fl_app.config import compose_config
from fl_app.instructions import CohortReply
from fl_app.metrics import read_metrics
from fl_app.node_queries import answer_query
from fl_app.privacy.mechanisms import global_l2_norm
from strategies.aggregation import RoundInFlight
from strategies.base import FederatedStrategy
from strategies.registry import build_strategy
from strategies.rounds import RoundPlan


def random_update(shapes, scale: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(scale * rng.standard_normal(shape)).astype(np.float32) for shape in shapes]


def with_norm(shapes, norm: float, seed: int) -> list[np.ndarray]:
    update = random_update(shapes, 1.0, seed)
    factor = norm / global_l2_norm(update)
    return [(u.astype(np.float64) * factor).astype(np.float32) for u in update]


def zeros(shapes) -> list[np.ndarray]:
    return [np.zeros(shape, dtype=np.float32) for shape in shapes]


def flat(arrays) -> np.ndarray:
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def delta(new: list[np.ndarray], old: list[np.ndarray]) -> list[np.ndarray]:
    return [n.astype(np.float64) - o.astype(np.float64) for n, o in zip(new, old, strict=True)]


def build(*overrides: str, **run) -> FederatedStrategy:
    """Compose conf/ with ``overrides`` and instantiate the configured strategy class, with the run's extras
    (``metrics``, ``checkpoint_dir``, ``resume_from``, ``on_accounted``) as its constructor takes them.

    The fake grids here are not Flower's in-memory grid, so ``secure_noise=auto`` would pick the CSPRNG and
    ``client_statistics=auto`` would publish none; the tests pin the seeded streams (allowed on such a grid, which
    counts as a deployment) and raw statistics unless they set ``privacy.secure_noise`` /
    ``privacy.client_statistics`` themselves, and allow the default ``population=virtual`` on such a grid
    (``allow_virtual_deployment``) unless they set it.
    """
    if not any(o.startswith("privacy.secure_noise=") for o in overrides):
        overrides = (*overrides, "privacy.secure_noise=false")
    if "privacy.secure_noise=false" in overrides and not any("allow_seeded_deployment" in o for o in overrides):
        overrides = (*overrides, "privacy.allow_seeded_deployment=true")
    if not any(o.startswith("privacy.client_statistics=") for o in overrides):
        overrides = (*overrides, "privacy.client_statistics=raw")
    if not any(o.startswith("allow_virtual_deployment=") for o in overrides):
        overrides = (*overrides, "allow_virtual_deployment=true")
    config = compose_config(list(overrides))
    return build_strategy(config, **run)


def prime(
    strategy: FederatedStrategy,
    global_weights: list[np.ndarray],
    sampled: int,
    partitions: range | list[int] = range(1000),
    server_round: int = 1,
) -> RoundPlan:
    """A round plan as ``plan_round`` makes one, for replies built by hand: the strategy's own instructions and
    round mask for ``server_round``, ``sampled`` clients said to be sampled (replies that never arrive count as
    failed), and one train message per partition in ``partitions`` as a grid has sent it (to node 1, with message
    id ``m<partition>``: :func:`reply` answers it; any other, or a second answer, is rejected)."""
    weights = [np.array(w, copy=True) for w in global_weights]
    return RoundPlan(
        server_round=server_round,
        global_weights=weights,
        instructions=strategy.train_instructions(server_round),
        sampled=sampled,
        sent=[(train_message(pid), [pid]) for pid in partitions],
        mask=strategy.round_mask(server_round, weights, []),
    )


def end_round(strategy, plan: RoundPlan, replies: list[Message] | None = None) -> None:
    """Flower's aggregate_train for ``plan``'s round (planned with ``plan_round``, not configure_train), with
    ``replies`` (none by default): the round's end, which is what changes the strategy (the previous global model).
    ``strategy`` is a strategy or a client-level DP layer (the round is in flight in the private rounds it runs)."""
    rounds = getattr(strategy, "strategy", strategy)
    rounds.in_flight = RoundInFlight(plan, rounds.aggregator.receiver(plan), takes_early=True)
    strategy.aggregate_train(plan.server_round, [] if replies is None else replies)


def push(messages: list[Message], prefix: str = "p") -> list[Message]:
    """Give ``messages`` the ids a grid assigns when it sends them (replies are bound to those ids)."""
    for i, message in enumerate(messages):
        message.metadata.__dict__["_message_id"] = f"{prefix}{i}"
    return messages


def train_message(partition_id: int) -> Message:
    """The train message of ``partition_id`` (a cohort of one) as a grid has sent it: to node 1, with message id
    ``m<partition>``."""
    message = Message(
        RecordDict({"config": ConfigRecord({"partition_ids": [partition_id], "faults": [""]})}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )
    message.metadata.__dict__["_message_id"] = f"m{partition_id}"  # what Flower's grids do on push
    return message


def partition_of(message: Message) -> int:
    """The partition of a one-client train message (a cohort of one)."""
    (pid,) = message.content["config"]["partition_ids"]
    return int(pid)


def reply(
    partition_id: int, update: list[np.ndarray], pre_clip_norm: float | None = None, to: Message | None = None
) -> Message:
    """One client's reply (a cohort of one, accepted) with ``update``."""
    norm = global_l2_norm(update) if pre_clip_norm is None else pre_clip_norm
    answer = CohortReply(
        total=list(update),
        accepted=[float(partition_id)],
        metrics={"pre_clip_norm": [norm], "train_loss": [0.1], "train_accuracy": [0.5], "num_steps": [1.0]},
        rejected={"failed": [], "nonfinite": [], "shape": []},
        reclipped=0,
        num_examples=10,
    )
    return Message(answer.to_record(), reply_to=train_message(partition_id) if to is None else to)


def cohort_reply(to: Message, partition_ids: list[int], total: list[np.ndarray]) -> Message:
    """A cohort reply (the wire format of :class:`fl_app.instructions.CohortReply`) in which every client was
    accepted with a zero norm."""
    k = len(partition_ids)
    reply = CohortReply(
        total=total,
        accepted=[float(p) for p in partition_ids],
        metrics={"pre_clip_norm": [0.0] * k, "train_loss": [0.1] * k, "train_accuracy": [0.5] * k,
                 "num_steps": [1.0] * k},
        rejected={"failed": [], "nonfinite": [], "shape": []},
        reclipped=0,
        num_examples=10 * k,
    )  # fmt: skip
    return Message(reply.to_record(), reply_to=to)


def error_reply(partition_id: int) -> Message:
    return Message(Error(code=1, reason="boom"), reply_to=train_message(partition_id))


class AnswersOnPush:
    """Flower's push and pull for a fake grid that answers in ``send_and_receive``: the push hands the messages to
    it, and the next pull returns every reply it gave (strategies/messaging.py pushes and pulls). The queries a
    server sends before its first train message (fl_app/node_queries.py) are answered as our ClientApp answers
    them (:meth:`answer_queries`), without counting as a round's messages."""

    def push_messages(self, messages):
        messages = list(messages)
        if messages and all(m.metadata.message_type == MessageType.QUERY for m in messages):
            self._answered = self.answer_queries(messages)
        else:
            self._answered = list(self.send_and_receive(messages))
        return [m.metadata.message_id for m in messages]

    def answer_queries(self, messages):
        nodes = self.get_node_ids()
        for i, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = f"q{i}"  # what Flower's grids do on push
        replies = []
        for msg in messages:
            node_config = {"partition-id": nodes.index(msg.metadata.dst_node_id), "num-partitions": len(nodes)}
            replies.append(answer_query(msg, node_config))
        return replies

    def pull_messages(self, message_ids):
        answered, self._answered = getattr(self, "_answered", []), []
        return answered


class FakeGrid(AnswersOnPush):
    """The part of flwr's Grid that ``start()`` uses; every client answers a zero update (or an error)."""

    def __init__(self, mode: str = "zeros", nodes: int = 2) -> None:
        self.mode = mode
        self.nodes = list(range(1, nodes + 1))
        self.sent: list[list[int]] = []  # partition ids sent per round
        self._pushes = 0

    def get_node_ids(self) -> list[int]:
        return self.nodes

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        round_ids: list[int] = []
        for i, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = f"r{self._pushes}-{i}"  # what Flower's grids do on push
        self._pushes += 1
        replies = []
        for msg in messages:
            shapes = [w.shape for w in msg.content["arrays"].to_numpy_ndarrays()]
            ids = [int(p) for p in msg.content["config"]["partition_ids"]]  # a cohort, or a cohort of one
            round_ids.extend(ids)
            if self.mode == "errors":
                replies.append(Message(Error(code=1, reason="boom"), reply_to=msg))
                continue
            replies.append(cohort_reply(msg, ids, zeros(shapes)))
        self.sent.append(sorted(round_ids))
        return replies


class MovingUpdates(FakeGrid):
    """Every client answers a small update of its own in every round, so the average moves the model."""

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        server_round = int(messages[0].metadata.group_id) if messages else 0
        replies = super().send_and_receive(messages, timeout)
        for k, r in enumerate(replies):
            shapes = [a.shape for a in r.content["arrays"].to_numpy_ndarrays()]
            r.content["arrays"] = ArrayRecord(random_update(shapes, 1e-3, seed=server_round * 100 + k))
        return replies


class CrashInRound(FakeGrid):
    """The server dies (KeyboardInterrupt, as a SIGINT would) while round ``crash_round`` is under way, after the
    earlier rounds released their models."""

    def __init__(self, crash_round: int) -> None:
        super().__init__()
        self.crash_round = crash_round

    def send_and_receive(self, messages, timeout=None):
        if len(self.sent) + 1 == self.crash_round:
            raise KeyboardInterrupt("killed")
        return super().send_and_receive(messages, timeout)


class InProcessGrid(AnswersOnPush, InMemoryGrid):
    """Flower's simulation engine without Ray: each train message goes through Flower's wire format (protobuf serde)
    to the real ClientApp handler (``apps.client_app.train``) in this process, and its reply back the same way.
    A handler that raises becomes an error reply, as under the engine. ``is_simulation`` holds (an in-memory
    grid), so ``auto`` settings resolve as in a simulation (seeded streams, raw statistics, one cohort a node).

    With ``app`` (a ``flwr.clientapp.ClientApp``) the messages go to that app instead, called as Flower's engine
    calls a ClientApp (``app(message, context)``), with the node config the simulation engine gives node i of n
    (``partition-id`` i − 1, ``num-partitions`` n) and the node's own state across rounds."""

    def __init__(self, nodes: int = 2, app: ClientApp | None = None) -> None:
        # Flower's in-memory grid needs a LinkState; this one does not
        self.node_ids = list(range(1, nodes + 1))
        self.sent: list[int] = []  # messages per round
        self._pushes = 0
        self.app = app
        self._states: dict[int, RecordDict] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        for i, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"ip{self._pushes}-{i}"  # what a grid does on push
        replies = [self._deliver(message) for message in messages]
        self._pushes += 1
        self.sent.append(len(messages))
        return replies

    def answer_queries(self, messages):
        """Queries go to the app too (ours answers them; a ClientApp without a query handler fails them)."""
        for i, message in enumerate(messages):
            message.metadata.__dict__["_message_id"] = f"iq{i}"
        return [self._deliver(message) for message in messages]

    def _deliver(self, message):
        from flwr.app import Context
        from flwr.common.serde import message_from_proto, message_to_proto

        from apps.client_app import query, train

        received = message_from_proto(message_to_proto(message))
        node = message.metadata.dst_node_id
        node_config = {"partition-id": node - 1, "num-partitions": len(self.node_ids)}
        state = self._states.setdefault(node, RecordDict())
        context = Context(run_id=1, node_id=node, node_config=node_config, state=state, run_config={})
        ours = query if received.metadata.message_type == MessageType.QUERY else train
        try:
            answer = ours(received, context) if self.app is None else self.app(received, context)
        except Exception as exc:  # the engine turns a ClientApp exception into an error reply
            answer = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=received)
        return message_from_proto(message_to_proto(answer))


#: Strategies whose run states "not covered" (fed_smp_topk as published: data-dependent top-k support;
#: noisy_fedprox: Thm 4's argument does not hold as proven) and the non-private references.
NOT_COVERED = {"fed_smp_topk", "noisy_fedprox"}
NON_PRIVATE = {"fedavg", "fedsam"}
#: Strategies whose ε after 2 rounds of the small runs is the first round's: DP-FedAvg without amplification under the
#: cyclic rule b = 1/q = 5 > 2 rounds (each client takes part once; the identity factorization's sensitivity is 1).
ONE_PARTICIPATION_PER_RUN = {"dp_fedavg_unamplified"}


def assert_two_round_run(run: Path, name: str) -> None:
    """A completed 2-round run of strategy ``name`` in ``run``: every round aggregated, test metrics, ε growing
    (or none for the references), the guarantee it states, a finite final model."""
    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "completed"
    records = read_metrics(run / "metrics.jsonl")
    assert [r["round"] for r in records] == [1, 2]
    assert all(r["aggregated"] > 0 and r["failed"] == 0 for r in records)
    assert all(math.isfinite(r["test_loss"]) and 0 <= r["test_accuracy"] <= 1 for r in records)
    guarantee = meta["dp_guarantee"]
    if name in NON_PRIVATE:
        assert guarantee.startswith("none")
        assert records[-1]["epsilon"] is None
    elif name in NOT_COVERED:
        assert guarantee.startswith("not covered:")
        assert 0 < records[0]["epsilon"] < records[1]["epsilon"] < math.inf  # what the (uncovering) bound says
    else:
        assert "-DP" in guarantee and not guarantee.startswith("not covered")
        if name in ONE_PARTICIPATION_PER_RUN:
            # Independent noise under a participation rule that lets each client in once in these 2 rounds: the
            # worst case, one Gaussian release, is reached by the first round already.
            assert 0 < records[0]["epsilon"] == records[1]["epsilon"] < math.inf
        else:
            assert 0 < records[0]["epsilon"] < records[1]["epsilon"] < math.inf
        assert meta["rounds_released"] == 2
    if name.startswith("noisy_"):
        assert records[-1]["gdp_mu"] > 0 and "assumes L" in guarantee
    with np.load(run / "final_model.npz") as model:
        assert all(np.isfinite(model[k]).all() for k in model.files)


#: A DP-FedSAM run small enough for the peer benchmark's replay and floors (tests/bench).
TINY_PEER_RUN = [
    "strategy=dp_fedsam",
    "dataset.num_clients=50",
    "dataset.max_train_samples=1000",
    "privacy.sampling=fixed",
    "privacy.sample_rate=0.1",
    "client.local_epochs=2",
]


# ----- a small noiseless population for the server's reply screening tests ------------------------------------------

#: Two tensors: the model the screening tests' replies train.
SCREENING_SHAPES: list[tuple[int, ...]] = [(3, 4), (5,)]
#: M = 20 clients, q = 0.5: the fixed denominator m = qM = 10; C = 0.2 (conf/privacy/default.yaml); no noise.
SCREENING_POPULATION = (
    "strategy=dp_fedavg",
    "dataset.num_clients=20",
    "privacy.sample_rate=0.5",
    "privacy.noise_multiplier=0",
    "privacy.placement=server",
    "population=virtual",
)
SCREENING_C, SCREENING_M = 0.2, 10.0
