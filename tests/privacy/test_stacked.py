"""Tests for fl_app/privacy/stacked.py: a cohort's updates clipped and summed as stacked tensors must keep the bound
and the values of the per-update functions of fl_app/privacy/mechanisms/ (runs on the CPU; the same code runs on
the GPU in the captured engine)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_app.privacy import mechanisms as mech
from fl_app.privacy.stacked import clip_stacked, stacked_norms, sum_rows

SHAPES = [(4, 3), (5,), (2, 2, 2)]


def _stack(rows: list[list[np.ndarray]]) -> list[torch.Tensor]:
    return [torch.from_numpy(np.stack([row[t] for row in rows])) for t in range(len(rows[0]))]


def _rows(count: int, seed: int, scale: float = 1.0) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[(rng.standard_normal(s) * scale).astype(np.float32) for s in SHAPES] for _ in range(count)]


def test_norms_are_the_global_l2_norms_of_each_row() -> None:
    rows = _rows(5, seed=0)
    norms = stacked_norms(_stack(rows))
    assert norms.dtype == torch.float64
    for i, row in enumerate(rows):
        assert math.isclose(float(norms[i]), mech.global_l2_norm(row), rel_tol=1e-14)


@pytest.mark.parametrize("clip_norm", [0.05, 1.0, 3.0, 100.0])
def test_clip_matches_clip_update_and_keeps_the_bound(clip_norm: float) -> None:
    rows = _rows(7, seed=1, scale=0.7)
    clipped, norms, finite = clip_stacked(_stack(rows), clip_norm)
    assert bool(finite.all())
    for i, row in enumerate(rows):
        want, pre = mech.clip_update(row, clip_norm)
        got = [t[i].numpy() for t in clipped]
        assert math.isclose(float(norms[i]), pre, rel_tol=1e-14)
        assert all(g.dtype == np.float32 for g in got)
        # ≤ C as float64 measures it, on the device's float64 reduction and numpy's.
        assert float(stacked_norms([t[i : i + 1] for t in clipped])[0]) <= clip_norm
        assert mech.global_l2_norm(got) <= clip_norm * (1 + 1e-12)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-7, atol=0)
        if pre <= clip_norm:  # within C: the exact update, not a rescaled copy
            for g, r in zip(got, row, strict=True):
                np.testing.assert_array_equal(g, r)


def test_non_finite_rows_are_flagged_zeroed_and_do_not_touch_the_others() -> None:
    rows = _rows(4, seed=2)
    rows[1][0][0, 0] = np.nan
    rows[3][2][0, 0, 1] = np.inf
    clipped, _norms, finite = clip_stacked(_stack(rows), 0.5)
    assert finite.tolist() == [True, False, True, False]
    for i in (1, 3):
        assert all(float(t[i].abs().sum()) == 0.0 for t in clipped)
    for i in (0, 2):
        want, _ = mech.clip_update(rows[i], 0.5)
        for t, w in zip(clipped, want, strict=True):
            np.testing.assert_allclose(t[i].numpy(), w, rtol=2e-7, atol=0)


def test_sum_rows_is_the_float64_sum_of_the_chosen_rows() -> None:
    rows = _rows(5, seed=3)
    total = sum_rows(_stack(rows), [0, 2, 4])
    want = mech.uniform_sum([rows[0], rows[2], rows[4]], SHAPES)
    for t, w in zip(total, want, strict=True):
        assert t.dtype == torch.float64
        np.testing.assert_allclose(t.numpy(), w, rtol=1e-15, atol=1e-15)
    assert all(float(t.abs().sum()) == 0.0 and t.dtype == torch.float64 for t in sum_rows(_stack(rows), []))


def test_invalid_input_is_refused() -> None:
    stacked = _stack(_rows(2, seed=4))
    with pytest.raises(ValueError, match="clip_norm"):
        clip_stacked(stacked, 0.0)
    with pytest.raises(ValueError, match="clip_norm"):
        clip_stacked(stacked, math.inf)
    with pytest.raises(TypeError, match="one floating dtype"):
        clip_stacked([stacked[0], stacked[1].double()], 1.0)
    with pytest.raises(TypeError, match="one floating dtype"):
        clip_stacked([torch.ones(2, 3, dtype=torch.long)], 1.0)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    count=st.integers(1, 6),
    log_scale=st.floats(-6, 6),
    clip_norm=st.floats(1e-4, 1e3),
)
def test_every_clipped_row_is_within_c(seed: int, count: int, log_scale: float, clip_norm: float) -> None:
    """The accountant's assumption, for any scale of update and any C: each clipped row's float64 norm ≤ C."""
    rows = _rows(count, seed, scale=10.0**log_scale)
    clipped, norms, _ = clip_stacked(_stack(rows), clip_norm)
    after = stacked_norms(clipped)
    assert bool((after <= clip_norm).all()), (after.max().item(), clip_norm)
    assert bool((after <= norms).all())
