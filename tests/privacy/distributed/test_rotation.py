"""The randomised Hadamard rotation: orthonormal, inverted exactly, the same for the same seed, and spreading a
spike evenly (the property the overflow bound rests on)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import hadamard

from fl_app.privacy.distributed.rotation import RandomizedHadamard, padded_dimension, walsh_hadamard


@pytest.mark.parametrize(("dimension", "padded"), [(1, 1), (2, 2), (3, 4), (1000, 1024), (1024, 1024), (1025, 2048)])
def test_padded_dimension_is_the_next_power_of_two(dimension: int, padded: int) -> None:
    assert padded_dimension(dimension) == padded


@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_padded_dimension_refuses_non_positive_ints(bad: object) -> None:
    with pytest.raises(ValueError, match="positive int"):
        padded_dimension(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [1, 2, 8, 64])
def test_walsh_hadamard_is_the_hadamard_matrix(size: int) -> None:
    x = np.random.default_rng(size).normal(size=size)
    np.testing.assert_allclose(walsh_hadamard(x), hadamard(size) @ x, atol=1e-12)


def test_walsh_hadamard_refuses_a_length_that_is_not_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power of two"):
        walsh_hadamard(np.ones(6))


@settings(max_examples=30, deadline=None)
@given(dimension=st.integers(1, 300), seed=st.integers(0, 2**32 - 1), data_seed=st.integers(0, 1000))
def test_rotation_keeps_the_norm_and_unrotate_inverts_it(dimension: int, seed: int, data_seed: int) -> None:
    rotation = RandomizedHadamard(dimension, seed)
    x = np.random.default_rng(data_seed).normal(size=dimension)
    y = rotation.rotate(x)
    assert y.shape == (padded_dimension(dimension),)
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-12)
    np.testing.assert_allclose(rotation.unrotate(y), x, atol=1e-12)


def test_the_signs_are_a_function_of_the_seed_alone() -> None:
    x = np.arange(10.0)
    np.testing.assert_array_equal(RandomizedHadamard(10, 3).rotate(x), RandomizedHadamard(10, 3).rotate(x))
    assert not np.array_equal(RandomizedHadamard(10, 3).rotate(x), RandomizedHadamard(10, 4).rotate(x))


def test_a_spike_is_spread_evenly_over_the_coordinates() -> None:
    spike = np.zeros(4096)
    spike[17] = 1.0
    rotated = RandomizedHadamard(4096, 0).rotate(spike)
    np.testing.assert_allclose(np.abs(rotated), 1.0 / 64.0)


def test_a_vector_of_the_wrong_length_is_refused() -> None:
    rotation = RandomizedHadamard(5, 0)
    with pytest.raises(ValueError, match="length 5"):
        rotation.rotate(np.ones(4))
    with pytest.raises(ValueError, match="length 8"):
        rotation.unrotate(np.ones(5))
