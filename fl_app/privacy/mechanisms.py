"""Client-level DP mechanisms: the only place in the project where mechanism math is written.

Implements, for DP-FedAvg (McMahan et al. 2018) and DP-FedSAM (Shi et al., CVPR'23; journal version with
DP-FedSAM-topk), as pinned down by ``SPEC.md``:

- client sampling (SPEC §1): Poisson sampling with rate q and the *fixed* denominator m = qM, or fixed-size
  sampling of exactly m clients without replacement;
- global-norm clipping Δ̃ = Δ · min(1, C/‖Δ‖) (journal Eq. 10; SPEC §2);
- Gaussian noise N(0, σ²C²/m · I) per client or N(0, σ²C²/m² · I) on the average (journal Eq. 11; SPEC §2);
- the uniform average over the fixed denominator m (SPEC §2);
- clipping diagnostics ᾱ and α̃ = mean |α_i − ᾱ| (journal Eq. 18);
- per-layer top-k masks (journal Eq. 12; SPEC §5) and rand-k masks (SPEC_BASELINES.md, Fed-SMP-randk),
  both keeping exactly k_l = ⌈p · d_l⌉ coordinates of layer l.

An update is ``NDArrays`` (one array per model tensor, normally float32). Every random draw takes an explicit
random source; nothing here reads or reseeds global RNG state. Which source — a seeded stream of (seed, round,
purpose[, client]) or the operating system's CSPRNG — is decided in one place, :func:`random_source`.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Sequence
from typing import Literal, Protocol

import numpy as np

from fl_app.choices import Placement

NDArrays = list[np.ndarray]

__all__ = [
    "CLIPPING_STATS_KEYS",
    "NDArrays",
    "add_gaussian_noise",
    "add_to_sum",
    "apply_mask",
    "client_noise_topup_std",
    "clip_factor",
    "clip_update",
    "clipping_stats",
    "expected_clients",
    "fixed_size_sample",
    "gaussian_noise_std",
    "global_l2_norm",
    "has_shapes",
    "is_finite_update",
    "joint_noise_multiplier",
    "kept_count",
    "make_rng",
    "measure_update",
    "noisy_count",
    "poisson_sample",
    "randk_mask",
    "random_source",
    "reclip",
    "secure_rng",
    "topk_mask",
    "uniform_average",
    "uniform_sum",
    "update_noise_for_joint",
]

# How many times clip_update may shrink its factor by one ulp-sized step before giving up; a single step
# already suffices for float32 (see clip_update), the rest is headroom for float16/bfloat16-like dtypes.
_MAX_CLIP_RETRIES = 16


# ------------------------------------------------------------------------------------------------------------
# Norms and clipping (journal Eq. 10)
# ------------------------------------------------------------------------------------------------------------


_NORM_BLOCK = 1 << 16


def global_l2_norm(update: Sequence[np.ndarray]) -> float:
    """L2 norm of the whole flattened update, ‖Δ‖ = sqrt(Σ_l ‖Δ_l‖²).

    Accumulated in float64: float32 accumulation over millions of coordinates loses enough precision to make
    the clipping guarantee ‖Δ̃‖ ≤ C unverifiable.
    """
    total = 0.0
    for tensor in update:
        flat = np.asarray(tensor).ravel()
        # Converted block by block: a float64 copy of a whole model is a fresh multi-MB allocation per call (and a
        # float64 tensor, such as a cohort's sum, is read where it lies: the same values, so the same norm).
        for start in range(0, flat.size, _NORM_BLOCK):
            block = flat[start : start + _NORM_BLOCK].astype(np.float64, copy=False)
            total += float(np.dot(block, block))
    return math.sqrt(total)


def _round_down(value: float, dtype: np.dtype) -> np.floating:
    """``value`` in ``dtype``, rounded towards zero (a clip factor must never grow by rounding)."""
    cast = np.asarray(value, dtype=dtype)[()]
    return np.nextafter(cast, dtype.type(0)) if float(cast) > value else cast


def clip_factor(norm: float, clip_norm: float) -> float:
    """α = min(1, C/‖Δ‖) (journal Eq. 10); α = 1 for the zero update, α = 0 for an infinite norm.

    Raises ValueError for a NaN or negative norm: a NaN update must be rejected upstream, not silently scaled.
    """
    if clip_norm <= 0 or not math.isfinite(clip_norm):
        raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm}")
    if math.isnan(norm) or norm < 0:
        raise ValueError(f"norm must be a non-negative number, got {norm}")
    if norm <= clip_norm:
        return 1.0
    return clip_norm / norm


#: How far above its bound a received update may be and still count as clipped by its sender: a correct clip lands
#: within float32 rounding of C (a relative 2⁻²⁴ ≈ 6e-8), so anything past 1e-5 is a sender that did not clip.
RECLIP_TOLERANCE = 1e-5


def _floating_arrays(update: Sequence[np.ndarray], caller: str) -> NDArrays:
    """The update's tensors as arrays; TypeError naming ``caller`` for a non-floating one."""
    arrays = [np.asarray(tensor) for tensor in update]
    for tensor in arrays:
        if not np.issubdtype(tensor.dtype, np.floating):
            raise TypeError(f"{caller} expects floating-point tensors, got dtype {tensor.dtype}")
    return arrays


