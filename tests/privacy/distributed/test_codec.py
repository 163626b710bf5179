"""A round's encoding and decoding: the sum of the clients' integer vectors decodes to the sum of their clipped
updates within the rounding bound, the noise is the parameters' noise, and a wrap is flagged."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_app.privacy.distributed.codec import SkellamCodec
from fl_app.privacy.distributed.encoding import detection_threshold, to_modular
from fl_app.privacy.distributed.skellam import SkellamParameters


def _clipped(rng: np.random.Generator, dimension: int, clip_norm: float) -> np.ndarray:
    x = rng.normal(size=dimension)
    return x / np.linalg.norm(x) * clip_norm * rng.uniform(0.1, 1.0)


def _modular_sum(vectors: list[np.ndarray], bits: int) -> np.ndarray:
    total = np.zeros_like(vectors[0], dtype=np.uint64)
    for vector in vectors:
        total = to_modular((total + vector.astype(np.uint64)).astype(np.int64), bits)
    return total


@settings(max_examples=25, deadline=None)
@given(
    dimension=st.integers(1, 400),
    clients=st.integers(1, 12),
    bits=st.sampled_from([16, 20, 32]),
    seed=st.integers(0, 10_000),
)
def test_the_sum_of_integer_vectors_decodes_to_the_clipped_sum_within_the_rounding_bound(
    dimension: int, clients: int, bits: int, seed: int
) -> None:
    parameters = SkellamParameters(
        clip_norm=0.5, dimension=dimension, min_clients=clients, max_clients=clients, noise_multiplier=1.0, bits=bits
    )
    codec = SkellamCodec(parameters, rotation_seed=seed)
    rng = np.random.default_rng(seed)
    updates = [_clipped(rng, dimension, 0.5) for _ in range(clients)]
    integers = [codec.integers(update, rng) for update in updates]
    decoded = codec.decode(_modular_sum([to_modular(x, bits) for x in integers], bits))
    assert not decoded.wrapped
    # Each rounding moves a vector by less than √d' integer units: the sum by less than n·√d' / s.
    bound = clients * math.sqrt(codec.rotation.padded) / parameters.scale
    assert np.linalg.norm(decoded.total - np.sum(updates, axis=0)) < bound


def test_the_decoded_noise_is_the_parameters_noise() -> None:
    parameters = SkellamParameters(
        clip_norm=1.0, dimension=4096, min_clients=3, max_clients=5, noise_multiplier=0.8, bits=20
    )
    codec = SkellamCodec(parameters, rotation_seed=0)
    rng = np.random.default_rng(0)
    updates = [_clipped(rng, 4096, 1.0) for _ in range(5)]
    decoded = codec.decode(_modular_sum([codec.encode(u, rng) for u in updates], 20))
    error = decoded.total - np.sum(updates, axis=0)
    # Five clients' shares of v/3 each: the sum carries 5v/3, i.e. a std of σ·Δ2·√(5/3) / s per coordinate.
    expected = 0.8 * parameters.l2_sensitivity * math.sqrt(5 / 3) / parameters.scale
    assert error.std() == pytest.approx(expected, rel=0.05)


def test_a_modular_wrap_in_the_sum_is_flagged() -> None:
    parameters = SkellamParameters(
        clip_norm=1.0, dimension=8, min_clients=1, max_clients=1, noise_multiplier=1.0, bits=12, overflow_target=0.5
    )
    codec = SkellamCodec(parameters, rotation_seed=0)
    past_the_range = np.zeros(8, dtype=np.int64)
    past_the_range[3] = 2**11 + 100  # a true sum beyond 2^(b-1): it wraps to a large negative value
    decoded = codec.decode(to_modular(past_the_range, 12))
    assert decoded.wrapped and decoded.flagged.tolist() == [3]
    assert detection_threshold(12) == 2**10


def test_an_update_past_the_clip_norm_is_refused() -> None:
    parameters = SkellamParameters(
        clip_norm=1.0, dimension=4, min_clients=1, max_clients=1, noise_multiplier=1.0, bits=16
    )
    with pytest.raises(ValueError, match="past the clip norm"):
        SkellamCodec(parameters, rotation_seed=0).integers(np.full(4, 1.0), np.random.default_rng(0))
