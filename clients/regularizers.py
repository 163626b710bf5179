"""Local-objective regularisers added to a client's loss through ``train_local(..., extra_loss=...)``.

BLUR — bounded local update regularization (Cheng, Wang, Zhang, Cheng, CVPR 2022, arXiv 2203.03106), as defined
in docs/algorithms.md ("Definitions of the baselines"). The local objective becomes F_i(w) + R(w) with

    R(w) = (λ/2) · max(0, ‖w − w^t‖ − C)²

over the whole flattened model (w^t the round's global model, C the client-level clipping bound, λ = ``blur_coef``).
Its gradient is λ · (‖Δ‖ − C) · Δ/‖Δ‖ when ‖Δ‖ > C and 0 otherwise (Δ = w − w^t): it pulls the local model back
towards the clipping ball, so that clipping (docs/mechanisms.md, 2) discards less of the update.

The penalty is a differentiable tensor: a public implementation computes it through ``.item()``, which cuts it
from the autograd graph and makes it a no-op. C must be the fixed clipping hyperparameter, never derived from the
data (that would break the DP guarantee). Nothing here adds noise or clips; the update then goes through the
client-level Gaussian mechanism (docs/mechanisms.md, 2–4). """

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

__all__ = ["blur_penalty", "blur_term", "make_blur_loss"]


def _trainable(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def _check_hyper(clip_norm: float, coef: float) -> None:
    if not (clip_norm >= 0.0 and math.isfinite(clip_norm)):
        raise ValueError(f"clip_norm (C) must be finite and >= 0, got {clip_norm}")
    if not (coef >= 0.0 and math.isfinite(coef)):
        raise ValueError(f"coef (blur_coef, lambda) must be finite and >= 0, got {coef}")


def blur_penalty(model: nn.Module, reference: Sequence[torch.Tensor], clip_norm: float, coef: float) -> torch.Tensor:
    """R(w) = (coef/2) · max(0, ‖w − w^t‖ − C)², differentiable w.r.t. the model's parameters (as defined in
    docs/algorithms.md, "Definitions of the baselines").

    Args:
        model: its parameters with ``requires_grad``, in ``model.parameters()`` order, form w.
        reference: w^t, detached copies of the round's global parameters in the same order and shapes (moved to
            each parameter's device/dtype if they differ).
        clip_norm: C ≥ 0, the fixed client-level clipping bound.
        coef: λ ≥ 0.

    The norm is the global L2 norm over all those parameters (the per-tensor norms combined), and its gradient is
    finite everywhere, including at Δ = 0. Inside the ball (‖Δ‖ ≤ C) both value and gradient are exactly zero, so
    adding the term to a loss leaves the training step bit-identical.
    """
    _check_hyper(clip_norm, coef)
    params = _trainable(model)
    if len(reference) != len(params):
        raise ValueError(f"reference has {len(reference)} tensors but the model has {len(params)} trainable ones")
    if not params:
        return torch.zeros(())
    for i, (p, r) in enumerate(zip(params, reference, strict=True)):
        if r.shape != p.shape:
            raise ValueError(f"reference[{i}] has shape {tuple(r.shape)}, parameter has {tuple(p.shape)}")
    detached = [r.detach().to(device=p.device, dtype=p.dtype) for p, r in zip(params, reference, strict=True)]
    return blur_term(params, detached, clip_norm, coef)


def blur_term(
    params: Sequence[torch.Tensor], reference: Sequence[torch.Tensor], clip_norm: float, coef: float
) -> torch.Tensor:
    """The formula of :func:`blur_penalty` on plain tensors (no checks): also usable under ``torch.func``
    transforms, where the vectorized cohort engine (:mod:`clients.vectorized`) applies it to each client's
    parameters."""
    # vector_norm's backward is 0 (not NaN) at a zero argument, unlike sqrt(sum of squares).
    norms = [torch.linalg.vector_norm(p - r, 2) for p, r in zip(params, reference, strict=True)]
    delta_norm = torch.linalg.vector_norm(torch.stack(norms), 2)
    excess = torch.relu(delta_norm - clip_norm)
    return 0.5 * coef * excess.square()


def make_blur_loss(model: nn.Module, clip_norm: float, coef: float) -> Callable[[nn.Module], torch.Tensor]:
    """Snapshot the model's current (global) parameters as w^t and return ``m -> blur_penalty(m, w^t, C, λ)``.

    Call it right after loading the round's global weights and before training; pass the result as
    ``train_local(..., extra_loss=...)``. The snapshot is a detached clone, so later in-place updates of the
    model do not move the reference.
    """
    _check_hyper(clip_norm, coef)
    reference = [p.detach().clone() for p in _trainable(model)]

    def blur_loss(m: nn.Module) -> torch.Tensor:
        return blur_penalty(m, reference, clip_norm, coef)

    return blur_loss