def reclip(update: Sequence[np.ndarray], bound: float, norm: float | None = None) -> tuple[NDArrays, bool]:
    """The receiver's clip (the server's, or a cohort worker's after a client's recipe): never trust the sender's
    clip, clip to ``bound`` again; (the update within ``bound``, whether the sender had not clipped it to ``bound``).

    An update already within ``bound`` comes back as it is (its arrays, not copies: nothing to change, and the
    receiver only reads it); one beyond it as :func:`clip_update`'s clipped copy. ``norm`` is the update's
    :func:`global_l2_norm` when the caller has just measured it (:func:`measure_update`), so it is not measured
    twice; it must be that function's value for exactly these arrays.
    """
    arrays = _floating_arrays(update, "reclip")
    if norm is None:
        norm = global_l2_norm(arrays)
    if norm <= bound:  # False for NaN: clip_update below refuses a non-finite update
        return arrays, False
    clipped, norm = clip_update(arrays, bound)
    return clipped, norm > bound * (1 + RECLIP_TOLERANCE)


def clip_update(update: Sequence[np.ndarray], clip_norm: float) -> tuple[NDArrays, float]:
    """Clip to global L2 norm ``clip_norm`` (journal Eq. 10); returns (clipped copy, pre-clip norm).

    The norm is global over all tensors, never per tensor: per-tensor clipping (as in the released DP-FedSAM
    code) lets each of L tensors reach C, i.e. a sensitivity of C·√L instead of the accounted C.

    The input is not modified. An update with norm ≤ C is returned as an exact copy. For a clipped update the
    result satisfies ``global_l2_norm(result) <= clip_norm`` exactly, also in float32: scaling by α = C/‖Δ‖ and
    rounding each coordinate to float32 can overshoot C by up to a relative 2⁻²⁴, so the result is re-measured
    and, if needed, re-scaled with α shrunk by one epsilon at a time. The result keeps each tensor's dtype when
    the bound can be met in it; when it cannot (float16 coordinates scaled towards a tiny C land on subnormals,
    whose rounding error is absolute, not relative), the whole update is clipped in float64 instead.
    """
    arrays = _floating_arrays(update, "clip_update")
    norm = global_l2_norm(arrays)
    if not math.isfinite(norm):
        raise ValueError("cannot clip a non-finite update; reject it before clipping (SPEC §2)")
    alpha = clip_factor(norm, clip_norm)
    # Compare norms, not α == 1: for a norm one ulp above C, C/norm can round to exactly 1.0.
    if norm <= clip_norm:
        return [tensor.copy() for tensor in arrays], norm

    clipped = _scale_within(arrays, alpha, clip_norm)
    if clipped is None and any(tensor.dtype != np.float64 for tensor in arrays):
        clipped = _scale_within([tensor.astype(np.float64) for tensor in arrays], alpha, clip_norm)
    if clipped is None:
        raise FloatingPointError(f"could not clip update of norm {norm} below {clip_norm}, not even in float64")
    return clipped, norm


