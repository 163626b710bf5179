"""Conditional randomised rounding (unbiased, within its bound), the rounding's norm bound, arithmetic modulo 2^b and
the wrap flags."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_app.privacy.distributed.encoding import (
    RoundingFailed,
    centered,
    conditional_round,
    detection_threshold,
    l1_sensitivity,
    rounded_norm_bound,
    to_modular,
    wrapped_coordinates,
)


def test_the_rounded_norm_bound_pins_both_terms() -> None:
    # β = 0: the deterministic bound C + √d.
    assert rounded_norm_bound(10.0, 100, 0.0) == pytest.approx(20.0)
    # β = e^(-1/2): √(2 ln(1/β)) = 1, so the bound is √(C² + d/4 + C + √d/2) = √(100 + 25 + 10 + 5) = √140.
    assert rounded_norm_bound(10.0, 100, math.exp(-0.5)) == pytest.approx(math.sqrt(140.0))
    # Large d: the first term is the smaller one.
    assert rounded_norm_bound(1.0, 4, 1e-300) == pytest.approx(3.0)


def test_the_l1_sensitivity_is_the_smaller_of_its_two_bounds() -> None:
    assert l1_sensitivity(3.0, 100) == 9.0  # Δ2² < √d·Δ2
    assert l1_sensitivity(100.0, 16) == 400.0  # √d·Δ2 < Δ2²


@settings(max_examples=40, deadline=None)
@given(dimension=st.integers(1, 500), norm=st.floats(0.0, 1e4), seed=st.integers(0, 10_000))
def test_conditional_rounding_stays_within_the_bound(dimension: int, norm: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=dimension)
    x = x / np.linalg.norm(x) * norm
    bound = rounded_norm_bound(norm, dimension, math.exp(-0.5))
    rounded = conditional_round(x, bound, rng)
    assert rounded.dtype == np.int64
    assert np.linalg.norm(rounded) <= bound
    assert np.all(np.abs(rounded - x) < 1.0)


def test_randomised_rounding_is_unbiased() -> None:
    x = np.array([0.25, -1.75, 3.5, 0.0])
    rng = np.random.default_rng(0)
    mean = np.mean([conditional_round(x, 1e9, rng) for _ in range(20_000)], axis=0)
    np.testing.assert_allclose(mean, x, atol=0.02)


def test_a_bound_no_rounding_meets_is_reported() -> None:
    with pytest.raises(RoundingFailed):
        conditional_round(np.full(4, 1.5), 1.0, np.random.default_rng(0))  # every rounding has norm ≥ 2


@settings(max_examples=50, deadline=None)
@given(bits=st.integers(8, 62), values=st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=20))
def test_centered_is_the_representative_of_the_residue(bits: int, values: list[int]) -> None:
    x = np.array(values, dtype=np.int64)
    residues = to_modular(x, bits)
    assert int(residues.max()) < 2**bits
    back = centered(residues, bits)
    half = 2 ** (bits - 1)
    assert np.all((back >= -half) & (back < half))
    assert all((int(b) - int(v)) % 2**bits == 0 for b, v in zip(back, values, strict=True))


def test_values_inside_the_range_come_back_unchanged() -> None:
    x = np.array([-128, -1, 0, 1, 127], dtype=np.int64)
    np.testing.assert_array_equal(centered(to_modular(x, 8), 8), x)


def test_a_wrap_within_a_quarter_range_is_flagged_and_a_true_value_below_the_band_is_not() -> None:
    bits = 12
    half, band = 2 ** (bits - 1), detection_threshold(bits)
    true_sums = np.array([0, band - 1, -(band - 1), half + 5, -half - 5, half + band - 1], dtype=np.int64)
    decoded = centered(to_modular(true_sums, bits), bits)
    np.testing.assert_array_equal(wrapped_coordinates(decoded, bits), [3, 4, 5])


@pytest.mark.parametrize("bits", [7, 63, 16.0])
def test_bit_widths_outside_8_to_62_are_refused(bits: object) -> None:
    with pytest.raises(ValueError, match="bits"):
        to_modular(np.zeros(1, dtype=np.int64), bits)  # type: ignore[arg-type]
