"""The masks: uniform modulo 2^b, a function of the seed and stream alone; the random Harary graph."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fl_app.secure_aggregation.masks import SEED_BYTES, harary_neighbours, mask_vector, new_seed
from fl_app.secure_aggregation.messages import vector_from_bytes, vector_to_bytes


def test_a_mask_is_a_function_of_its_seed_and_stream() -> None:
    seed = bytes(range(32))
    first = mask_vector(seed, 1000, 20)
    np.testing.assert_array_equal(first, mask_vector(seed, 1000, 20))
    assert not np.array_equal(first, mask_vector(seed, 1000, 20, stream=1))
    assert not np.array_equal(first, mask_vector(new_seed(), 1000, 20))
    # A longer mask of the same seed extends the shorter one (one keystream).
    np.testing.assert_array_equal(mask_vector(seed, 10, 20), first[:10])


@pytest.mark.parametrize("bits", [8, 20, 32, 62])
def test_masks_are_uniform_modulo_2_to_the_b(bits: int) -> None:
    mask = mask_vector(bytes(SEED_BYTES), 200_000, bits)
    assert int(mask.max()) < 2**bits
    fractions = mask.astype(np.float64) / 2.0**bits
    assert stats.kstest(fractions, "uniform").pvalue > 1e-4


def test_a_seed_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        mask_vector(b"short", 10, 20)


@pytest.mark.parametrize(("n", "degree"), [(10, 2), (10, 4), (11, 3), (50, 8)])
def test_the_harary_graph_is_regular_and_symmetric(n: int, degree: int) -> None:
    neighbours = harary_neighbours(list(range(100, 100 + n)), degree)
    expected = degree + degree % 2  # an odd degree is raised to the next even one
    assert {len(nbrs) for nbrs in neighbours.values()} == {expected}
    for node, nbrs in neighbours.items():
        assert node not in nbrs
        assert all(node in neighbours[other] for other in nbrs)


def test_a_degree_of_n_minus_one_is_the_complete_graph() -> None:
    neighbours = harary_neighbours([1, 2, 3, 4], 3)
    assert neighbours == {1: {2, 3, 4}, 2: {1, 3, 4}, 3: {1, 2, 4}, 4: {1, 2, 3}}
    with pytest.raises(ValueError, match="at least 2 nodes"):
        harary_neighbours([1], 1)


@pytest.mark.parametrize("bits", [16, 32, 40])
def test_vectors_travel_as_bytes(bits: int) -> None:
    vector = mask_vector(bytes(SEED_BYTES), 100, bits)
    data = vector_to_bytes(vector, bits)
    assert len(data) == (4 if bits <= 32 else 8) * 100
    np.testing.assert_array_equal(vector_from_bytes(data, bits, 100), vector)
    with pytest.raises(ValueError, match="bytes"):
        vector_from_bytes(data[:-1], bits, 100)


def test_a_vector_out_of_range_is_refused() -> None:
    data = vector_to_bytes(np.array([2**20], dtype=np.uint64), 32)
    with pytest.raises(ValueError, match="outside"):
        vector_from_bytes(data, 20, 1)