def _scale_within(arrays: Sequence[np.ndarray], alpha: float, clip_norm: float) -> NDArrays | None:
    """The tensors scaled by α (or slightly less) in their own dtypes with global norm ≤ ``clip_norm``, or None
    when the dtypes cannot meet the bound within a few shrinking steps."""
    # The shrink step is the coarsest epsilon among the dtypes present, so one step moves every dtype's rounded
    # factor down by at least one ulp.
    step = max((float(np.finfo(tensor.dtype).eps) for tensor in arrays), default=float(np.finfo(np.float64).eps))
    factor = alpha
    for _ in range(_MAX_CLIP_RETRIES):
        # Scaled in each tensor's own dtype (no float64 copy of the model) by the factor rounded down in that
        # dtype; the re-measurement below is what guarantees the bound.
        with np.errstate(under="ignore"):
            clipped = [tensor * _round_down(factor, tensor.dtype) for tensor in arrays]
        if global_l2_norm(clipped) <= clip_norm:
            return clipped
        factor *= 1.0 - step
    return None


# ------------------------------------------------------------------------------------------------------------
# Gaussian mechanism (journal Eq. 11)
# ------------------------------------------------------------------------------------------------------------


def gaussian_noise_std(
    noise_multiplier: float,
    clip_norm: float,
    expected_clients: float,
    placement: Placement,
) -> float:
    """Per-coordinate noise std for the given placement (journal Eq. 11; SPEC §2).

    - ``client``: each client adds N(0, σ²C²/m), std σC/√m. The sum of m independent draws has std σC·√m, so
      the average over the fixed denominator m has std σC/m.
    - ``server``: one draw of std σC/m added to the average.

    Both placements give the aggregate the same law N(0, σ²C²/m²), i.e. noise multiplier σ relative to the
    average's sensitivity C/m, which is what the accountant assumes.
    """
    if noise_multiplier < 0 or not math.isfinite(noise_multiplier):
        raise ValueError(f"noise_multiplier must be a non-negative finite number, got {noise_multiplier}")
    if clip_norm <= 0 or not math.isfinite(clip_norm):
        raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm}")
    if expected_clients <= 0 or not math.isfinite(expected_clients):
        raise ValueError(f"expected_clients must be a positive finite number, got {expected_clients}")
    if placement == "client":
        return noise_multiplier * clip_norm / math.sqrt(expected_clients)
    if placement == "server":
        return noise_multiplier * clip_norm / expected_clients
    raise ValueError(f"placement must be 'client' or 'server', got {placement!r}")


def add_gaussian_noise(update: Sequence[np.ndarray], std: float, rng: NormalSource) -> NDArrays:
    """Return a new update ``update + N(0, std² · I)``, each tensor keeping its dtype.

    Draws are taken tensor by tensor in list order from ``rng`` (so a fixed rng state gives fixed noise), in
    float64 and added before casting back, so float32 rounding does not bias the noise law. With ``std == 0``
    the result is a copy and ``rng`` is not advanced.
    """
    if std < 0 or not math.isfinite(std):
        raise ValueError(f"std must be a non-negative finite number, got {std}")
    arrays = [np.asarray(tensor) for tensor in update]
    if std == 0:
        return [tensor.copy() for tensor in arrays]
    # Added in float64 (the ufunc widens the tensor exactly) and rounded to the tensor's dtype as each value is
    # written: the values of (tensor.astype(float64) + noise).astype(dtype), with no float64 copy of the tensor.
    return [
        np.add(
            tensor,
            rng.normal(0.0, std, size=tensor.shape),
            out=np.empty(tensor.shape, tensor.dtype),
            dtype=np.float64,
            casting="unsafe",
        )
        for tensor in arrays
    ]


def joint_noise_multiplier(noise_multiplier: float, statistics_noise_multiplier: float) -> float:
    """σ_joint = (σ⁻² + σ_s⁻²)^(−1/2): the noise multiplier of a round that releases the noised update sum
    (sensitivity C, noise σC) *and* a noised count (sensitivity 1, noise σ_s) of the same sampled clients.

    Scaling each part by its noise std, one client moves the pair by at most √(σ⁻² + σ_s⁻²) against unit noise:
    one Gaussian mechanism, subsampled once, with this multiplier (Andrew et al., NeurIPS 2021, Thm. 1).
    """
    if not (noise_multiplier > 0 and statistics_noise_multiplier > 0):
        raise ValueError("both noise multipliers must be > 0 for a joint release")
    return (noise_multiplier**-2 + statistics_noise_multiplier**-2) ** -0.5


