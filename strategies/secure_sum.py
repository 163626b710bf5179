"""A round of distributed DP on a Flower grid: SecAgg+'s four stages (fl_app/secure_aggregation/server.py) over the
round's clients, the training in the third, and the decoded sum (docs/mechanisms.md, "Distributed DP").

The round's train messages (one client each) say who takes part and what to train; :class:`SecureSum` sends every
client the four stages as ``train.secagg`` messages (the collect stage's carries the train message's content, the
encoding's parameters and the round's public rotation seed), takes only masked vectors and shares back, unmasks the
survivors' modular sum and decodes it: the sum of their clipped updates plus the Skellam noise, which is all the
server ever holds of them. A client that does not answer a stage in time, or answers with an error, has dropped out
of the round; fewer than the threshold left at any stage aborts it (:class:`SecureSumResult` with no sum: nothing
was unmasked).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fl_app.instructions import STREAM_ROTATION
from fl_app.privacy.distributed import SkellamCodec, SkellamParameters
from fl_app.secure_aggregation import ProtocolError, SecureSumRound
from fl_app.secure_aggregation.messages import (
    ENCODING_KEYS,
    MESSAGE_TYPE,
    PARTICIPANT,
    RECORD,
    ROTATION_SEED,
    STAGE,
    Stage,
    vector_from_bytes,
)
from strategies.client_dp.placement import DistributedPlacement, Placement
from strategies.client_dp.randomness import RunRandomness
from strategies.messaging import send_and_receive
from strategies.rounds import RoundPlan

__all__ = ["SecureSum", "SecureSumResult", "secure_sum_for"]


def secure_sum_for(placement: Placement, randomness: RunRandomness) -> SecureSum | None:
    """The round's exchange under ``placement``: secure aggregation for distributed DP, None (replies in the clear)
    for the others."""
    if not isinstance(placement, DistributedPlacement):
        return None
    return SecureSum(placement.parameters, placement.neighbours, randomness)


@dataclass(frozen=True)
class SecureSumResult:
    """A round of secure aggregation: the decoded sum (model-shaped float64; None when the round was aborted), the
    participants whose vectors are in it, how many answered each stage, and the coordinates flagged as wrapped."""

    total: list[np.ndarray] | None
    participants: list[int]
    answered: dict[str, int] = field(default_factory=dict)
    flagged: int = 0
    aborted: str | None = None


class SecureSum:
    """The server's side of a distributed-DP round over a grid: the run's encoding ``parameters``, each client
    masking with ``neighbours`` others (None: all), the round's public rotation seed drawn from ``randomness``."""

    def __init__(self, parameters: SkellamParameters, neighbours: int | None, randomness: RunRandomness) -> None:
        self.parameters = parameters
        self.neighbours = neighbours
        self.randomness = randomness

    def run(
        self, grid: Grid, plan: RoundPlan, timeout: float | None, on_pushed: Callable[[], None] | None = None
    ) -> SecureSumResult:
        """The four stages for ``plan``'s clients; the decoded sum of the survivors' updates."""
        route = {ids[0]: (message, message.metadata.dst_node_id) for message, ids in plan.sent}
        if len({node for _, node in route.values()}) < len(route):
            raise RuntimeError(
                f"round {plan.server_round}: two clients on one SuperNode; secure aggregation keeps each client's "
                "state in its node between the stages, so distributed DP needs a SuperNode per client of a round "
                "(population=nodes, or at least as many SuperNodes as clients)"
            )
        parameters = self.parameters
        answered: dict[str, int] = {}
        if len(route) < parameters.min_clients:
            reason = (f"{len(route)} client(s) sampled, fewer than privacy.distributed.threshold: t = "
                      f"{parameters.min_clients}")  # fmt: skip
            return self._aborted(plan, reason, answered)
        protocol = SecureSumRound(sorted(route), parameters.min_clients, parameters.bits,
                                  parameters.padded, degree=self.neighbours)  # fmt: skip
        stage_run = _StageRunner(grid, plan.server_round, route, timeout, answered, on_pushed)
        seed = int(self.randomness.round_rng(plan.server_round, STREAM_ROTATION).integers(2**32))
        try:
            total = self._stages(stage_run, protocol, seed)
        except ProtocolError as error:
            return self._aborted(plan, str(error), answered)
        decoded = SkellamCodec(parameters, seed).decode(total)
        if decoded.wrapped:
            log(WARNING, "Round %d: %d coordinate(s) of the secure sum in the wrap band (|z| >= 2^(b-2))",
                plan.server_round, decoded.flagged.size)  # fmt: skip
        return SecureSumResult(_shaped(decoded.total, plan.shapes), protocol.survivors, answered,
                               int(decoded.flagged.size))  # fmt: skip

    def _stages(self, stage_run: _StageRunner, protocol: SecureSumRound, seed: int) -> np.ndarray:
        """Setup, share keys, collect (with the training and the encoding at the public rotation ``seed``),
        unmask: the survivors' modular sum."""
        parameters = self.parameters
        replies = stage_run(Stage.SETUP, {p: protocol.settings() for p in stage_run.route})
        protocol.take_keys({p: (bytes(r["mask_key"]), bytes(r["share_key"])) for p, r in replies.items()})
        requests = {p: _keys_request(keys) for p, keys in protocol.key_requests().items()}
        replies = stage_run(Stage.SHARE_KEYS, requests)
        protocol.take_shares({p: ([int(d) for d in r["destinations"]], [bytes(c) for c in r["ciphertexts"]])
                              for p, r in replies.items()})  # fmt: skip
        encoding = {**{k: getattr(parameters, k) for k in ENCODING_KEYS}, ROTATION_SEED: seed}
        requests = {p: {"sources": s, "ciphertexts": c, **encoding}
                    for p, (s, c) in protocol.collect_requests().items()}  # fmt: skip
        replies = stage_run(Stage.COLLECT, requests, with_training=True)
        bits, length = parameters.bits, parameters.padded
        protocol.take_masked({p: vector_from_bytes(bytes(r["masked"]), bits, length) for p, r in replies.items()})
        requests = {p: {"survivors": s, "dropped": d} for p, (s, d) in protocol.unmask_requests().items()}
        replies = stage_run(Stage.UNMASK, requests)
        return protocol.unmask({p: ([int(o) for o in r["owners"]], [bytes(s) for s in r["shares"]])
                                for p, r in replies.items()})  # fmt: skip

    @staticmethod
    def _aborted(plan: RoundPlan, reason: str, answered: dict[str, int]) -> SecureSumResult:
        log(WARNING, "Round %d: secure aggregation aborted, nothing unmasked: %s", plan.server_round, reason)
        return SecureSumResult(None, [], answered, aborted=reason)


