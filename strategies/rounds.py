"""The data of one round: the plan :meth:`~strategies.base.FederatedStrategy.plan_round` makes and
:meth:`~strategies.base.FederatedStrategy.aggregate` takes (no per-round state lives on the strategy), a screened
reply, and what aggregation produced."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from fl_app.config import AppConfig, FaultInjectionConfig
from fl_app.instructions import (
    LocalTrainingConfig,
    NoisyLocalConfig,
    RecipeSpec,
    TrainInstructions,
    make_train_instructions,
)
from fl_app.privacy.mechanisms import NormalSource
from strategies.population import Population


class RunInstructions:
    """The run's part of every round's train instructions (data, model, recipe, local procedure, σ, m, whether the
    clients add noise, the randomness and noise key), built once for the run's randomness; each round writes its
    number and its clip norm C_t into it (:meth:`for_round`)."""

    def __init__(
        self,
        config: AppConfig,
        recipe: RecipeSpec,
        training: LocalTrainingConfig | NoisyLocalConfig,
        *,
        add_noise: bool,
        noise_multiplier: float,
        expected_clients: float,
        secure_aggregation: bool = False,
    ) -> None:
        self.config, self.recipe, self.training = config, recipe, training
        self.add_noise, self.noise_multiplier, self.expected_clients = add_noise, noise_multiplier, expected_clients
        self.secure_aggregation = secure_aggregation
        self._built: TrainInstructions | None = None

    def for_round(self, server_round: int, clip_norm: float, secure_noise: bool) -> TrainInstructions:
        """What every client of round ``server_round`` is told, at clip norm C_t = ``clip_norm``."""
        built = self._built
        if built is None or built.secure_noise != secure_noise:
            built = self._built = make_train_instructions(
                self.config, 0, recipe=self.recipe, training=self.training, clip_norm=0.0, add_noise=self.add_noise,
                noise_multiplier=self.noise_multiplier, expected_clients=self.expected_clients,
                secure_noise=secure_noise, secure_aggregation=self.secure_aggregation,
            )  # fmt: skip
        return replace(built, server_round=server_round, clip_norm=clip_norm)


@dataclass
class RoundPlan:
    """One round as :meth:`FederatedStrategy.plan_round` planned it, and all :meth:`FederatedStrategy.aggregate`
    needs of it: no per-round state lives on the strategy.

    ``sent`` pairs each train message with the partitions it carries (one client, or a cohort); the grid assigns
    the message ids on sending, and a reply counts only as the answer to one of these, from the node it went to,
    once (:meth:`bind`).
    """

    server_round: int
    global_weights: list[np.ndarray]
    instructions: TrainInstructions
    sampled: int
    sent: list[tuple[Message, list[int]]] = field(default_factory=list)
    #: The round's public shared mask (Fed-SMP), None = dense.
    mask: list[np.ndarray] | None = None
    #: True when each message carries a cohort of clients and is answered with their sum.
    cohort_mode: bool = False
    #: The server's noise source for the round when it is drawn ahead (:meth:`RoundAggregator.draw_noise_ahead`,
    #: fl_app/privacy/prefetch.py); None: drawn when the average is.
    server_noise: NormalSource | None = None
    #: Partitions whose answer is still expected (those the messages carry); binding a reply removes its partitions.
    awaiting: set[int] = field(init=False)

    def __post_init__(self) -> None:
        self.awaiting = {pid for _, ids in self.sent for pid in ids}

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [tuple(w.shape) for w in self.global_weights]

    @property
    def messages(self) -> list[Message]:
        return [message for message, _ in self.sent]

    def bind(self, reply: Message) -> list[int] | None:
        """The partitions of the message ``reply`` answers, or None if it answers none of this round's messages
        (a stale reply to an earlier round, a foreign or forged id), comes from another node than the message
        went to, or answers a message that was already answered. Binding marks the message answered."""
        reply_to = reply.metadata.reply_to_message_id
        for message, ids in self.sent:
            if message.metadata.message_id != reply_to:
                continue
            if reply.metadata.src_node_id != message.metadata.dst_node_id or not set(ids) <= self.awaiting:
                return None
            self.awaiting -= set(ids)
            return ids
        return None


def train_messages(
    server_round: int,
    arrays: ArrayRecord,
    groups: list[list[int]],
    config: ConfigRecord,
    mask: list[np.ndarray] | None,
    population: Population,
    faults: FaultInjectionConfig,
) -> list[tuple[Message, list[int]]]:
    """Step 3's messages: one per group of partitions (a cohort, or a cohort of one), each with the global model,
    ``config`` (the instructions and Flower's ``train_config``), the partitions it carries and their injected
    faults, and the round's public mask; addressed to the node :class:`Population` assigns."""
    sent = []
    for position, ids in enumerate(groups):
        carried = {"partition_ids": ids, "faults": [faults.fault_of(pid) for pid in ids]}
        content = RecordDict({"arrays": arrays, "config": ConfigRecord({**config, **carried})})
        if mask is not None:
            content["mask"] = ArrayRecord([m.astype(np.uint8) for m in mask])
        message = Message(
            content,
            dst_node_id=population.node_for(ids[0], position),
            message_type=MessageType.TRAIN,
            group_id=str(server_round),  # as Flower's strategies do: nodes log "[RUN r, ROUND t]"
        )
        sent.append((message, ids))
    return sent


@dataclass
class Contribution:
    """A screened reply: the sum of its accepted clients' updates (one client's update, or a cohort's sum), those
    clients with their reported statistics, the partitions it says failed or were rejected (by kind), and how many
    its worker re-clipped. A per-client reply is a cohort of one. ``norm`` is the screening's
    :func:`~fl_app.privacy.mechanisms.global_l2_norm` of ``total`` (NaN: not measured), for the server's re-clip."""

    total: list[np.ndarray]
    clients: list[tuple[int, dict[str, float]]]
    rejections: dict[str, list[int]] = field(default_factory=dict)
    reclipped: int = 0
    norm: float = math.nan


@dataclass
class RoundOutcome:
    """What aggregation produced, before evaluation and accounting fill in the rest of the record."""

    new_weights: list[np.ndarray]
    stats: dict[str, Any] = field(default_factory=dict)
    #: ``stats`` as ``privacy.client_statistics`` allows them to be published (drawn once, when the round's model
    #: is released: a noisy count is one release, not one per reader).
    published: dict[str, Any] = field(default_factory=dict)