def update_noise_for_joint(joint_noise_multiplier: float, statistics_noise_multiplier: float) -> float:
    """The update's σ such that :func:`joint_noise_multiplier` (σ, σ_s) equals ``joint_noise_multiplier``."""
    remainder = joint_noise_multiplier**-2 - statistics_noise_multiplier**-2
    if remainder <= 0:
        raise ValueError(
            f"sigma_s={statistics_noise_multiplier:.4g} is too small: the noisy statistics alone would spend more "
            f"than a joint noise multiplier of {joint_noise_multiplier:.4g} allows"
        )
    return remainder**-0.5


def noisy_count(count: float, std: float, rng: NormalSource) -> float:
    """count + N(0, std²): a count of clients (sensitivity 1) released through the Gaussian mechanism."""
    return float(count) + float(rng.normal(0.0, std, (1,))[0])


def client_noise_topup_std(
    noise_multiplier: float, clip_norm: float, expected_clients: float, contributing: int
) -> float:
    """Std the server adds to the average so client-placed noise is never below the accounted level (SPEC §2).

    In client placement each of the n contributing clients adds N(0, σ²C²/m); over the fixed denominator m the
    average carries variance n σ²C²/m³. When n < m (a client failed or was rejected) the server adds the missing
    (m − n) σ²C²/m³, so the aggregate is N(0, σ²C²/m²) whoever dropped out — the law the accountant assumes.
    Client placement is only used with fixed-size sampling, where n <= m.
    """
    per_average = gaussian_noise_std(noise_multiplier, clip_norm, expected_clients, "server")
    missing = max(0.0, expected_clients - contributing)
    return per_average * math.sqrt(missing / expected_clients)


class NormalSource(Protocol):
    """What :func:`add_gaussian_noise` needs of a random source (``np.random.Generator`` has it)."""

    def normal(self, loc: float, scale: float, size: tuple[int, ...]) -> np.ndarray: ...


class SecureRandom:
    """Draws from the operating system's CSPRNG (``os.urandom``), for deployment (SPEC §2): the noise, and who
    and what participates (client sampling, Fed-SMP masks), so nothing about them can be re-derived from a seed.

    Uniforms are 53-bit fractions of urandom words; normals come from the Box–Muller transform in float64;
    ``choice`` without replacement takes the first ``size`` indices of a permutation sorted by 64-bit urandom keys
    (a uniform random subset up to key ties, probability < n²/2⁶⁵). Not reproducible by design.
    """

    def random(self, size: int) -> np.ndarray:
        """``size`` uniforms in [0, 1) (``np.random.Generator.random``'s range)."""
        words = np.frombuffer(os.urandom(8 * int(size)), dtype=np.uint64)
        return (words >> np.uint64(11)).astype(np.float64) * (1.0 / 2.0**53)

    def integers(self, high: int) -> int:
        """One integer uniform in [0, high)."""
        return secrets.randbelow(int(high))

    def choice(self, a: int, size: int, replace: bool = True) -> np.ndarray:
        """``size`` distinct indices of ``range(a)``, uniformly at random (only ``replace=False`` is offered)."""
        if replace:
            raise ValueError("SecureRandom.choice draws without replacement only (replace=False)")
        if not 0 <= size <= a:
            raise ValueError(f"cannot choose {size} of {a} without replacement")
        keys = np.frombuffer(os.urandom(8 * int(a)), dtype=np.uint64)
        return np.argsort(keys, kind="stable")[: int(size)].astype(np.int64)

    def _uniform(self, count: int) -> np.ndarray:
        words = np.frombuffer(os.urandom(8 * count), dtype=np.uint64)
        return ((words >> np.uint64(11)).astype(np.float64) + 1.0) * (1.0 / 2.0**53)

    def normal(self, loc: float, scale: float, size: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(size, dtype=np.int64))
        half = (count + 1) // 2
        radius = np.sqrt(-2.0 * np.log(self._uniform(half)))
        angle = 2.0 * np.pi * self._uniform(half)
        z = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:count]
        return loc + scale * z.reshape(size)


def secure_rng() -> SecureRandom:
    """A noise source backed by the OS CSPRNG (``secure_noise: true``)."""
    return SecureRandom()


#: A source of every draw this module makes: a seeded ``np.random.Generator`` or the OS CSPRNG.
RandomSource = np.random.Generator | SecureRandom


