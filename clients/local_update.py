"""One client's local update in a worker process: its data, the model, its shuffle stream, and the training.

:func:`train_one` trains one client from the global model; the sequential cohort engine (clients/cohort.py) runs it
for each client of a message, then privatizes and screens each. One process (a Ray worker in simulation, a SuperNode
in deployment) keeps its dataset and model in memory across rounds (:func:`_train_data`, :func:`_model`): a round
costs an index lookup and a weight copy, not a dataset read or a model build.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import torch
from torch import nn

from clients.noisy_training import train_local_noisy
from clients.regularizers import make_blur_loss
from clients.training import LocalTrainingResult, train_local
from fl_app.data.datasets import TensorData, load_split
from fl_app.data.partition import get_partition
from fl_app.instructions import STREAM_CLIENT_SHUFFLE, DataSpec, TrainInstructions
from fl_app.models import build_model_for_dataset, get_weights, resolve_device, set_weights, to_compute_layout
from fl_app.privacy.mechanisms import random_source


def _train_data(spec: DataSpec) -> TensorData:
    return load_split(spec.dataset, spec.data_dir or None, train=True, download=spec.download)


@functools.lru_cache(maxsize=4)
def _model(name: str, dataset: str, device: str) -> nn.Module:
    # The initial weights are overwritten by the global model every round; the seed only fixes the build.
    return to_compute_layout(build_model_for_dataset(name, dataset, seed=0), torch.device(device))


def client_indices(spec: DataSpec, partition_id: int) -> np.ndarray:
    """The client's rows of the training split (read-only: the partition is cached)."""
    return get_partition(
        spec.dataset,
        spec.data_dir or None,
        spec.partition,
        spec.num_clients,
        spec.alpha,
        spec.partition_seed,
        partition_id,
        num_samples=spec.max_train_samples or None,
    )


def client_data(spec: DataSpec, partition_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    train = _train_data(spec)
    idx = torch.from_numpy(client_indices(spec, partition_id).copy())  # torch wants a writable array
    return train.x[idx], train.y[idx]


def client_generator(ins: TrainInstructions, partition_id: int) -> torch.Generator:
    """The client's mini-batch shuffle stream (seed, round, CLIENT_SHUFFLE, client), the same on every path; a
    seed of the client's own (OS CSPRNG) when the server sent none (secure randomness)."""
    rng = random_source(ins.seed is None, ins.seed, ins.server_round, STREAM_CLIENT_SHUFFLE, partition_id)
    return torch.Generator().manual_seed(int(rng.integers(2**62)))


def train_one(
    parameters: list[np.ndarray], ins: TrainInstructions, partition_id: int
) -> tuple[list[np.ndarray], LocalTrainingResult, float]:
    """Train one client from the global ``parameters``.

    Returns Δ = w_local − w_global, the training outcome, and the wall-clock time (seconds since the epoch) of the
    first local step, after data, partition and model are ready (startup profiling in bench/).
    """
    device = resolve_device(ins.device)
    x, y = client_data(ins.data, partition_id)
    model = _model(ins.model, ins.data.dataset, str(device))
    set_weights(model, parameters)
    generator = client_generator(ins, partition_id)
    train_started = time.time()
    if ins.noisy_training is not None:
        result = train_local_noisy(
            model, x, y, ins.noisy_training, ins.server_round, generator=generator, device=device
        )
    else:
        assert ins.training is not None
        model.to(device)
        blur = (
            make_blur_loss(model, ins.clip_norm, ins.recipe.blur_coef)
            if ins.recipe.blur_coef > 0 and ins.clip_norm > 0
            else None
        )
        result = train_local(
            model, x, y, ins.training, server_round=ins.server_round, generator=generator, device=device,
            extra_loss=blur,
        )  # fmt: skip
    update = [new - old for new, old in zip(get_weights(model), parameters, strict=True)]
    return update, result, train_started
