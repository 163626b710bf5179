"""Cohort mode (simulation, ``population=virtual``): which sampled clients share a train message.

A cohort message carries several sampled partitions; its worker trains each client separately and replies with the
sum of their updates (clients/cohort.py), so one worker start-up serves many clients. How many cohorts a round has
follows the resolved ``simulation.cohort_size`` (strategies/settings.py): a fixed size, or one cohort per node. The
cohorts are balanced by each client's local work (:func:`local_work`, :func:`balance_cohorts`), so no worker waits
on a heavy one.
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


#: A local step's fixed cost (the optimizer's update, the per-step dispatch), in samples' worth of forward and
#: backward pass. Least squares over 360 P2 clients' local training times (paper CNN, B = 32, one CPU thread):
#: 0.44 ms a sample and 3.7 ms a step, about 8.6 samples; by steps alone a cohort's time was off by 8.9% a client,
#: by samples and steps by 3.7%.
STEP_COST_SAMPLES = 8


def local_work(config: AppConfig, training: LocalTrainingConfig | NoisyLocalConfig, partition_id: int) -> int:
    """Client ``partition_id``'s work in a round with ``training``, for balancing cohorts: the samples its local steps
    go through plus :data:`STEP_COST_SAMPLES` a step (a partial last batch costs less than a full one)."""
    if isinstance(training, NoisyLocalConfig):
        return training.steps * (training.batch_size + STEP_COST_SAMPLES)
    d = config.dataset
    n = len(
        get_partition(
            d.name, d.data_dir, d.partition, d.num_clients, d.alpha, config.seed, partition_id,
            num_samples=d.max_train_samples or None,
        )
    )  # fmt: skip
    per_epoch = math.ceil(n / training.batch_size)
    steps = training.epochs * per_epoch
    if training.max_steps is not None:
        steps = min(steps, training.max_steps)
    # Whole epochs see all n samples; the steps of a cut-short epoch are full batches (its partial one comes last).
    samples = (steps // per_epoch) * n + (steps % per_epoch) * training.batch_size if per_epoch else 0
    return samples + STEP_COST_SAMPLES * steps


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


def plan_cohorts(
    config: AppConfig,
    training: LocalTrainingConfig | NoisyLocalConfig,
    sampled: list[int],
    cohort_size: CohortSize,
    num_nodes: int,
) -> list[list[int]] | None:
    """A round's cohorts of the ``sampled`` partitions (each sorted; how many: :func:`cohort_count`), balanced by each
    client's local work (:func:`local_work`); None = one message per client."""
    count = cohort_count(cohort_size, len(sampled), num_nodes)
    if count == 0:
        return None
    return balance_cohorts(sampled, [local_work(config, training, pid) for pid in sampled], count)
