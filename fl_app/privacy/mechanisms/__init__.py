"""Client-level DP mechanisms: the only place in the project where mechanism math is written.

Implements, for DP-FedAvg (McMahan et al. 2018) and DP-FedSAM (Shi et al., CVPR'23; journal version with
DP-FedSAM-topk), as docs/mechanisms.md states them (numbers below are its items):

- client sampling (1): Poisson sampling with rate q and the *fixed* denominator m = qM, or fixed-size
  sampling of exactly m clients without replacement;
- global-norm clipping Δ̃ = Δ · min(1, C/‖Δ‖) (journal Eq. 10; 2);
- Gaussian noise N(0, σ²C²/m · I) per client or N(0, σ²C²/m² · I) on the average (journal Eq. 11; 4);
- the uniform average over the fixed denominator m (3);
- clipping diagnostics ᾱ and α̃ = mean |α_i − ᾱ| (journal Eq. 18);
- per-layer top-k masks (journal Eq. 12) and rand-k masks (Fed-SMP-randk; both in docs/algorithms.md),
  both keeping exactly k_l = ⌈p · d_l⌉ coordinates of layer l.

An update is ``NDArrays`` (one array per model tensor, normally float32). Every random draw takes an explicit
random source; nothing here reads or reseeds global RNG state. Which source — a seeded stream of (seed, round,
purpose[, client]) or the operating system's CSPRNG — is decided in one place, :func:`random_source`.

One idea a module: ``norms`` (an update and its global L2 norm), ``clipping`` (Eq. 10), ``diagnostics`` (Eq. 18),
``noise`` (Eq. 11), ``randomness`` (the random sources), ``sampling``, ``aggregation`` (screening, the uniform sum
and average), ``masks``. Callers import the names from here (``from fl_app.privacy import mechanisms as mech``). A
test that patches a name here reaches every caller outside the package; the package's own calls (``reclip`` →
``clip_update``, ``client_noise_topup_std`` → ``gaussian_noise_std``, …) read the name in its submodule.
"""

from fl_app.privacy.mechanisms.aggregation import (
    add_to_sum,
    has_shapes,
    is_finite_update,
    measure_update,
    uniform_average,
    uniform_sum,
)
from fl_app.privacy.mechanisms.clipping import RECLIP_TOLERANCE, clip_factor, clip_update, reclip
from fl_app.privacy.mechanisms.diagnostics import CLIPPING_STATS_KEYS, clipping_stats
from fl_app.privacy.mechanisms.masks import apply_mask, kept_count, randk_mask, topk_mask
from fl_app.privacy.mechanisms.noise import (
    add_gaussian_noise,
    add_in_float64,
    client_noise_topup_std,
    gaussian_noise_std,
    joint_noise_multiplier,
    noisy_count,
    update_noise_for_joint,
)
from fl_app.privacy.mechanisms.norms import NDArrays, global_l2_norm
from fl_app.privacy.mechanisms.randomness import (
    NormalSource,
    RandomSource,
    SecureRandom,
    make_rng,
    random_source,
    secure_rng,
)
from fl_app.privacy.mechanisms.sampling import expected_clients, fixed_size_sample, poisson_sample

__all__ = [
    "CLIPPING_STATS_KEYS",
    "RECLIP_TOLERANCE",
    "NDArrays",
    "NormalSource",
    "RandomSource",
    "SecureRandom",
    "add_gaussian_noise",
    "add_in_float64",
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
