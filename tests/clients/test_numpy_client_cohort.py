"""A cohort message (``simulation.cohort_size`` other than 1) answered by a ``NumPyClient`` behind
clients/numpy_mod.py's mod: the client called once per partition the message names (its ``partition-id``, its own
fault), every partition's trained model apart in the reply (fl_app/partition_models.py), and the server's aggregate,
bit for bit, that of one message per partition (each update clipped to C on its own). The same wire format and calls
as tests/clients/test_numpy_client.py (:class:`tests.helpers.InProcessGrid`), whose round set-up this file shares.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
from flwr.app import Context
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp

from clients.numpy_client import numpy_client_mod
from fl_app.instructions import FlowerReply
from fl_app.partition_models import PARTITION_MODELS_KEY, PartitionModelsReply
from tests.clients.test_numpy_client import SMALL, _initial, _plan
from tests.helpers import InProcessGrid, build
from tests.strategies.conftest import task_identity  # noqa: F401  (flwr Messages need a task identity)


def _partition_update(parameters: list[np.ndarray], partition_id: int) -> list[np.ndarray]:
    """Partition ``partition_id``'s trained model: global + a Gaussian step of its own seed and scale, in float32."""
    rng = np.random.default_rng(partition_id)
    scale = np.float32(0.01 * (partition_id + 1))
    return [p + scale * rng.standard_normal(p.shape).astype(np.float32) for p in parameters]


class PartitionClient(NumPyClient):
    """A user's NumPyClient whose update depends on its partition (:func:`_partition_update`); it raises for a
    partition whose injected fault is ``raise``. Records the partition and fault of each call."""

    calls: ClassVar[list[tuple[int, str]]] = []

    def __init__(self, context: Context) -> None:
        self.partition_id = int(context.node_config["partition-id"])

    def fit(self, parameters, config):
        PartitionClient.calls.append((self.partition_id, str(config["fault"])))
        if config["fault"] == "raise":
            raise RuntimeError(f"partition {self.partition_id} raised")
        trained = _partition_update(parameters, self.partition_id)
        return trained, 10 + self.partition_id, {"train_loss": 0.1 * self.partition_id}


def _partition_app() -> ClientApp:
    PartitionClient.calls = []
    return ClientApp(client_fn=lambda context: PartitionClient(context).to_client(), mods=[numpy_client_mod])


#: SMALL with three clients a round (m = 3) in one cohort message.
COHORT_OF_3 = (*[o for o in SMALL if not o.startswith(("simulation.cohort_size=", "privacy.sample_rate="))],
               "privacy.sample_rate=0.3")  # fmt: skip


def test_a_cohort_message_calls_the_client_once_per_partition_and_answers_each_model_apart() -> None:
    strategy = build("strategy=dp_fedsam", *COHORT_OF_3, "simulation.cohort_size=3")
    initial = _initial()
    plan = _plan(strategy, initial)
    ((_, pids),) = plan.sent
    assert len(pids) == 3
    # The first partition's client raises (its injected fault): that partition's failure, not the cohort's.
    strategy = build("strategy=dp_fedsam", *COHORT_OF_3, "simulation.cohort_size=3",
                     f"fault_injection.raise_partitions=[{pids[0]}]")  # fmt: skip
    plan = _plan(strategy, initial)
    (answer,) = InProcessGrid(nodes=2, app=_partition_app()).send_and_receive(plan.messages)
    assert PartitionClient.calls == [(pids[0], "raise"), (pids[1], ""), (pids[2], "")]
    assert not answer.has_error()
    assert sorted(answer.content.keys()) == sorted(
        [PARTITION_MODELS_KEY, *(f"{kind}.{pid}" for pid in pids[1:] for kind in ("arrays", "metrics"))]
    )
    parsed = PartitionModelsReply.from_record(answer.content)
    assert parsed.failures == [(pids[0], f"RuntimeError: partition {pids[0]} raised")]
    assert [pid for pid, _ in parsed.answers] == pids[1:]
    for pid, content in parsed.answers:
        flower = FlowerReply.from_record(content)
        assert flower.num_examples == 10 + pid and flower.metrics == {"train_loss": pytest.approx(0.1 * pid)}
        expected = _partition_update(initial, pid)
        assert all(np.array_equal(t, e) for t, e in zip(flower.trained, expected, strict=True))
    outcome = strategy.aggregator.aggregate(plan, [answer])
    assert outcome.stats["aggregated"] == 2 and outcome.stats["failed"] == 1


def test_a_cohort_of_numpy_clients_aggregates_bit_for_bit_as_one_message_per_partition() -> None:
    """The server clips each partition's model of a cohort reply on its own, as the reply to a message of that
    partition: the same clip, the same sum, the same released model as with ``simulation.cohort_size=1``."""
    initial = _initial()
    outcomes, sent = [], []
    for cohort_size in (3, 1):
        strategy = build("strategy=dp_fedsam", *COHORT_OF_3, f"simulation.cohort_size={cohort_size}")
        plan = _plan(strategy, initial)
        replies = InProcessGrid(nodes=2, app=_partition_app()).send_and_receive(plan.messages)
        outcomes.append(strategy.aggregator.aggregate(plan, replies))
        sent.append(sorted(pid for _, ids in plan.sent for pid in ids))
    (cohort, single), pids = outcomes, sent[0]
    assert sent[1] == pids and len(pids) == 3
    assert cohort.stats["aggregated"] == single.stats["aggregated"] == 3
    assert cohort.stats["reclipped"] == single.stats["reclipped"] == 3  # every update is beyond C: clipped each
    assert cohort.stats["client_norms"] == single.stats["client_norms"]
    assert all(np.array_equal(a, b) for a, b in zip(cohort.new_weights, single.new_weights, strict=True))
