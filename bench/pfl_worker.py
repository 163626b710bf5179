"""pfl-research's side of the peer benchmark: one worker of a ``torchrun`` job replaying the app's run in pfl.

Runs in pfl's own environment (PyPI ``pfl[pytorch]``; ``bench/pfl_peer.py`` makes it), never in the project's:
it imports torch, NumPy and pfl, and from the project only :mod:`fl_app.models` (torch alone) and
:mod:`fl_app.allocator` (ctypes), so that both sides train the same network class the same way. Everything else
comes from the replay that ``bench/pfl_peer.py`` wrote from the app's own code (``replay.json`` + ``replay.npz``):

* the cohort of each round, in the app's order — pfl's :class:`~pfl.data.federated_dataset.FederatedDataset`
  samples from a user sampler that walks that schedule; every (round, client) pair is its own pfl user, weighted
  by its local step count so that pfl's balanced sampler (``user_id_to_weight``, ``_SortedCohortSampler``) splits
  the cohort over the workers as it would for any run with uneven users;
* each client's mini-batches: the permutation of every local epoch, drawn by the app's shuffle stream;
* the initial weights, the local optimizer (SGD with momentum and weight decay, η_t = η·decay^(t−1)) and the
  SAM/ASAM step written as a pfl ``train_step_fn`` (the same two-pass step as bench/baseline.py);
* the local step's set-up (the replay's ``step``, bench/pfl_peer.py): by default the app's — the model in its
  compute layout, glibc keeping freed memory, its SGD kernels — as the app's workers train;
* clipping to C and Gaussian noise σC on the sum as pfl's own
  ``CentrallyAppliedPrivacyMechanism(GaussianMechanism(C, σ))``; the sum over the cohort divided by the cohort
  size (= the app's fixed denominator m under fixed-size sampling) and the server step ``SGD(lr=η_g)`` as pfl's
  :class:`~pfl.algorithm.FederatedAveraging` and ``PyTorchModel`` do it.

Writes (rank 0) ``--out`` JSON: per-round seconds (interval between consecutive rounds' ends), the Unix time of
the first local step (for command-to-first-step), thread counts, and the final model (``.npz`` beside it, the
exchanged tensors in the app's order).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

_FIRST_STEP_UNIX: list[float] = []


class ReplayNet(nn.Module):
    """The app's network with the two methods pfl's ``PyTorchModel`` asks of a module."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(x), y)

    def metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
        from pfl.metrics import Weighted

        with torch.no_grad():
            logits = self.net(x)
            loss = float(F.cross_entropy(logits, y, reduction="sum"))
            correct = float((logits.argmax(1) == y).sum())
        return {"loss": Weighted(loss, len(y)), "accuracy": Weighted(correct, len(y))}


def sgd_train_step(
    pytorch_model: ReplayNet, local_optimizer: torch.optim.Optimizer, raw_data: Any, train_kwargs: Any, args: Any
) -> None:
    """pfl's own SGD step (loss, backward, step, zero_grad), timed from the first call."""
    from pfl.internal.bridge.pytorch.sgd import _sgd_train_step

    if not _FIRST_STEP_UNIX:
        _FIRST_STEP_UNIX.append(time.time())
    _sgd_train_step(pytorch_model, local_optimizer, raw_data, train_kwargs, args)


def sam_train_step(
    pytorch_model: ReplayNet,
    local_optimizer: torch.optim.Optimizer,
    raw_data: Any,
    train_kwargs: Any,
    args: Any,
    *,
    rho: float,
    adaptive: bool,
) -> None:
    """SAM / ASAM as a pfl ``train_step_fn``: the ascent to w + e(w) from the first gradient, the descent step
    with the gradient taken there, applied at the unperturbed w (bench/baseline.py's step)."""
    if not _FIRST_STEP_UNIX:
        _FIRST_STEP_UNIX.append(time.time())
    params = list(pytorch_model.parameters())
    pytorch_model.loss(*raw_data).backward()
    with torch.no_grad():
        if adaptive:
            norms = [torch.linalg.vector_norm(p.abs() * p.grad) for p in params]
        else:
            norms = [torch.linalg.vector_norm(p.grad) for p in params]
        scale = rho / (torch.linalg.vector_norm(torch.stack(norms)) + 1e-12)
        unperturbed = [p.detach().clone() for p in params]
        for p in params:
            if adaptive:
                p.add_((p.grad * scale).mul_(p.square()))
            else:
                p.add_(p.grad * scale)
    local_optimizer.zero_grad(set_to_none=True)
    pytorch_model.loss(*raw_data).backward()
    with torch.no_grad():
        for p, w in zip(params, unperturbed, strict=True):
            p.copy_(w)
    local_optimizer.step()
    local_optimizer.zero_grad()


