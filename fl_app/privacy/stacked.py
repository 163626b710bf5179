"""Clipping and summing a cohort's updates where they were trained: stacked torch tensors on the device (the captured
engine: docs/running.md).

The same mechanism as :func:`fl_app.privacy.mechanisms.clip_update` and :func:`~fl_app.privacy.mechanisms.uniform_sum`
(journal Eq. 10, docs/mechanisms.md, 2), for K clients at once, each row (dim 0) one client's update Δ_i:

* ‖Δ_i‖ is the global L2 norm over all of the client's tensors, accumulated in float64;
* Δ_i is scaled by α_i = min(1, C/‖Δ_i‖) rounded down to the tensors' dtype, then re-measured in float64 and, where
  rounding overshot C, scaled again with α_i shrunk by one epsilon of that dtype (as ``_scale_within`` does), so
  every clipped row satisfies ‖Δ̃_i‖ ≤ C as float64 measures it — the bound the accountant assumes;
* an update within C is returned exactly (α = 1);
* the sum of the chosen rows is formed in float64.

A row with a non-finite norm is never scaled into the sum: :func:`clip_stacked` reports it (``finite``) for the
caller to reject, as :func:`~fl_app.privacy.mechanisms.measure_update` would. The only host synchronisations are
the checks whether any row still needs a retry.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["clip_stacked", "stacked_norms", "sum_rows"]

#: As many retries as :mod:`fl_app.privacy.mechanisms` allows its scaling (each shrinks α by one epsilon).
MAX_CLIP_RETRIES = 16


def stacked_norms(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per row (dim 0) the L2 norm of the row's entries of every tensor together, in float64."""
    if not tensors:
        raise ValueError("no tensors")
    squares = [t.flatten(1).to(torch.float64).square().sum(dim=1) for t in tensors]
    return torch.stack(squares, dim=1).sum(dim=1).sqrt()


def _round_down(factor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``factor`` (float64) in ``dtype``, rounded towards zero: a clip factor must never grow by rounding."""
    cast = factor.to(dtype)
    return torch.where(cast.to(torch.float64) > factor, torch.nextafter(cast, torch.zeros_like(cast)), cast)


def clip_stacked(
    deltas: Sequence[torch.Tensor], clip_norm: float
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Clip every row of ``deltas`` to global L2 norm ``clip_norm``; (clipped tensors, pre-clip norms, finite).

    ``finite[i]`` is False for a row whose norm is NaN or infinite (that row comes back zeroed; reject it).
    ``deltas`` share one floating dtype; the clipped rows keep it.
    """
    if not (clip_norm > 0 and torch.isfinite(torch.tensor(clip_norm))):
        raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm}")
    dtypes = {t.dtype for t in deltas}
    if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
        raise TypeError(f"clip_stacked expects tensors of one floating dtype, got {sorted(map(str, dtypes))}")
    dtype = next(iter(dtypes))
    norms = stacked_norms(deltas)
    finite = torch.isfinite(norms)
    over = finite & (norms > clip_norm)
    # α = C/‖Δ‖ above C, 1 within it, 0 for a non-finite row (never summed; zero keeps the arithmetic finite).
    alpha = torch.where(over, clip_norm / torch.where(over, norms, torch.ones_like(norms)), finite.to(torch.float64))
    shrink = 1.0 - torch.finfo(dtype).eps
    for _ in range(MAX_CLIP_RETRIES):
        factor = _round_down(alpha, dtype)
        clipped = [t * factor.view(-1, *([1] * (t.dim() - 1))) for t in deltas]
        clipped = [torch.where(finite.view(-1, *([1] * (c.dim() - 1))), c, torch.zeros_like(c)) for c in clipped]
        beyond = over & (stacked_norms(clipped) > clip_norm)
        if not bool(beyond.any()):
            return clipped, norms, finite
        alpha = torch.where(beyond, alpha * shrink, alpha)
    raise ValueError(f"could not scale an update within C = {clip_norm} in {dtype}")


def sum_rows(tensors: Sequence[torch.Tensor], rows: Sequence[int]) -> list[torch.Tensor]:
    """Σ over the given rows of each tensor, in float64 (zeros for no rows)."""
    if not rows:
        return [torch.zeros(t.shape[1:], dtype=torch.float64, device=t.device) for t in tensors]
    chosen = torch.as_tensor(list(rows), dtype=torch.long, device=tensors[0].device)
    return [t.index_select(0, chosen).to(torch.float64).sum(dim=0) for t in tensors]
