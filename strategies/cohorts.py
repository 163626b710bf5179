"""Cohort mode (simulation, ``population=virtual``): which sampled clients share a train message.

A cohort message carries several sampled partitions; its worker trains each client separately and replies with the
sum of their updates (clients/cohort.py), so one worker start-up serves many clients. How many cohorts a round has
follows the resolved ``simulation.cohort_size`` (strategies/settings.py): a fixed size, or one cohort per node. The
cohorts are balanced by each client's local steps (:func:`balance_cohorts`), so no worker waits on a heavy one.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from fl_app.config import AppConfig
from fl_app.data.partition import get_partition
from fl_app.instructions import LocalTrainingConfig, NoisyLocalConfig
from strategies.settings import CohortSize


def cohort_count(cohort_size: CohortSize, num_sampled: int, num_nodes: int) -> int:
    """How many cohort messages carry ``num_sampled`` clients (0 = one message per client)."""
    if num_sampled == 0 or cohort_size == 1:
        return 0
    if cohort_size == "per_node":
        return min(num_sampled, num_nodes)
    return math.ceil(num_sampled / cohort_size)


def local_steps(config: AppConfig, training: LocalTrainingConfig | NoisyLocalConfig, partition_id: int) -> int:
    """The local steps client ``partition_id`` takes in a round with ``training`` (its work, for balancing)."""
    if isinstance(training, NoisyLocalConfig):
        return training.steps
    d = config.dataset
    n = len(
        get_partition(
            d.name, d.data_dir, d.partition, d.num_clients, d.alpha, config.seed, partition_id,
            num_samples=d.max_train_samples or None,
        )
    )  # fmt: skip
    steps = training.epochs * math.ceil(n / training.batch_size)
    return steps if training.max_steps is None else min(steps, training.max_steps)


def balance_cohorts(partition_ids: Sequence[int], work: Sequence[int], count: int) -> list[list[int]]:
    """Split ``partition_ids`` into ``count`` cohorts of about equal total ``work`` (longest processing time first:
    each client, heaviest first, joins the least-loaded cohort; ties go to the lower cohort index). Every cohort is
    returned sorted; no cohort is empty when there are at least ``count`` clients. Deterministic."""
    if len(work) != len(partition_ids):
        raise ValueError(f"{len(partition_ids)} partitions but {len(work)} work entries")
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    count = min(count, max(len(partition_ids), 1))
    cohorts: list[list[int]] = [[] for _ in range(count)]
    # (load, number of clients, cohort index): an empty cohort gets a client before a loaded one, even at zero work.
    heap = [(0, 0, i) for i in range(count)]
    for w, pid in sorted(zip(work, partition_ids, strict=True), key=lambda item: (-item[0], item[1])):
        load, size, i = heapq.heappop(heap)
        cohorts[i].append(int(pid))
        heapq.heappush(heap, (load + int(w), size + 1, i))
    return [sorted(c) for c in cohorts if c]