def random_source(secure: bool, seed: int | None, *keys: int, noise_key: int | None = None) -> RandomSource:
    """THE place that decides where a draw comes from: the OS CSPRNG when ``secure`` (deployment: noise, client
    sampling, masks, clients' shuffles), else the seeded stream :func:`make_rng` of (seed, *keys) (simulation:
    reproducible, and private only while the seed stays secret).

    ``noise_key`` is passed by noise draws only: the run's key under ``privacy.noise_stream=per_run``
    (:func:`fl_app.config.noise_stream_key`), appended to the keys so that runs with different configs draw
    independent noise; None (``shared``) leaves the stream the one every run of the seed draws.
    """
    if secure:
        return secure_rng()
    if seed is None:
        raise ValueError("a seeded random stream needs a seed (secure randomness sends none)")
    return make_rng(seed, *keys) if noise_key is None else make_rng(seed, *keys, noise_key)


def make_rng(seed: int, *keys: int) -> np.random.Generator:
    """Deterministic, independent stream for (seed, *keys), e.g. (seed, round, client_id, purpose).

    ``SeedSequence`` hashes the whole key tuple, so streams for different keys are statistically independent
    and no global RNG is ever touched (SPEC §1, §2). Simulation only: deployment noise must come from a
    cryptographically secure source instead.
    """
    entropy = [seed, *keys]
    for value in entropy:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"seed and keys must be non-negative integers, got {entropy}")
    return np.random.default_rng(np.random.SeedSequence([int(value) for value in entropy]))


# ------------------------------------------------------------------------------------------------------------
# Validation and aggregation (SPEC §2)
# ------------------------------------------------------------------------------------------------------------


def is_finite_update(update: Sequence[np.ndarray]) -> bool:
    """True if no tensor contains NaN or ±Inf (such updates are rejected before aggregation, SPEC §2)."""
    return all(bool(np.isfinite(np.asarray(tensor)).all()) for tensor in update)


def has_shapes(update: Sequence[np.ndarray], reference_shapes: Sequence[tuple[int, ...]]) -> bool:
    """True if the update has exactly one tensor per reference shape, each of that shape."""
    if len(update) != len(reference_shapes):
        return False
    return all(tuple(np.shape(tensor)) == tuple(shape) for tensor, shape in zip(update, reference_shapes, strict=True))


def measure_update(
    update: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]]
) -> tuple[Literal["shape", "nonfinite"] | None, float]:
    """The screening of an update from a client (SPEC §2): why it must be rejected before aggregation, or None if
    it may be used — ``shape`` (wrong tensor count, shapes or a non-floating dtype) or ``nonfinite`` (NaN/Inf
    anywhere, or a global norm that overflows) — and the :func:`global_l2_norm` it measured (NaN when it did not get
    that far), for a receiver that re-clips next (:func:`reclip`'s ``norm``)."""
    if not has_shapes(update, shapes) or not all(np.issubdtype(np.asarray(u).dtype, np.floating) for u in update):
        return "shape", math.nan
    # One pass decides: the norm is a sum of squares, so a NaN anywhere makes it NaN and an infinity infinite (no
    # inf - inf can arise). Finite values can still overflow it (float64 coordinates of 1e200): such an update
    # cannot be clipped, so it is rejected like a NaN.
    with np.errstate(over="ignore", invalid="ignore"):
        norm = global_l2_norm(update)
    if not math.isfinite(norm):
        return "nonfinite", norm
    return None, norm


def uniform_sum(updates: Sequence[Sequence[np.ndarray]], shapes: Sequence[tuple[int, ...]]) -> NDArrays:
    """Σ_i Δ_i in float64, in the given order (zeros of ``shapes`` for no updates); see :func:`uniform_average`."""
    totals = [np.zeros(tuple(shape), dtype=np.float64) for shape in shapes]
    for index, update in enumerate(updates):
        if not has_shapes(update, shapes):
            raise ValueError(f"update {index} does not match the model's tensor shapes")
        add_to_sum(totals, update)
    return totals


def add_to_sum(totals: Sequence[np.ndarray], update: Sequence[np.ndarray]) -> None:
    """``totals += update`` in place, tensor by tensor: one step of :func:`uniform_sum` (float64 ``totals``), for a
    caller that adds updates one at a time instead of holding them all."""
    if not has_shapes(update, [np.shape(total) for total in totals]):
        raise ValueError("the update does not match the sum's tensor shapes")
    for total, tensor in zip(totals, update, strict=True):
        # The ufunc widens each coordinate to float64 as it adds (exactly, for every float dtype): the same sums as
        # adding a float64 copy, without making one per tensor.
        np.add(total, np.asarray(tensor), out=total)