def main() -> int:
    replay_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch.set_num_threads(int(os.environ.get("PEER_TORCH_THREADS", "1")))
    spec = json.loads((replay_dir / "replay.json").read_text())
    c = spec["config"]
    step = c["step"]
    if step["keep_freed_memory"]:  # before the first tensor, as the app's workers do
        from fl_app.allocator import keep_freed_memory

        keep_freed_memory()

    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.internal.ops import pytorch_ops
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel
    from pfl.privacy import CentrallyAppliedPrivacyMechanism, GaussianMechanism

    from fl_app.models import build_model, to_compute_layout

    device = pytorch_ops.get_default_device()
    arrays = np.load(replay_dir / "replay.npz")
    x_all = torch.from_numpy(arrays["x"]).to(device)
    y_all = torch.from_numpy(arrays["y"]).to(device=device, dtype=torch.long)

    class ReplayUser(Dataset):
        """One (round, client) pair: its rows and one permutation per local epoch, in the app's order."""

        def __init__(self, uid: str, rows: np.ndarray, perms: np.ndarray) -> None:
            super().__init__(raw_data=(x_all[:0], y_all[:0]), user_id=uid)
            self._rows = torch.from_numpy(rows).to(device)
            self._perms = torch.from_numpy(perms).to(device)
            self._epoch = 0

        def __len__(self) -> int:
            return int(self._rows.numel())

        def iter(self, batch_size: int | None):
            order = self._rows[self._perms[self._epoch]]
            self._epoch += 1
            step = batch_size or len(self)
            for start in range(0, len(self), step):
                idx = order[start : start + step]
                yield x_all[idx], y_all[idx]

    users = {u["uid"]: u for u in spec["users"]}
    schedule = [u["uid"] for u in spec["users"]]

    def make_dataset(uid: str) -> ReplayUser:
        return ReplayUser(uid, arrays[f"rows_{uid}"], arrays[f"perms_{uid}"])

    cursor = {"i": 0}

    def next_user() -> str:  # pfl's user sampler: the app's schedule, in order (cycled for pfl's look-ahead cache)
        uid = schedule[cursor["i"] % len(schedule)]
        cursor["i"] += 1
        return uid

    weights = {uid: max(int(u["steps"]), 1) for uid, u in users.items()}
    federated = FederatedDataset(make_dataset, next_user, user_id_to_weight=weights)

    net = ReplayNet(build_model(spec["model"]["name"], seed=0, **spec["model"]["kwargs"]))
    with torch.no_grad():
        for p, i in zip(net.parameters(), range(len(spec["model"]["shapes"])), strict=True):
            p.copy_(torch.from_numpy(arrays[f"w{i}"]))
    if step["compute_layout"]:
        to_compute_layout(net, device)
    # The replay's SGD kernels (the app's: clients.training.sgd_kernels), so that the same step runs on both sides.
    local_optimizer = functools.partial(
        torch.optim.SGD,
        momentum=c["momentum"],
        weight_decay=c["weight_decay"],
        **step["sgd_kernels"][torch.device(device).type],
    )
    model = PyTorchModel(
        model=net,
        local_optimizer_create=local_optimizer,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=c["server_lr"]),
    )
    if c["use_sam"]:
        step_fn = functools.partial(sam_train_step, rho=c["rho"], adaptive=c["adaptive"])
    else:
        step_fn = sgd_train_step

    class ReplayFedAvg(FederatedAveraging):
        """FedAvg with the app's local step and its per-round learning rate η·decay^(t−1). pfl evaluates every
        user before and after local training in rounds where ``do_evaluation`` holds (iteration 0 at least); the
        app evaluates no client, so neither does the replay."""

        def get_next_central_contexts(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            contexts, model, metrics = super().get_next_central_contexts(*args, **kwargs)
            if contexts is not None:
                contexts = tuple(dataclasses.replace(cc, do_evaluation=False) for cc in contexts)
            return contexts, model, metrics

        def train_one_user(self, initial_model_state, model, user_dataset, central_context):  # type: ignore[no-untyped-def]
            t = central_context.current_central_iteration  # 0-based: η_t = η·decay^(t−1) for t = it + 1
            params = NNTrainHyperParams(
                local_num_epochs=c["local_epochs"],
                local_learning_rate=c["lr"] * c["lr_decay"] ** t,
                local_batch_size=c["batch_size"],
            )
            model.do_multiple_epochs_of(user_dataset, params, step_fn)
            return model.get_model_difference(initial_model_state), Metrics()

    round_ends: list[float] = []

    class RoundClock(TrainingProcessCallback):
        def on_train_begin(self, *, model: Any) -> Metrics:
            round_ends.append(time.perf_counter())
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):  # type: ignore[no-untyped-def]
            round_ends.append(time.perf_counter())
            return False, Metrics()

    postprocessors = []
    if c["private"]:
        postprocessors.append(
            CentrallyAppliedPrivacyMechanism(GaussianMechanism(c["clip_norm"], c["noise_multiplier"]))
        )
    backend = SimulatedBackend(training_data=federated, val_data=None, postprocessors=postprocessors)
    num_rounds = int(c["num_rounds"])
    algorithm_params = NNAlgorithmParams(
        central_num_iterations=num_rounds,
        evaluation_frequency=num_rounds + 1,
        train_cohort_size=int(c["cohort_size"]),
        val_cohort_size=None,
    )
    train_params = NNTrainHyperParams(
        local_num_epochs=c["local_epochs"], local_learning_rate=c["lr"], local_batch_size=c["batch_size"]
    )
    ReplayFedAvg().run(
        algorithm_params=algorithm_params,
        backend=backend,
        model=model,
        model_train_params=train_params,
        callbacks=[RoundClock()],
    )
    # On the collective's device (NCCL has no CPU tensors).
    first = torch.tensor([_FIRST_STEP_UNIX[0] if _FIRST_STEP_UNIX else float("inf")], dtype=torch.float64)
    first = first.to(device)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        torch.distributed.all_reduce(first, op=torch.distributed.ReduceOp.MIN)
    if int(os.environ.get("RANK", "0")) == 0:
        weights_file = out.with_suffix(".npz")
        np.savez(weights_file, *[p.detach().cpu().contiguous().numpy() for p in net.parameters()])
        summary = {
            "round_seconds": [b - a for a, b in itertools.pairwise(round_ends)],
            "first_step_unix": float(first.cpu()[0]),
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "torch_threads": torch.get_num_threads(),
            "device": str(device),
            "pfl_version": __import__("pfl").__version__ if hasattr(__import__("pfl"), "__version__") else "",
            "weights_file": str(weights_file),
        }
        out.write_text(json.dumps(summary, indent=2) + "\n")
    if distributed:
        torch.distributed.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
