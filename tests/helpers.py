"""Shared test helpers: updates of known norm, strategies built from conf/, real flwr Messages without a
ServerApp, and a fake Grid with the two methods ``FederatedStrategy.start()`` uses."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict
from hydra.utils import get_class

from fl_app.config import compose_config
from fl_app.privacy.mechanisms import global_l2_norm
from strategies.base import FederatedStrategy


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


def build(*overrides: str) -> FederatedStrategy:
    """Compose conf/ with ``overrides`` and instantiate the configured strategy class.

    The fake grids here are not Flower's in-memory grid, so ``secure_noise=auto`` would pick the CSPRNG; the
    tests pin the seeded streams unless they set ``privacy.secure_noise`` themselves.
    """
    if not any(o.startswith("privacy.secure_noise=") for o in overrides):
        overrides = (*overrides, "privacy.secure_noise=false")
    config = compose_config(list(overrides))
    return get_class(config.strategy.target)(config)


def prime(
    strategy: FederatedStrategy,
    global_weights: list[np.ndarray],
    sampled: int,
    partitions: range = range(1000),
    server_round: int | None = None,
) -> None:
    """Leave the strategy in the state ``configure_train`` leaves it in before ``aggregate``:

    ``_global`` the global model of the round, ``_shapes`` its tensor shapes (replies are checked against them),
    ``_sampled`` the number of train messages sent (replies that never arrive are counted as failed),
    ``_awaiting`` the partitions whose reply is expected (any other, or a second one, is rejected) and, with
    ``server_round``, the round's shared mask.
    """
    strategy._global = [np.array(w, copy=True) for w in global_weights]
    strategy._shapes = [tuple(w.shape) for w in global_weights]
    strategy._sampled = sampled
    strategy._awaiting = set(partitions)
    if server_round is not None:
        strategy._round_mask = strategy.round_mask(server_round)


def train_message(partition_id: int) -> Message:
    return Message(
        RecordDict({"config": ConfigRecord({"partition_id": partition_id})}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )


def reply(
    partition_id: int, update: list[np.ndarray], pre_clip_norm: float | None = None, to: Message | None = None
) -> Message:
    norm = global_l2_norm(update) if pre_clip_norm is None else pre_clip_norm
    metrics = MetricRecord(
        {
            "partition_id": partition_id,
            "pre_clip_norm": norm,
            "train_loss": 0.1,
            "train_accuracy": 0.5,
            "num_examples": 10,
        }
    )
    content = RecordDict({"arrays": ArrayRecord(update), "metrics": metrics})
    return Message(content, reply_to=train_message(partition_id) if to is None else to)


def error_reply(partition_id: int) -> Message:
    return Message(Error(code=1, reason="boom"), reply_to=train_message(partition_id))


class FakeGrid:
    """The part of flwr's Grid that ``start()`` uses; every client answers a zero update (or an error)."""

    def __init__(self, mode: str = "zeros") -> None:
        self.mode = mode
        self.sent: list[list[int]] = []  # partition ids sent per round

    def get_node_ids(self) -> list[int]:
        return [1, 2]

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        self.sent.append([int(m.content["config"]["partition_id"]) for m in messages])
        replies = []
        for msg in messages:
            pid = int(msg.content["config"]["partition_id"])
            if self.mode == "errors":
                replies.append(Message(Error(code=1, reason="boom"), reply_to=msg))
                continue
            shapes = [w.shape for w in msg.content["arrays"].to_numpy_ndarrays()]
            replies.append(reply(pid, zeros(shapes), pre_clip_norm=0.0, to=msg))
        return replies