def uniform_average(
    updates: Sequence[Sequence[np.ndarray]],
    denominator: float,
    shapes: Sequence[tuple[int, ...]],
) -> NDArrays:
    """Σ_i Δ_i / denominator with uniform weights (SPEC §2), returned as float32.

    The denominator is the fixed m = qM, not the number of updates received: then one client moves the average
    by at most C/m whatever the others do, which is the sensitivity the accountant assumes. Sample-count
    weights would break that bound. Summation runs in float64 in the given order, so the result is
    deterministic and does not depend on float32 accumulation error. No updates gives zeros of the given
    shapes.
    """
    if denominator <= 0 or not math.isfinite(denominator):
        raise ValueError(f"denominator must be a positive finite number, got {denominator}")
    # Divided in float64 and rounded to float32 as each value is written (the ufunc's output cast): the values of
    # (total / m).astype(float32), without a float64 quotient of the whole model in between.
    return [
        np.divide(total, denominator, out=np.empty(total.shape, np.float32), casting="unsafe")
        for total in uniform_sum(updates, shapes)
    ]


# ------------------------------------------------------------------------------------------------------------
# Client sampling (SPEC §1)
# ------------------------------------------------------------------------------------------------------------


def poisson_sample(population: int, sample_rate: float, rng: RandomSource) -> np.ndarray:
    """Sorted indices of clients that join: each of ``population`` independently with probability q (SPEC §1).

    This is the sampling that the Poisson-subsampled Gaussian accountants (Opacus RDP/PRV, dp_accounting
    ``PoissonSampledDpEvent``) assume; the round may have any number of participants, including none.
    """
    _check_population(population)
    if not 0.0 <= sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in [0, 1], got {sample_rate}")
    return np.flatnonzero(rng.random(population) < sample_rate).astype(np.int64)


def fixed_size_sample(population: int, sample_size: int, rng: RandomSource) -> np.ndarray:
    """Exactly ``sample_size`` distinct indices, uniformly without replacement, sorted (papers' Algorithm 1).

    Must be accounted with the sampling-without-replacement event (replace-one adjacency), never with the
    Poisson formula (SPEC §1).
    """
    _check_population(population)
    if not 0 <= sample_size <= population:
        raise ValueError(f"sample_size must be in [0, {population}], got {sample_size}")
    return np.sort(rng.choice(population, size=sample_size, replace=False)).astype(np.int64)


def expected_clients(population: int, sample_rate: float) -> float:
    """The fixed denominator m = qM, kept as a float.

    Not rounded: the accountant's analysis is for the sampled Gaussian with sensitivity C/m and noise std σC/m
    on the average for exactly this m = qM; rounding m would change both the sensitivity and the noise and
    make them disagree with what is accounted.
    """
    _check_population(population)
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
    return float(sample_rate) * float(population)


def _check_population(population: int) -> None:
    if isinstance(population, bool) or not isinstance(population, (int, np.integer)) or population < 0:
        raise ValueError(f"population must be a non-negative integer, got {population}")


# ------------------------------------------------------------------------------------------------------------
# Clipping diagnostics (SPEC §2, journal Eq. 18 / Fig. 4)
# ------------------------------------------------------------------------------------------------------------


CLIPPING_STATS_KEYS = (
    "norm_mean",
    "norm_median",
    "norm_max",
    "norm_q25",
    "norm_q75",
    "alpha_mean",
    "alpha_dispersion",
    "fraction_clipped",
)


