"""Tests for fl_app/privacy/mechanisms/: global-norm clipping (DP-FedSAM journal Eq. 10), Gaussian noise
(Eq. 11), fixed-denominator averaging and client sampling (docs/mechanisms.md, 1–4), clipping statistics (Eq. 18) and
the per-layer top-k / rand-k masks (Eq. 12; docs/algorithms.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fl_app.privacy.mechanisms import (
    RECLIP_TOLERANCE,
    add_gaussian_noise,
    add_to_sum,
    apply_mask,
    client_noise_topup_std,
    clip_factor,
    clip_update,
    clipping_stats,
    expected_clients,
    fixed_size_sample,
    gaussian_noise_std,
    global_l2_norm,
    has_shapes,
    is_finite_update,
    kept_count,
    make_rng,
    measure_update,
    poisson_sample,
    randk_mask,
    reclip,
    secure_rng,
    topk_mask,
    uniform_average,
    uniform_sum,
)

SHAPES = [(32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (10, 512), (10,)]


def _random_update(rng: np.random.Generator, scale: float = 1.0) -> list[np.ndarray]:
    return [(scale * rng.standard_normal(shape)).astype(np.float32) for shape in SHAPES]


def _naive_clip(update: list[np.ndarray], clip_norm: float) -> list[np.ndarray]:
    """Scale-and-cast without the re-check, to show the float32 overshoot the real clip guards against."""
    factor = min(1.0, clip_norm / global_l2_norm(update))
    return [(tensor.astype(np.float64) * factor).astype(np.float32) for tensor in update]


# ------------------------------------------------------------------------------------------------------------
# Norm and clipping
# ------------------------------------------------------------------------------------------------------------


def test_global_l2_norm_is_norm_of_flattened_update() -> None:
    update = _random_update(np.random.default_rng(0))
    flat = np.concatenate([tensor.ravel().astype(np.float64) for tensor in update])
    assert global_l2_norm(update) == pytest.approx(float(np.linalg.norm(flat)), rel=1e-12)
    assert global_l2_norm([np.array([3.0], np.float32), np.array([[4.0]], np.float32)]) == 5.0
    assert global_l2_norm([]) == 0.0


def test_clip_factor() -> None:
    assert clip_factor(0.0, 0.2) == 1.0
    assert clip_factor(0.1, 0.2) == 1.0
    assert clip_factor(0.2, 0.2) == 1.0
    assert clip_factor(0.8, 0.2) == pytest.approx(0.25)
    assert clip_factor(math.inf, 0.2) == 0.0
    with pytest.raises(ValueError):
        clip_factor(math.nan, 0.2)
    with pytest.raises(ValueError):
        clip_factor(1.0, 0.0)


@pytest.mark.parametrize("clip_norm", [1e-3, 0.2, 1.0, 7.3, 50.0])
@pytest.mark.parametrize("seed", range(5))
def test_clipped_random_update_has_global_norm_at_most_c(clip_norm: float, seed: int) -> None:
    update = _random_update(np.random.default_rng(seed), scale=10.0)
    clipped, norm = clip_update(update, clip_norm)
    assert norm == global_l2_norm(update)
    assert norm > clip_norm
    clipped_norm = global_l2_norm(clipped)
    assert clipped_norm <= clip_norm  # exact, which implies the required C + 1e-6
    assert clipped_norm == pytest.approx(clip_norm, rel=1e-6)  # clipped to C, not far below it
    assert [tensor.dtype for tensor in clipped] == [np.float32] * len(SHAPES)
    # Same direction: a single scalar factor for the whole update.
    ratio = clipped_norm / norm
    for original, result in zip(update, clipped, strict=True):
        np.testing.assert_allclose(result, original * ratio, rtol=1e-6, atol=1e-12)


def test_clip_is_exact_on_adversarial_float32_inputs() -> None:
    """Constant tensors whose scaled value rounds *up* in float32 make a plain scale-and-cast exceed C."""
    naive_overshoots = 0
    naive_beyond_tolerance = 0
    for size in range(2, 120):
        for clip_norm in (0.1, 0.2, 1.0, 3.0, 50.0):
            for value in (1.0, 0.3, 1e-20, 1e20):
                update = [np.full(size, value, np.float32), np.full((size, 2), -value, np.float32)]
                naive_excess = global_l2_norm(_naive_clip(update, clip_norm)) - clip_norm
                naive_overshoots += naive_excess > 0
                naive_beyond_tolerance += naive_excess > 1e-6
                clipped, _ = clip_update(update, clip_norm)
                assert global_l2_norm(clipped) <= clip_norm, (size, clip_norm, value)
    # The inputs are adversarial: the unchecked version does exceed C, even by more than 1e-6 for large C.
    assert naive_overshoots > 100
    assert naive_beyond_tolerance > 0


def test_clip_large_update_float32() -> None:
    rng = np.random.default_rng(3)
    update = [
        rng.standard_normal(1_000_000).astype(np.float32),
        rng.standard_normal((300, 300)).astype(np.float32),
    ]
    clipped, _ = clip_update(update, 0.2)
    assert global_l2_norm(clipped) <= 0.2


def test_clip_a_near_constant_float64_update_of_a_model_size_meets_c() -> None:
    """The server computes a Flower reply's Δ = trained − global in float64: a client that returns global + a
    constant gives a near-constant update, whose coordinates and norm terms all round the same way. Over 1.66M
    coordinates (the CNN's size) the measured norm stayed 1e-14 above C after the one-ulp retries, and the clip
    raised FloatingPointError, which failed the round. The doubling retries meet C with a shrink under 1e-13."""
    rng = np.random.default_rng(2)
    global_model = [rng.standard_normal(1_663_370).astype(np.float32)]
    for constant in (0.02, -0.3, 1e-3):
        update = [(g + np.float32(constant)).astype(np.float64) - g.astype(np.float64) for g in global_model]
        clipped, norm = clip_update(update, 0.2)
        assert norm > 0.2
        assert global_l2_norm(clipped) <= 0.2
        assert global_l2_norm(clipped) >= 0.2 * (1 - 1e-13)


def test_clip_float16_towards_a_tiny_c_never_exceeds_it() -> None:
    """Scaled towards C = 1e-6, float16 coordinates fall on subnormals, whose rounding error is absolute: in its
    own dtype the bound cannot always be met (the clip raised FloatingPointError before). It must hold anyway."""
    rng = np.random.default_rng(11)
    promoted = 0
    for _ in range(500):
        clip_norm = float(10 ** rng.uniform(-9, -3))
        update = [
            (rng.standard_normal(12) * 10 ** rng.uniform(-3, 4)).astype(np.float16),
            rng.standard_normal(5).astype(np.float16),
        ]
        clipped, norm = clip_update(update, clip_norm)
        assert norm == global_l2_norm(update)
        assert global_l2_norm(clipped) <= clip_norm
        promoted += clipped[0].dtype == np.float64
    assert promoted > 0  # the float64 fallback was exercised
    # A pinned case: every float16 factor leaves the coordinates above C; float64 meets it.
    clipped, _ = clip_update([np.full(3, 0.5, np.float16)], 1e-6)
    assert clipped[0].dtype == np.float64
    assert global_l2_norm(clipped) <= 1e-6


def test_update_below_c_is_returned_bitwise_unchanged_as_a_copy() -> None:
    update = _random_update(np.random.default_rng(1), scale=1e-4)
    assert global_l2_norm(update) < 0.2
    clipped, norm = clip_update(update, 0.2)
    assert norm == global_l2_norm(update)
    for original, result in zip(update, clipped, strict=True):
        assert result.dtype == original.dtype
        assert np.array_equal(result, original)
        assert result is not original
        assert not np.shares_memory(result, original)


def test_clip_does_not_modify_input() -> None:
    update = _random_update(np.random.default_rng(2), scale=5.0)
    before = [tensor.copy() for tensor in update]
    clip_update(update, 0.2)
    for tensor, saved in zip(update, before, strict=True):
        assert np.array_equal(tensor, saved)


def test_clipping_is_global_not_per_tensor() -> None:
    """Each tensor is inside the C-ball but the whole update is not: global clipping must scale it."""
    clip_norm = 0.2
    update = [np.array([0.09, 0.12], np.float32), np.array([[0.12], [0.09]], np.float32)]  # norms 0.15, 0.15
    assert all(global_l2_norm([tensor]) < clip_norm for tensor in update)
    assert global_l2_norm(update) == pytest.approx(0.15 * math.sqrt(2), rel=1e-6)

    clipped, _ = clip_update(update, clip_norm)
    assert global_l2_norm(clipped) <= clip_norm
    assert global_l2_norm(clipped) == pytest.approx(clip_norm, rel=1e-6)

    # Per-tensor clipping (the released code) would leave this update untouched at norm 0.212 > C.
    per_tensor = [clip_update([tensor], clip_norm)[0][0] for tensor in update]
    assert all(np.array_equal(a, b) for a, b in zip(per_tensor, update, strict=True))
    assert global_l2_norm(per_tensor) > clip_norm
    assert not all(np.array_equal(a, b) for a, b in zip(per_tensor, clipped, strict=True))


def test_clip_rejects_non_finite_update() -> None:
    with pytest.raises(ValueError):
        clip_update([np.array([1.0, np.nan], np.float32)], 0.2)
    with pytest.raises(ValueError):
        clip_update([np.array([np.inf], np.float32)], 0.2)


# ------------------------------------------------------------------------------------------------------------
# Gaussian noise
# ------------------------------------------------------------------------------------------------------------


def test_gaussian_noise_std_formulas() -> None:
    assert gaussian_noise_std(0.95, 0.2, 50.0, "client") == pytest.approx(0.95 * 0.2 / math.sqrt(50))
    assert gaussian_noise_std(0.95, 0.2, 50.0, "server") == pytest.approx(0.95 * 0.2 / 50)
    assert gaussian_noise_std(0.0, 0.2, 50.0, "server") == 0.0
    with pytest.raises(ValueError):
        gaussian_noise_std(0.95, 0.2, 50.0, "both")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        gaussian_noise_std(0.95, 0.2, 0.0, "client")


@pytest.mark.parametrize("placement", ["client", "server"])
def test_aggregate_noise_std_is_sigma_c_over_m_for_both_placements(placement: str) -> None:
    sigma, clip_norm, population, sample_rate = 0.95, 0.2, 500, 0.1
    m = expected_clients(population, sample_rate)
    coords = 100_000
    zeros = [np.zeros(coords, np.float32)]
    std = gaussian_noise_std(sigma, clip_norm, m, placement)  # type: ignore[arg-type]
    if placement == "client":
        # m clients each add N(0, σ²C²/m); the server averages over the fixed denominator m.
        noisy = [add_gaussian_noise(zeros, std, make_rng(7, 0, client)) for client in range(round(m))]
        aggregate = uniform_average(noisy, m, [(coords,)])[0]
    else:
        aggregate = add_gaussian_noise(uniform_average([], m, [(coords,)]), std, make_rng(7, 0))[0]
    target = sigma * clip_norm / m
    assert aggregate.dtype == np.float32
    assert float(np.std(aggregate.astype(np.float64))) == pytest.approx(target, rel=0.02)
    assert abs(float(np.mean(aggregate.astype(np.float64)))) < 5 * target / math.sqrt(coords)


def test_client_placement_topup_keeps_aggregate_std_when_clients_drop() -> None:
    sigma, clip_norm, m, coords = 0.95, 0.2, 10.0, 100_000
    per_client = gaussian_noise_std(sigma, clip_norm, m, "client")
    zeros = [np.zeros(coords, np.float32)]
    for contributing in (10, 7, 1, 0):
        noisy = [add_gaussian_noise(zeros, per_client, make_rng(3, contributing, c)) for c in range(contributing)]
        average = uniform_average(noisy, m, [(coords,)])
        topup = client_noise_topup_std(sigma, clip_norm, m, contributing)
        aggregate = add_gaussian_noise(average, topup, make_rng(4, contributing))[0].astype(np.float64)
        assert float(np.std(aggregate)) == pytest.approx(sigma * clip_norm / m, rel=0.02)
    assert client_noise_topup_std(sigma, clip_norm, m, 10) == 0.0
    assert client_noise_topup_std(sigma, clip_norm, m, 12) == 0.0  # never negative


def test_secure_rng_draws_standard_gaussian_and_is_not_seeded() -> None:
    draws = [secure_rng().normal(0.0, 0.3, (100_001,)) for _ in range(2)]
    for z in draws:
        assert z.shape == (100_001,)
        assert float(np.std(z)) == pytest.approx(0.3, rel=0.02)
        assert abs(float(np.mean(z))) < 5 * 0.3 / math.sqrt(z.size)
        assert np.isfinite(z).all()
        # Gaussian tails: about 4.55% of draws beyond 2 std.
        assert float(np.mean(np.abs(z) > 0.6)) == pytest.approx(0.0455, abs=0.004)
    assert not np.array_equal(draws[0], draws[1])
    noisy = add_gaussian_noise([np.zeros((3, 4), np.float32)], 1.0, secure_rng())
    assert noisy[0].dtype == np.float32 and noisy[0].shape == (3, 4)


def test_noise_is_deterministic_per_key_and_independent_across_keys() -> None:
    update = _random_update(np.random.default_rng(0))
    first = add_gaussian_noise(update, 0.1, make_rng(42, 3, 17))
    again = add_gaussian_noise(update, 0.1, make_rng(42, 3, 17))
    other_client = add_gaussian_noise(update, 0.1, make_rng(42, 3, 18))
    other_seed = add_gaussian_noise(update, 0.1, make_rng(43, 3, 17))
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(first, other_client, strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(first, other_seed, strict=True))
    # make_rng(seed, a, b) is not make_rng(seed, b, a): the key order matters.
    assert make_rng(1, 2, 3).random() != make_rng(1, 3, 2).random()


def test_add_noise_preserves_dtype_and_input_and_zero_std_copies() -> None:
    update = _random_update(np.random.default_rng(0))
    before = [tensor.copy() for tensor in update]
    noisy = add_gaussian_noise(update, 0.5, make_rng(0))
    assert [tensor.dtype for tensor in noisy] == [np.float32] * len(SHAPES)
    assert [tensor.shape for tensor in noisy] == SHAPES
    assert all(np.array_equal(a, b) for a, b in zip(update, before, strict=True))
    rng = make_rng(0)
    state = rng.bit_generator.state
    copies = add_gaussian_noise(update, 0.0, rng)
    assert rng.bit_generator.state == state
    assert all(np.array_equal(a, b) and a is not b for a, b in zip(copies, update, strict=True))


#: Values where another rounding or order of operations would show: signed zeros, subnormals, overflow, NaN, ±inf.
SPECIALS = [0.0, -0.0, 1e-45, -1e-45, 5e-324, 3.4e38, -3.4e38, 1e300, np.nan, np.inf, -np.inf]


def _with_specials(tensor: np.ndarray) -> np.ndarray:
    out = tensor.copy()
    with np.errstate(over="ignore", under="ignore"):
        specials = np.array(SPECIALS, dtype=np.float64).astype(out.dtype)
    count = min(out.size, specials.size)
    out.ravel()[:count] = specials[:count]
    return out


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_noise_is_added_in_float64_and_rounded_once_bit_for_bit(dtype) -> None:
    update = [_with_specials(t.astype(dtype)) for t in _random_update(np.random.default_rng(3), scale=1e-3)]
    noisy = add_gaussian_noise(update, 0.25, make_rng(7, 1))
    rng = make_rng(7, 1)
    with np.errstate(over="ignore", invalid="ignore"):
        former = [(t.astype(np.float64) + rng.normal(0.0, 0.25, size=t.shape)).astype(t.dtype) for t in update]
    assert all(a.dtype == dtype and a.tobytes() == b.tobytes() for a, b in zip(noisy, former, strict=True))


def test_uniform_average_rounds_the_float64_quotient_once_bit_for_bit() -> None:
    rng = np.random.default_rng(4)
    updates = [[_with_specials(t) for t in _random_update(rng, scale=10.0**-k)] for k in range(4)]
    with np.errstate(over="ignore", invalid="ignore"):
        average = uniform_average(updates, 2.5, SHAPES)
        former = [(total / 2.5).astype(np.float32) for total in uniform_sum(updates, SHAPES)]
    assert all(a.dtype == np.float32 and a.tobytes() == b.tobytes() for a, b in zip(average, former, strict=True))


def test_make_rng_does_not_touch_global_state_and_rejects_negative_keys() -> None:
    np.random.seed(123)
    expected = np.random.random()
    np.random.seed(123)
    add_gaussian_noise([np.zeros(10, np.float32)], 1.0, make_rng(5, 1, 2))
    poisson_sample(100, 0.5, make_rng(5, 1))
    assert np.random.random() == expected
    with pytest.raises(ValueError):
        make_rng(1, -1)
    with pytest.raises(ValueError):
        make_rng(1, 2.5)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------------
# Validation and aggregation
# ------------------------------------------------------------------------------------------------------------


def test_is_finite_update_and_has_shapes() -> None:
    update = _random_update(np.random.default_rng(0))
    assert is_finite_update(update)
    assert has_shapes(update, SHAPES)
    bad = [tensor.copy() for tensor in update]
    bad[2].flat[5] = np.nan
    assert not is_finite_update(bad)
    bad[2].flat[5] = -np.inf
    assert not is_finite_update(bad)
    assert not has_shapes(update[:-1], SHAPES)
    assert not has_shapes(update, [*SHAPES[:-1], (11,)])
    assert not has_shapes([update[0].reshape(-1), *update[1:]], SHAPES)


def test_uniform_average_uses_the_fixed_denominator() -> None:
    shapes = [(2,), (1, 2)]
    updates = [
        [np.array([1.0, 2.0], np.float32), np.array([[3.0, 4.0]], np.float32)],
        [np.array([10.0, 20.0], np.float32), np.array([[30.0, 40.0]], np.float32)],
        [np.array([100.0, 200.0], np.float32), np.array([[300.0, 400.0]], np.float32)],
    ]
    # 3 clients reported, m = 5: divide by 5, not by 3.
    average = uniform_average(updates, 5.0, shapes)
    np.testing.assert_array_equal(average[0], np.array([111.0, 222.0], np.float32) / np.float32(5))
    np.testing.assert_allclose(average[1], [[66.6, 88.8]], rtol=1e-6)
    assert all(tensor.dtype == np.float32 for tensor in average)
    empty = uniform_average([], 5.0, shapes)
    assert [tensor.shape for tensor in empty] == shapes
    assert all(not tensor.any() and tensor.dtype == np.float32 for tensor in empty)
    with pytest.raises(ValueError):
        uniform_average([[np.zeros(3, np.float32), np.zeros((1, 2), np.float32)]], 5.0, shapes)
    with pytest.raises(ValueError):
        uniform_average(updates, 0.0, shapes)


def test_uniform_average_is_deterministic_and_accumulates_in_float64() -> None:
    # 1 + 1e-8·(many) in float32 would lose the small terms; float64 accumulation keeps them.
    updates = [[np.array([1.0], np.float32)]] + [[np.array([1e-8], np.float32)]] * 1000
    average = uniform_average(updates, 1.0, [(1,)])
    assert average[0][0] == np.float32(1.0 + 1000 * float(np.float32(1e-8)))
    assert np.array_equal(uniform_average(updates, 1.0, [(1,)])[0], average[0])


# ------------------------------------------------------------------------------------------------------------
# Sampling
# ------------------------------------------------------------------------------------------------------------


def test_expected_clients_is_unrounded_qm() -> None:
    assert expected_clients(500, 0.1) == 50.0
    assert isinstance(expected_clients(500, 0.1), float)
    assert expected_clients(25, 0.1) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        expected_clients(500, 0.0)


def test_poisson_inclusion_frequency_is_q() -> None:
    population, sample_rate, rounds = 1000, 0.1, 200
    counts = np.zeros(population)
    sizes = []
    for round_index in range(rounds):
        sample = poisson_sample(population, sample_rate, make_rng(11, round_index))
        assert np.all(np.diff(sample) > 0)  # sorted, distinct
        assert sample.size == 0 or (sample[0] >= 0 and sample[-1] < population)
        counts[sample] += 1
        sizes.append(sample.size)
    trials = population * rounds
    sd = math.sqrt(trials * sample_rate * (1 - sample_rate))
    assert abs(counts.sum() - trials * sample_rate) < 4 * sd
    assert len(set(sizes)) > 1  # the number of participants varies: it is not fixed-size sampling
    # Per-client inclusion counts are Binomial(200, 0.1): none is far outside its 5-sigma band.
    per_client_sd = math.sqrt(rounds * sample_rate * (1 - sample_rate))
    assert np.abs(counts - rounds * sample_rate).max() < 5 * per_client_sd
    assert np.array_equal(
        poisson_sample(population, sample_rate, make_rng(11, 0)),
        poisson_sample(population, sample_rate, make_rng(11, 0)),
    )


def test_fixed_size_sample_picks_exactly_m_distinct_uniformly() -> None:
    population, size, rounds = 500, 50, 400
    counts = np.zeros(population)
    for round_index in range(rounds):
        sample = fixed_size_sample(population, size, make_rng(5, round_index))
        assert sample.size == size
        assert np.unique(sample).size == size
        assert np.all(np.diff(sample) > 0)
        assert sample[0] >= 0 and sample[-1] < population
        counts[sample] += 1
    rate = size / population
    sd = math.sqrt(rounds * rate * (1 - rate))
    assert np.abs(counts - rounds * rate).max() < 5 * sd
    assert fixed_size_sample(10, 0, make_rng(0)).size == 0
    assert np.array_equal(fixed_size_sample(10, 10, make_rng(0)), np.arange(10))
    with pytest.raises(ValueError):
        fixed_size_sample(10, 11, make_rng(0))


# ------------------------------------------------------------------------------------------------------------
# Clipping statistics
# ------------------------------------------------------------------------------------------------------------


def test_clipping_stats_hand_computed() -> None:
    # α = [1, 1, 0.5, 0.25]; ᾱ = 0.6875; |α − ᾱ| = [0.3125, 0.3125, 0.1875, 0.4375] → α̃ = 0.3125.
    stats = clipping_stats([0.8, 0.1, 0.4, 0.2], clip_norm=0.2)
    expected = {
        "norm_mean": 0.375,
        "norm_median": 0.3,
        "norm_max": 0.8,
        "norm_q25": 0.175,  # linear interpolation: 0.1 + 0.75 · (0.2 − 0.1)
        "norm_q75": 0.5,  # 0.4 + 0.25 · (0.8 − 0.4)
        "alpha_mean": 0.6875,
        "alpha_dispersion": 0.3125,
        "fraction_clipped": 0.5,  # 0.2 is exactly C and is not clipped
    }
    assert stats.keys() == expected.keys()
    for key, value in expected.items():
        assert stats[key] == pytest.approx(value, abs=1e-12), key


def test_clipping_stats_empty_is_nan_and_none_clipped_is_zero_dispersion() -> None:
    empty = clipping_stats([], 0.2)
    assert len(empty) == 8 and all(math.isnan(value) for value in empty.values())
    unclipped = clipping_stats([0.01, 0.05], 0.2)
    assert unclipped["alpha_mean"] == 1.0
    assert unclipped["alpha_dispersion"] == 0.0
    assert unclipped["fraction_clipped"] == 0.0


# ------------------------------------------------------------------------------------------------------------
# Masks
# ------------------------------------------------------------------------------------------------------------

MASK_SHAPES = [(10,), (3, 4), (7,), (1,), (5, 5, 3)]


def test_kept_count_is_ceil_p_d_without_float_artifacts() -> None:
    assert [kept_count(math.prod(shape), 0.4) for shape in MASK_SHAPES] == [4, 5, 3, 1, 30]
    assert kept_count(10, 0.7) == 7  # 0.7 * 10 == 7.000000000000001 in floating point
    assert kept_count(10, 0.3) == 3  # 0.3 * 10 == 3.0000000000000004
    assert kept_count(10, 0.71) == 8
    assert kept_count(10, 1.0) == 10
    assert kept_count(0, 0.4) == 0
    with pytest.raises(ValueError):
        kept_count(10, 0.0)


def test_topk_mask_keeps_exactly_k_largest_per_layer() -> None:
    rng = np.random.default_rng(0)
    update = [rng.standard_normal(shape).astype(np.float32) for shape in MASK_SHAPES]
    masks = topk_mask(update, 0.4)
    for tensor, mask in zip(update, masks, strict=True):
        k = kept_count(tensor.size, 0.4)
        assert mask.shape == tensor.shape and mask.dtype == bool
        assert int(mask.sum()) == k
        magnitude = np.abs(tensor)
        # every kept magnitude is ≥ every dropped one
        if k < tensor.size:
            assert magnitude[mask].min() >= magnitude[~mask].max()
        np.testing.assert_array_equal(np.sort(magnitude[mask]), np.sort(magnitude.ravel())[-k:])


def test_topk_mask_uses_magnitude_and_breaks_ties_deterministically() -> None:
    update = [np.array([0.1, -5.0, 3.0, -0.2, 4.0], np.float32)]
    np.testing.assert_array_equal(topk_mask(update, 0.4)[0], [False, True, False, False, True])
    ties = [np.ones((3, 4), np.float32)]
    mask = topk_mask(ties, 0.4)[0]
    assert int(mask.sum()) == 5
    np.testing.assert_array_equal(mask.ravel(), [True] * 5 + [False] * 7)  # lowest flat indices win
    partial_ties = [np.array([2.0, 1.0, 1.0, 1.0, 0.5], np.float32)]
    np.testing.assert_array_equal(topk_mask(partial_ties, 0.4)[0], [True, True, False, False, False])
    with pytest.raises(ValueError):
        topk_mask([np.array([np.nan, 1.0], np.float32)], 0.5)


def test_randk_mask_exact_count_and_seeded() -> None:
    masks = randk_mask(MASK_SHAPES, 0.4, make_rng(9, 1))
    for shape, mask in zip(MASK_SHAPES, masks, strict=True):
        assert mask.shape == shape and mask.dtype == bool
        assert int(mask.sum()) == kept_count(math.prod(shape), 0.4)
    again = randk_mask(MASK_SHAPES, 0.4, make_rng(9, 1))
    assert all(np.array_equal(a, b) for a, b in zip(masks, again, strict=True))
    other = randk_mask(MASK_SHAPES, 0.4, make_rng(9, 2))
    assert not all(np.array_equal(a, b) for a, b in zip(masks, other, strict=True))


def test_randk_mask_is_uniform() -> None:
    counts = np.zeros(20)
    draws = 2000
    for draw in range(draws):
        counts += randk_mask([(20,)], 0.25, make_rng(4, draw))[0]
    rate = 5 / 20
    sd = math.sqrt(draws * rate * (1 - rate))
    assert np.abs(counts - draws * rate).max() < 5 * sd


def test_apply_mask_zeroes_dropped_coordinates() -> None:
    update = [np.arange(1, 7, dtype=np.float32).reshape(2, 3), np.array([-1.0, 2.0], np.float32)]
    mask = [np.array([[True, False, True], [False, False, True]]), np.array([False, True])]
    masked = apply_mask(update, mask)
    np.testing.assert_array_equal(masked[0], [[1.0, 0.0, 3.0], [0.0, 0.0, 6.0]])
    np.testing.assert_array_equal(masked[1], [0.0, 2.0])
    assert all(tensor.dtype == np.float32 for tensor in masked)
    assert update[0][0, 1] == 2.0  # input untouched
    with pytest.raises(ValueError):
        apply_mask(update, mask[:1])
    with pytest.raises(ValueError):
        apply_mask(update, [mask[0].T, mask[1]])


def test_reclip_bounds_any_update_and_flags_only_senders_that_did_not_clip():
    rng = np.random.default_rng(3)
    update = [rng.standard_normal((30, 20)).astype(np.float32), rng.standard_normal(20).astype(np.float32)]
    clipped_by_sender, _ = clip_update(update, 0.5)  # within float32 rounding of C
    again, flagged = reclip(clipped_by_sender, 0.5)
    assert not flagged and global_l2_norm(again) <= 0.5
    huge, flagged = reclip([2.0 * u for u in clipped_by_sender], 0.5)
    assert flagged and global_l2_norm(huge) <= 0.5
    _, flagged = reclip([(1 + 2 * RECLIP_TOLERANCE) * u for u in clipped_by_sender], 0.5)
    assert flagged  # just past the tolerance is a sender that did not clip


def test_reclip_returns_an_update_within_the_bound_as_it_is_and_trusts_only_a_measured_norm():
    rng = np.random.default_rng(4)
    update = [rng.standard_normal((30, 20)).astype(np.float32), rng.standard_normal(20).astype(np.float32)]
    norm = global_l2_norm(update)
    kept, flagged = reclip(update, norm)  # exactly at the bound: nothing to clip, nothing copied
    assert not flagged and all(a is b for a, b in zip(kept, update, strict=True))
    assert reclip(update, norm, norm=norm)[0][0] is update[0]
    # The norm the caller measured decides whether to clip; beyond the bound it is the clip's copy.
    clipped, flagged = reclip(update, norm / 2, norm=norm)
    assert flagged and global_l2_norm(clipped) <= norm / 2 and clipped[0] is not update[0]
    expected, _ = clip_update(update, norm / 2)
    assert all(np.array_equal(a, b) for a, b in zip(clipped, expected, strict=True))
    with pytest.raises(ValueError):
        reclip([np.array([np.nan], dtype=np.float32)], 1.0)
    with pytest.raises(TypeError):
        reclip([np.array([1, 2])], 10.0)


def test_measure_update_gives_the_screens_verdict_and_the_norm_it_measured():
    rng = np.random.default_rng(5)
    update = _random_update(rng)
    assert measure_update(update, SHAPES) == (None, global_l2_norm(update))
    assert measure_update(update[:-1], SHAPES)[0] == "shape"
    assert measure_update([u.astype(np.int32) for u in update], SHAPES)[0] == "shape"
    nan = [u.copy() for u in update]
    nan[1][0] = np.nan
    assert measure_update(nan, SHAPES)[0] == "nonfinite"
    overflowing = [np.full(shape, 1e200) for shape in SHAPES]
    with np.errstate(over="ignore"):
        kind, norm = measure_update(overflowing, SHAPES)
    assert kind == "nonfinite" and not math.isfinite(norm)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_one_nonfinite_coordinate_anywhere_rejects_the_update(dtype: type, bad: float):
    rng = np.random.default_rng(7)
    shapes = [(3, 70_000), (5,)]  # the first tensor spans several of the norm's blocks
    for index in (0, 65_535, 65_536, 209_999):
        update = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
        update[0].reshape(-1)[index] = bad
        assert measure_update(update, shapes)[0] == "nonfinite"
        assert not is_finite_update(update)
    update = [rng.standard_normal(shape).astype(dtype) for shape in shapes]
    update[1][-1] = bad
    assert measure_update(update, shapes)[0] == "nonfinite"


def test_uniform_sum_widens_each_dtype_exactly_as_a_float64_copy_would():
    rng = np.random.default_rng(6)
    updates = [[(rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 8)).astype(dtype) for shape in SHAPES]
               for dtype in (np.float16, np.float32, np.float64, np.float32)]  # fmt: skip
    expected = [np.zeros(shape) for shape in SHAPES]
    for update in updates:
        for total, tensor in zip(expected, update, strict=True):
            total += tensor.astype(np.float64)
    summed = uniform_sum(updates, SHAPES)
    assert all(t.dtype == np.float64 and np.array_equal(t, e) for t, e in zip(summed, expected, strict=True))


def test_adding_to_a_sum_one_update_at_a_time_is_uniform_sum() -> None:
    rng = np.random.default_rng(5)
    updates = [_random_update(rng, scale=10.0**-k) for k in range(3)]
    totals = uniform_sum([], SHAPES)
    for update in updates:
        add_to_sum(totals, update)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(totals, uniform_sum(updates, SHAPES), strict=True))
    with pytest.raises(ValueError, match="shapes"):
        add_to_sum(totals, updates[0][:-1])
