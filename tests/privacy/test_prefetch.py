"""fl_app/privacy/prefetch.py: the server's noise drawn ahead is the noise drawn on demand, bit for bit (seeded), with
the same law (CSPRNG), in stream order."""

from __future__ import annotations

import numpy as np
import pytest

from fl_app.privacy.mechanisms import add_gaussian_noise, make_rng, secure_rng
from fl_app.privacy.prefetch import PrefetchedNormals

# The paper CNN's tensors (fl_app/models.py), where the 1.6M-weight layer is the one worth drawing ahead.
SHAPES = [(32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (512, 3136), (512,), (10, 512), (10,)]


@pytest.mark.parametrize("std", [0.95 * 0.2 / 20, 1.0, 3.7e-5, 1e-300])
def test_prefetched_noise_is_the_seeded_streams_noise_bit_for_bit(std: float) -> None:
    rng = make_rng(7, 3, 2)
    on_demand = [rng.normal(0.0, std, size=shape) for shape in SHAPES]
    prefetched = PrefetchedNormals(make_rng(7, 3, 2), SHAPES)
    ahead = [prefetched.normal(0.0, std, size=shape) for shape in SHAPES]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(ahead, on_demand, strict=True))  # every bit


def test_the_mechanism_adds_the_same_noise_with_a_prefetched_source() -> None:
    average = [np.random.default_rng(1).standard_normal(shape).astype(np.float32) for shape in SHAPES]
    std = 0.95 * 0.2 / 20
    expected = add_gaussian_noise(average, std, make_rng(11, 5, 2))
    noised = add_gaussian_noise(average, std, PrefetchedNormals(make_rng(11, 5, 2), [a.shape for a in average]))
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(noised, expected, strict=True))


def test_draws_past_the_prefetched_shapes_continue_the_stream() -> None:
    rng = make_rng(3, 1)
    expected = [rng.normal(0.0, 2.0, size=(4, 5)), rng.normal(0.0, 2.0, size=(6,))]
    prefetched = PrefetchedNormals(make_rng(3, 1), [(4, 5)])
    got = [prefetched.normal(0.0, 2.0, size=(4, 5)), prefetched.normal(0.0, 2.0, size=(6,))]
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


def test_draws_of_other_shapes_take_the_same_stream_in_order() -> None:
    rng = make_rng(3, 1)
    expected = [rng.normal(0.0, 0.5, size=shape) for shape in [(6,), (2, 7), (5000,)]]
    prefetched = PrefetchedNormals(make_rng(3, 1), [(4, 5), (6,)])  # 26 drawn ahead; asked for 6, 14, then 5000
    got = [prefetched.normal(0.0, 0.5, size=shape) for shape in [(6,), (2, 7), (5000,)]]
    assert all(a.shape == b.shape and a.tobytes() == b.tobytes() for a, b in zip(got, expected, strict=True))


def test_a_failing_source_fails_the_draw_not_silently() -> None:
    class Broken:
        def normal(self, loc: float, scale: float, size: tuple[int, ...]) -> np.ndarray:
            raise OSError("no entropy")

    prefetched = PrefetchedNormals(Broken(), [(3,)])
    with pytest.raises(RuntimeError, match="prefetched noise") as info:
        prefetched.normal(0.0, 1.0, size=(3,))
    assert isinstance(info.value.__cause__, OSError)


def test_csprng_noise_drawn_ahead_has_the_requested_law() -> None:
    std = 0.25
    noise = PrefetchedNormals(secure_rng(), [(400_000,)]).normal(0.0, std, size=(400_000,))
    # Mean and std of 400k draws: standard errors 4e-4 and 2.8e-4 (of std 0.25); 6 sigma bounds.
    assert abs(noise.mean()) < 6 * std / np.sqrt(noise.size)
    assert abs(noise.std() / std - 1) < 6 / np.sqrt(2 * noise.size)