class _StageRunner:
    """Sends one stage to its participants and returns the answers that came back, by participant."""

    def __init__(
        self,
        grid: Grid,
        server_round: int,
        route: dict[int, tuple[Message, int]],
        timeout: float | None,
        answered: dict[str, int],
        on_pushed: Callable[[], None] | None,
    ) -> None:
        self.grid, self.server_round, self.route = grid, server_round, route
        self.timeout, self.answered, self.on_pushed = timeout, answered, on_pushed

    def __call__(
        self, stage: Stage, requests: dict[int, dict[str, Any]], with_training: bool = False
    ) -> dict[int, Any]:
        messages: dict[int, Message] = {}
        for participant, fields in requests.items():
            train_message, node = self.route[participant]
            content = RecordDict(dict(train_message.content.items())) if with_training else RecordDict()
            content[RECORD] = ConfigRecord({STAGE: stage.value, PARTICIPANT: participant, **fields})
            messages[participant] = Message(content, dst_node_id=node, message_type=MESSAGE_TYPE,
                                            group_id=str(self.server_round))  # fmt: skip
        on_pushed, self.on_pushed = self.on_pushed, None  # the round's first push only
        replies = send_and_receive(self.grid, list(messages.values()), self.timeout, on_pushed=on_pushed)
        by_id = {message.metadata.message_id: participant for participant, message in messages.items()}
        answers: dict[int, Any] = {}
        for reply in replies:
            participant = by_id.get(reply.metadata.reply_to_message_id)
            if participant is None or reply.has_error() or RECORD not in reply.content.config_records:
                continue
            if reply.metadata.src_node_id != self.route[participant][1]:
                continue  # not from the node the stage went to
            answers[participant] = reply.content.config_records[RECORD]
        self.answered[stage.value] = len(answers)
        return answers


def _keys_request(keys: dict[int, tuple[bytes, bytes]]) -> dict[str, Any]:
    ids = sorted(keys)
    return {"neighbours": ids, "mask_keys": [keys[n][0] for n in ids], "share_keys": [keys[n][1] for n in ids]}


def _shaped(flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    arrays, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape, dtype=np.int64))
        arrays.append(flat[start : start + size].reshape(shape))
        start += size
    return arrays