def clipping_stats(norms: Sequence[float], clip_norm: float) -> dict[str, float]:
    """Summary of the pre-clip norms ‖Δ_i‖ of one round.

    Keys: ``norm_mean``, ``norm_median``, ``norm_max``, ``norm_q25``, ``norm_q75`` (linear-interpolation
    quantiles), ``alpha_mean`` ᾱ = mean α_i with α_i = min(1, C/‖Δ_i‖), ``alpha_dispersion``
    α̃ = mean |α_i − ᾱ| (journal Eq. 18), ``fraction_clipped`` (share with ‖Δ_i‖ > C).

    With no norms every value is NaN: "no clients" is not "nothing was clipped", and NaN keeps a missing round
    from being averaged into plots as a real zero.
    """
    values = np.asarray(norms, dtype=np.float64)
    if values.size == 0:
        return dict.fromkeys(CLIPPING_STATS_KEYS, float("nan"))
    alphas = np.array([clip_factor(float(norm), clip_norm) for norm in values])
    alpha_mean = float(alphas.mean())
    q25, median, q75 = np.quantile(values, [0.25, 0.5, 0.75])
    return {
        "norm_mean": float(values.mean()),
        "norm_median": float(median),
        "norm_max": float(values.max()),
        "norm_q25": float(q25),
        "norm_q75": float(q75),
        "alpha_mean": alpha_mean,
        "alpha_dispersion": float(np.abs(alphas - alpha_mean).mean()),
        "fraction_clipped": float((values > clip_norm).mean()),
    }


# ------------------------------------------------------------------------------------------------------------
# Sparsification masks (journal Eq. 12; SPEC §5; SPEC_BASELINES.md)
# ------------------------------------------------------------------------------------------------------------


def kept_count(size: int, fraction: float) -> int:
    """k_l = ⌈p · d_l⌉, the number of coordinates a layer of ``size`` keeps (SPEC §5).

    A product within a relative 1e-9 of an integer counts as that integer, so that e.g. p = 0.7, d = 10
    keeps 7 and not 8 because 0.7 · 10 evaluates to 7.000000000000001 in binary floating point.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if size < 0:
        raise ValueError(f"size must be non-negative, got {size}")
    product = fraction * size
    nearest = round(product)
    k = nearest if abs(product - nearest) <= 1e-9 * max(1.0, product) else math.ceil(product)
    return int(min(max(k, 0), size))


def topk_mask(update: Sequence[np.ndarray], fraction: float) -> list[np.ndarray]:
    """Per-layer boolean masks keeping exactly k_l = ⌈p · d_l⌉ largest-magnitude coordinates (journal Eq. 12).

    Ties at the threshold magnitude are broken towards the lower flat index, so the mask is a deterministic
    function of the values. Selection is O(d) via a partition, not a full sort, because ResNet layers are
    large. For DP-FedSAM-topk it must be computed from the *noisy* update to be post-processing (SPEC §5).
    """
    masks = []
    for tensor in update:
        values = np.asarray(tensor)
        if not np.isfinite(values).all():
            raise ValueError("topk_mask needs a finite update")
        magnitude = np.abs(values).ravel()
        size = magnitude.size
        k = kept_count(size, fraction)
        mask = np.zeros(size, dtype=bool)
        if k == size:
            mask[:] = True
        elif k > 0:
            threshold = np.partition(magnitude, size - k)[size - k]
            mask = magnitude > threshold
            missing = k - int(mask.sum())
            mask[np.flatnonzero(magnitude == threshold)[:missing]] = True
        masks.append(mask.reshape(values.shape))
    return masks


def randk_mask(shapes: Sequence[tuple[int, ...]], fraction: float, rng: RandomSource) -> list[np.ndarray]:
    """Per-layer boolean masks keeping exactly k_l = ⌈p · d_l⌉ coordinates, uniformly without replacement.

    Data-independent (drawn from the server's round RNG in Fed-SMP-randk, SPEC_BASELINES.md), so the mask is
    public and costs no privacy. Layers are drawn in list order from ``rng``.
    """
    masks = []
    for shape in shapes:
        size = math.prod(shape)
        k = kept_count(size, fraction)
        mask = np.zeros(size, dtype=bool)
        mask[rng.choice(size, size=k, replace=False)] = True
        masks.append(mask.reshape(tuple(shape)))
    return masks


def apply_mask(update: Sequence[np.ndarray], mask: Sequence[np.ndarray]) -> NDArrays:
    """Δ ⊙ mask: a new update with the unmasked coordinates set to zero, dtypes preserved."""
    if len(update) != len(mask):
        raise ValueError(f"update has {len(update)} tensors but mask has {len(mask)}")
    result = []
    for tensor, keep in zip(update, mask, strict=True):
        values = np.asarray(tensor)
        keep = np.asarray(keep, dtype=bool)
        if values.shape != keep.shape:
            raise ValueError(f"mask shape {keep.shape} does not match tensor shape {values.shape}")
        result.append(np.where(keep, values, np.zeros((), dtype=values.dtype)))
    return result
