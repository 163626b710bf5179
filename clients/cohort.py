"""Cohort training (docs/running.md, "Cohort mode"): one train message makes a worker train several sampled clients.

The server (strategies/base.py) hands each worker a cohort of sampled partitions in one message instead of one
partition per message. The worker trains them with one of two engines:

* ``sequential`` — one client after another through the per-client path (:func:`clients.local_update.train_one`,
  one cached model reused): on a CPU this is the per-client path minus the engine's per-message cost;
* ``vectorized`` — the whole cohort at once on stacked copies of the model (:mod:`clients.vectorized`,
  ``torch.func``): the way to fill a GPU with small clients;
* ``captured`` (CUDA) — the vectorized step captured as a CUDA graph over the worker's training split resident on
  the GPU (:mod:`clients.captured`). Where the recipe is clip-only with the server adding the noise (DP-FedAvg,
  DP-FedSAM, BLUR), each client's update is also clipped and the cohort's float64 sum formed on the GPU
  (:mod:`fl_app.privacy.stacked`, the same clip and the same bound ‖Δ̃‖ ≤ C as float64 measures it): one sum
  leaves the device instead of K models. Other recipes, noisy local training and fault injection take the
  per-client path below from the engine's weights.

Privacy stays per client: each client's Δ goes through its own recipe (:func:`clients.recipes.privatize_update`:
clip on its own global norm, its own noise in client placement), then through the same screening the server
applies to a per-client reply (:func:`fl_app.privacy.mechanisms.measure_update`; in server placement a re-clip to C
that never trusts the recipe). The reply carries the float64 sum of the accepted clients' updates in partition
order, and per client its statistics and its fate (aggregated, failed, non-finite, wrong shape); the server checks
the sum again (finite, shapes, ‖sum‖ ≤ k·C). A client that diverges, raises or sends garbage is dropped alone.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from clients.captured import StackedOutcome, resident_split, train_captured
from clients.faults import inject_fault
from clients.local_update import _model, _train_data, client_data, client_generator, client_indices, train_one
from clients.recipes import privatize_update
from clients.regularizers import blur_term
from clients.training import LocalTrainingResult
from clients.vectorized import StackedRegularizer, train_stacked, train_stacked_noisy
from fl_app.core.choices import CohortEngine
from fl_app.instructions import TrainInstructions
from fl_app.models import resolve_device, set_weights, weight_names
from fl_app.privacy import mechanisms as mech
from fl_app.privacy.stacked import clip_stacked, sum_rows

Engine = CohortEngine

#: Per-client fates a cohort reply reports, besides "ok" (the keys of the reply's id lists).
REJECTIONS = ("failed", "nonfinite", "shape")


@dataclass
class CohortResult:
    """What a worker reports for its cohort."""

    total: list[np.ndarray]  # float64 sum of the accepted clients' updates, in partition order
    accepted: list[int] = field(default_factory=list)  # partition ids in the sum, ascending
    metrics: dict[str, list[float]] = field(default_factory=dict)  # per accepted client, aligned with ``accepted``
    rejected: dict[str, list[int]] = field(default_factory=lambda: {k: [] for k in REJECTIONS})
    reclipped: int = 0
    num_examples: int = 0
    train_started_unix: float = float("nan")


def _blur_regularizer(ins: TrainInstructions) -> tuple[StackedRegularizer | None, object]:
    """BLUR's term for the stacked engines (None without BLUR) and the constants it bakes in."""
    if not (ins.recipe.blur_coef > 0 and ins.clip_norm > 0):
        return None, None
    clip, coef = ins.clip_norm, ins.recipe.blur_coef

    def blur(params: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> torch.Tensor:
        return blur_term([params[n] for n in reference], list(reference.values()), clip, coef)

    return blur, ("blur", clip, coef)


def _updates(
    parameters: list[np.ndarray], names: list[str], finals: list[dict[str, torch.Tensor]],
    results: list[LocalTrainingResult],
) -> list[tuple[list[np.ndarray], LocalTrainingResult]]:  # fmt: skip
    out = []
    for final, result in zip(finals, results, strict=True):
        # A frozen parameter is exchanged but not trained (the engine returns trainable ones): its Δ is 0, as in
        # the per-client path.
        update = [
            final[name].numpy().astype(np.float32) - old if name in final else np.zeros_like(old)
            for name, old in zip(names, parameters, strict=True)
        ]
        out.append((update, result))
    return out


def _train_vectorized(
    parameters: list[np.ndarray], ins: TrainInstructions, partition_ids: list[int]
) -> list[tuple[list[np.ndarray], LocalTrainingResult]]:
    device = resolve_device(ins.device)
    model = _model(ins.model, ins.data.dataset, str(device))
    set_weights(model, parameters)
    names = weight_names(model)
    data = [client_data(ins.data, pid) for pid in partition_ids]
    generators = [client_generator(ins, pid) for pid in partition_ids]
    if ins.noisy_training is not None:
        finals, results = train_stacked_noisy(model, data, ins.noisy_training, ins.server_round, generators, device)
    else:
        assert ins.training is not None
        regularizer, _ = _blur_regularizer(ins)
        finals, results = train_stacked(
            model, data, ins.training, ins.server_round, generators, device, regularizer=regularizer
        )
    return _updates(parameters, names, finals, results)


def _train_captured(parameters: list[np.ndarray], ins: TrainInstructions, partition_ids: list[int]) -> StackedOutcome:
    device = resolve_device(ins.device)
    model = _model(ins.model, ins.data.dataset, str(device))
    set_weights(model, parameters)
    split = resident_split(_train_data(ins.data), device)
    indices = [client_indices(ins.data, pid) for pid in partition_ids]
    generators = [client_generator(ins, pid) for pid in partition_ids]
    assert ins.training is not None
    regularizer, key = _blur_regularizer(ins)
    return train_captured(
        model, split.x, split.y, indices, ins.training, ins.server_round, generators, regularizer, key
    )


def clips_on_device(
    ins: TrainInstructions, faults: list[str], shared_mask: list[np.ndarray] | None, names: list[str],
    trained: list[str],
) -> bool:  # fmt: skip
    """Whether the captured engine clips and sums on the GPU: a clip-only recipe, the server adding the noise, no
    fault to inject, and every exchanged tensor trained (so the stacked weights are the whole update)."""
    return (
        ins.recipe.kind == "dense"
        and ins.clip_norm > 0
        and not ins.add_noise
        and shared_mask is None
        and all(fault in ("", "none") for fault in faults)
        and names == trained
    )


def clip_and_sum_stacked(
    outcome: StackedOutcome, names: list[str], ins: TrainInstructions, partition_ids: list[int], started: float
) -> CohortResult:
    """Δ_i = w_i − w (w: the global weights the engine trained from), each clipped to C and the accepted ones summed
    in float64, on the device; one sum to the host."""
    deltas = [outcome.params[name] - outcome.reference[name] for name in names]
    clipped, norms, finite = clip_stacked(deltas, ins.clip_norm)
    norms_l, finite_l = norms.tolist(), finite.tolist()
    position_of = {i: position for position, i in enumerate(outcome.order)}
    out = CohortResult(total=[], train_started_unix=started)
    stats: dict[str, list[float]] = {k: [] for k in ("pre_clip_norm", "train_loss", "train_accuracy", "num_steps")}
    rows = []
    for i in sorted(range(len(partition_ids)), key=lambda i: partition_ids[i]):
        pid, position, result = partition_ids[i], position_of[i], outcome.results[i]
        if result.diverged:
            out.rejected["failed"].append(pid)
            continue
        if not finite_l[position]:
            out.rejected["nonfinite"].append(pid)
            continue
        rows.append(position)
        out.accepted.append(pid)
        out.num_examples += result.num_examples
        stats["pre_clip_norm"].append(norms_l[position])
        stats["train_loss"].append(result.loss)
        stats["train_accuracy"].append(result.accuracy)
        stats["num_steps"].append(float(result.num_steps))
    out.total = [t.cpu().numpy() for t in sum_rows(clipped, rows)]
    out.metrics = stats
    return out


def _privatize_and_add(
    out: CohortResult,
    stats: dict[str, list[float]],
    pid: int,
    outcome: tuple[list[np.ndarray], LocalTrainingResult],
    fault: str,
    ins: TrainInstructions,
    shared_mask: list[np.ndarray] | None,
    reclip: bool,
) -> None:
    """Client ``pid``'s trained update privatized (its recipe), its fault injected, screened as the server screens
    a reply (rejected by kind), re-clipped to C where the server clips, and added to the cohort's float64 sum with
    its statistics."""
    update, result = outcome
    sent, pre_clip_norm = privatize_update(update, ins, pid, shared_mask)
    sent = inject_fault(fault, sent)
    kind, norm = mech.measure_update(sent, [tuple(a.shape) for a in out.total])
    if kind is not None:
        out.rejected[kind].append(pid)
        return
    if reclip:
        sent, was_reclipped = mech.reclip(sent, ins.clip_norm, norm=norm)
        out.reclipped += int(was_reclipped)
    mech.add_to_sum(out.total, sent)
    out.accepted.append(pid)
    out.num_examples += result.num_examples
    stats["pre_clip_norm"].append(pre_clip_norm)
    stats["train_loss"].append(result.loss)
    stats["train_accuracy"].append(result.accuracy)
    stats["num_steps"].append(float(result.num_steps))


def train_cohort(
    parameters: list[np.ndarray],
    ins: TrainInstructions,
    partition_ids: list[int],
    faults: list[str],
    engine: Engine,
    shared_mask: list[np.ndarray] | None = None,
) -> CohortResult:
    """Train the cohort ``partition_ids`` from the global ``parameters``; privatize and screen each client.

    Clients are taken in partition order, and with the sequential engine each is trained, privatized, screened
    and added to the float64 sum before the next one trains: a worker holds one client's update at a time, and
    the sum is the one :func:`~fl_app.privacy.mechanisms.uniform_sum` makes in that order.
    """
    if len(faults) != len(partition_ids):
        raise ValueError(f"{len(partition_ids)} partitions but {len(faults)} fault entries")
    shapes = [tuple(p.shape) for p in parameters]
    fault_of = dict(zip(partition_ids, faults, strict=True))
    order = sorted(partition_ids)
    started = time.time()
    stacked: dict[int, tuple[list[np.ndarray], LocalTrainingResult]] = {}
    if engine == "captured" and ins.noisy_training is None:
        trained = _train_captured(parameters, ins, partition_ids)
        names = weight_names(_model(ins.model, ins.data.dataset, str(resolve_device(ins.device))))
        if clips_on_device(ins, faults, shared_mask, names, list(trained.params)):
            return clip_and_sum_stacked(trained, names, ins, partition_ids, started)
        finals = _updates(parameters, names, trained.unstacked(), trained.results)
        stacked = dict(zip(partition_ids, finals, strict=True))
    elif engine in ("vectorized", "captured"):
        stacked = dict(zip(partition_ids, _train_vectorized(parameters, ins, partition_ids), strict=True))
    out = CohortResult(total=mech.uniform_sum([], shapes), train_started_unix=started)
    # In server placement the update must be within C whatever the recipe did (the server's rule, applied here
    # to each client because the server only sees the cohort's sum).
    reclip = ins.clip_norm > 0 and not ins.add_noise and ins.recipe.kind != "noisy_model"
    stats: dict[str, list[float]] = {k: [] for k in ("pre_clip_norm", "train_loss", "train_accuracy", "num_steps")}
    first: float | None = None
    for pid in order:
        fault = fault_of[pid]
        outcome: tuple[list[np.ndarray], LocalTrainingResult] | None = None
        if fault == "raise":  # a client that raises in fit: nothing to train
            pass
        elif engine != "sequential":
            outcome = stacked.pop(pid)
        else:
            try:
                update, result, first_step = train_one(parameters, ins, pid)
            except Exception as exc:  # one client's failure (e.g. unreadable data) fails that client alone
                logging.getLogger(__name__).warning("a client of the cohort failed: %s", type(exc).__name__)
            else:
                outcome = (update, result)
                first = first_step if first is None else min(first, first_step)
        if outcome is None or outcome[1].diverged:
            out.rejected["failed"].append(pid)
            continue
        _privatize_and_add(out, stats, pid, outcome, fault, ins, shared_mask, reclip)
    if first is not None:
        out.train_started_unix = first
    out.metrics = stats
    return out
