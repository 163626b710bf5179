"""strategies/client_dp/updates.py: a trained model's update as every DP path screens it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_app.privacy import mechanisms as mech
from strategies.client_dp.updates import REJECTION_KINDS, trained_update

GLOBAL = [np.ones((2, 2), dtype=np.float32), np.zeros(3, dtype=np.float32)]


def test_the_update_is_trained_minus_global_in_float64_with_its_norm() -> None:
    trained = [np.full((2, 2), 1.5, dtype=np.float32), np.arange(3, dtype=np.float64)]
    kind, update, norm = trained_update(trained, GLOBAL)
    assert kind is None and all(u.dtype == np.float64 for u in update)
    np.testing.assert_array_equal(update[0], np.full((2, 2), 0.5))
    np.testing.assert_array_equal(update[1], np.arange(3.0))
    assert norm == pytest.approx(mech.global_l2_norm(update), rel=1e-15) == pytest.approx(math.sqrt(4 * 0.25 + 5))


@pytest.mark.parametrize(
    "trained",
    [
        [np.ones((2, 2), dtype=np.int64), np.zeros(3, dtype=np.float32)],  # every released coordinate gets noise
        [np.ones((2, 3), dtype=np.float32), np.zeros(3, dtype=np.float32)],
        [np.ones((2, 2), dtype=np.float32)],
    ],
    ids=["integer", "other-shape", "missing-tensor"],
)
def test_other_shapes_and_non_floating_dtypes_are_shape(trained: list[np.ndarray]) -> None:
    assert trained_update(trained, GLOBAL) == ("shape", [], pytest.approx(math.nan, nan_ok=True))


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e200])
def test_non_finite_values_and_overflowing_norms_are_nonfinite(bad: float) -> None:
    trained = [np.full((2, 2), bad, dtype=np.float64), np.zeros(3, dtype=np.float32)]
    kind, update, norm = trained_update(trained, GLOBAL)
    assert kind == "nonfinite" and update == [] and math.isnan(norm)


def test_the_rejection_kinds_every_path_counts() -> None:
    assert REJECTION_KINDS == ("failed", "malformed", "shape", "nonfinite")
