"""The physical-limit reference: DP-FedAvg / DP-FedSAM as one plain PyTorch loop, no Flower, no Ray.

For a validated :class:`~fl_app.config.AppConfig` and its seed, round t = 1..T does exactly what the app does
(strategies/base.py steps 2–6, clients/training.py; docs/mechanisms.md, docs/algorithms.md), in one process:

* sample the clients from the stream ``(seed, t, SAMPLING)`` (Poisson(q) or fixed-size m = qM),
* for each sampled partition, in partition order: load the global weights, run E local epochs of SGD (momentum,
  weight decay, η_t = η·decay^(t−1)) or SAM (ρ‖g‖-normalised ascent, descent from the unperturbed weights) over
  mini-batches shuffled by the stream ``(seed, t, CLIENT_SHUFFLE, partition)``, and clip Δ to C,
* average with the fixed denominator m, add N(0, σ²C²/m²) from ``(seed, t, SERVER_NOISE)``, w ← w + η_g·avg.

The local loop is written out here with ``torch.optim.SGD`` (not imported from clients/), so agreement with
the app is a real cross-check of the Flower plumbing, the sampling and the training order. The mechanism math
(clip, noise std, the noise draw, the fixed-denominator average) is the app's own single implementation in
:mod:`fl_app.privacy.mechanisms`: those are pure NumPy functions with no framework in them.

Covers the dense, server-placement recipes: ``dp_fedavg``, ``dp_fedsam``, ``fedavg``, ``fedsam`` (for the
non-private two the mean is over the updates, unclipped and noiseless), with plain SAM or ASAM
(``client.adaptive``), and fixed or adaptive clipping (``privacy.clipping``; the bench's parallel and batched loops
cover fixed clipping only).

Threads: the loop runs torch on ``--threads`` threads and pins the native libraries' pools to match
(:func:`fl_app.threads.limit_library_threads`: OpenMP to the torch thread count, NumPy's BLAS to 1). Without that,
NumPy's multithreaded OpenBLAS — used by the float64 norm of every clip — leaves spinning threads that steal
cores from torch, and the reference would be handicapped (1.6× slower on 2 cores). The app's processes pin the
same way.

The round's pieces (:func:`sampled_partitions`, :func:`client_data`, :func:`shuffle_generator`,
:func:`local_train`, :func:`server_step`) are shared with bench/parallel.py and bench/batched.py, so the three
references agree on sampling, data, shuffles, noise and the server step by construction.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fl_app.allocator import keep_freed_memory
from fl_app.config import AppConfig, compose_config
from fl_app.data.datasets import TensorData, load_dataset
from fl_app.data.partition import get_partition
from fl_app.instructions import STREAM_ADAPTIVE_CLIP, STREAM_CLIENT_SHUFFLE, STREAM_SAMPLING, STREAM_SERVER_NOISE
from fl_app.models import build_model_for_dataset, get_weights, set_weights, to_compute_layout
from fl_app.privacy import adaptive_clipping as adaptive
from fl_app.privacy import mechanisms as mech
from fl_app.threads import library_thread_counts, limit_library_threads

#: strategy name → (local optimizer, private)
SUPPORTED = {"dp_fedavg": ("sgd", True), "dp_fedsam": ("sam", True), "fedavg": ("sgd", False), "fedsam": ("sam", False)}


@dataclass
class BaselineResult:
    weights: list[np.ndarray]
    round_seconds: list[float] = field(default_factory=list)
    clients_per_round: list[int] = field(default_factory=list)


def local_train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    config: AppConfig,
    server_round: int,
    use_sam: bool,
    generator: torch.Generator,
) -> None:
    """E local epochs of SGD or SAM/ASAM on (x, y), in place on ``model`` (docs/algorithms.md, written out here)."""
    c = config.client
    params = list(model.parameters())
    optimizer = torch.optim.SGD(
        params, lr=c.lr * c.lr_decay ** (server_round - 1), momentum=c.momentum, weight_decay=c.weight_decay
    )
    n = int(x.shape[0])
    model.train()
    for _ in range(c.local_epochs):
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n, c.batch_size):
            idx = perm[start : start + c.batch_size]
            xb, yb = x[idx], y[idx]
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), yb).backward()
            if use_sam:
                with torch.no_grad():
                    # ASAM (Kwon et al.): e = ρ·w²⊙g / ‖|w|⊙g‖; SAM: e = ρ·g / ‖g‖ (global norms).
                    if c.adaptive:
                        norms = [torch.linalg.vector_norm(p.abs() * p.grad) for p in params]
                    else:
                        norms = [torch.linalg.vector_norm(p.grad) for p in params]
                    grad_norm = torch.linalg.vector_norm(torch.stack(norms))
                    scale = c.rho / (grad_norm + 1e-12)
                    unperturbed = [p.detach().clone() for p in params]
                    for p in params:
                        if c.adaptive:
                            p.add_((p.grad * scale).mul_(p.square()))
                        else:
                            p.add_(p.grad * scale)
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(model(xb), yb).backward()
                with torch.no_grad():
                    for p, w in zip(params, unperturbed, strict=True):
                        p.copy_(w)
            optimizer.step()


def check_supported(config: AppConfig, adaptive_clipping: bool = False) -> tuple[bool, bool]:
    """(uses SAM, private) for ``config``'s strategy; ValueError for what the reference loops do not cover
    (adaptive clipping: this loop only, ``adaptive_clipping=True``)."""
    name = config.strategy.name
    if name not in SUPPORTED:
        raise ValueError(f"the baseline loop covers {sorted(SUPPORTED)}, not {name!r}")
    if config.privacy.placement != "server" or config.privacy.target_epsilon is not None:
        raise ValueError("the baseline loop covers privacy.placement=server with a given noise_multiplier")
    if config.privacy.clipping == "adaptive" and not adaptive_clipping:
        raise ValueError("this reference loop covers privacy.clipping=fixed (bench/baseline.py covers adaptive)")
    optimizer_kind, private = SUPPORTED[name]
    return optimizer_kind == "sam", private


def denominator(config: AppConfig) -> float:
    """The fixed denominator m = qM of the private average (rounded for fixed-size sampling, as the app)."""
    d, p = config.dataset, config.privacy
    m = mech.expected_clients(d.num_clients, p.sample_rate)
    return float(round(m)) if p.sampling == "fixed" else m


def sampled_partitions(config: AppConfig, server_round: int) -> list[int]:
    """Round t's sampled partitions, sorted, from the stream ``(seed, t, SAMPLING)``."""
    d, p = config.dataset, config.privacy
    rng = mech.make_rng(config.seed, server_round, STREAM_SAMPLING)
    if p.sampling == "fixed":
        sampled = mech.fixed_size_sample(d.num_clients, int(denominator(config)), rng)
    else:
        sampled = mech.poisson_sample(d.num_clients, p.sample_rate, rng)
    return sorted(int(pid) for pid in sampled.tolist())


def partition_indices(config: AppConfig, pid: int) -> np.ndarray:
    """Training-set indices of partition ``pid`` (cached per process by fl_app.data.partition)."""
    d = config.dataset
    return get_partition(
        d.name, d.data_dir, d.partition, d.num_clients, d.alpha, config.seed, pid,
        num_samples=d.max_train_samples or None,
    )  # fmt: skip


def client_data(train: TensorData, config: AppConfig, pid: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of partition ``pid`` on ``device``."""
    idx = torch.from_numpy(partition_indices(config, pid).copy())
    return train.x[idx].to(device), train.y[idx].to(device=device, dtype=torch.long)


def local_steps(num_samples: int, config: AppConfig) -> int:
    """K = E·⌈n/B⌉ local steps of a client with n samples (0 for an empty client)."""
    return config.client.local_epochs * math.ceil(num_samples / config.client.batch_size)


def shuffle_generator(config: AppConfig, server_round: int, pid: int) -> torch.Generator:
    """The CPU generator of client ``pid``'s mini-batch shuffles in round t: stream ``(seed, t, SHUFFLE, pid)``."""
    shuffle_seed = int(mech.make_rng(config.seed, server_round, STREAM_CLIENT_SHUFFLE, pid).integers(2**62))
    return torch.Generator().manual_seed(shuffle_seed)


def server_step(
    config: AppConfig,
    weights: list[np.ndarray],
    average: list[np.ndarray],
    server_round: int,
    private: bool,
    clip: AdaptiveClip | None = None,
) -> list[np.ndarray]:
    """Add N(0, σ²C²/m²) from ``(seed, t, SERVER_NOISE)`` to the average (if private), then w ← w + η_g·avg.
    With adaptive clipping σ and C are ``clip``'s: the update's σ_Δ and the round's C_t."""
    p = config.privacy
    if private:
        sigma, clip_norm = (p.noise_multiplier, p.clip_norm) if clip is None else (clip.sigma, clip.clip_norm)
        std = mech.gaussian_noise_std(sigma, clip_norm, denominator(config), "server")
        average = mech.add_gaussian_noise(average, std, mech.make_rng(config.seed, server_round, STREAM_SERVER_NOISE))
    eta = config.strategy.server_lr
    return [
        (w.astype(np.float64) + eta * a.astype(np.float64)).astype(w.dtype)
        for w, a in zip(weights, average, strict=True)
    ]


@dataclass
class AdaptiveClip:
    """Adaptive clipping in the loop (Andrew et al. 2021), with the app's pure functions: C_t, σ_Δ, σ_b."""

    clip_norm: float
    sigma: float
    count_stddev: float

    @classmethod
    def of(cls, config: AppConfig) -> AdaptiveClip:
        p = config.privacy
        count_stddev = p.clipped_count_stddev or adaptive.default_clipped_count_stddev(denominator(config))
        return cls(p.clip_norm, adaptive.update_share_of_joint(p.noise_multiplier, count_stddev), count_stddev)

    def step(self, config: AppConfig, norms: list[float], server_round: int) -> None:
        """Release the round's noisy clipped fraction from ``(seed, t, ADAPTIVE_CLIP)`` and move C."""
        p = config.privacy
        rng = mech.make_rng(config.seed, server_round, STREAM_ADAPTIVE_CLIP)
        bits = adaptive.clipped_bits(norms, self.clip_norm)
        fraction = adaptive.noisy_clipped_fraction(bits, denominator(config), self.count_stddev, rng)
        self.clip_norm = adaptive.next_clip_norm(self.clip_norm, fraction, p.target_quantile, p.clip_learning_rate)


def run_baseline(
    config: AppConfig,
    num_rounds: int | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> BaselineResult:
    """Train ``config`` for ``num_rounds`` (default ``config.num_rounds``) rounds; returns the global model.
    ``dtype``: the model's and the data's (float64 lets tests compare implementations beyond float32 rounding).

    Pins the native libraries' thread pools to torch's current thread count first (see the module docstring).
    """
    use_sam, private = check_supported(config, adaptive_clipping=True)
    limit_library_threads(torch.get_num_threads())
    keep_freed_memory()  # as the app's workers run (fl_app/allocator.py)
    d, p = config.dataset, config.privacy
    clip = AdaptiveClip.of(config) if private and p.clipping == "adaptive" else None
    train, _ = load_dataset(d.name, d.data_dir, download=d.download)
    model = build_model_for_dataset(config.model.name, d.name, seed=config.seed).to(dtype=dtype)
    model = to_compute_layout(model, torch.device(device))  # the app's layout, so the two agree bit for bit
    weights = get_weights(model, dtype)
    shapes = [w.shape for w in weights]
    m = denominator(config)
    result = BaselineResult(weights=weights)
    for t in range(1, (config.num_rounds if num_rounds is None else num_rounds) + 1):
        t0 = time.perf_counter()
        updates, norms = [], []
        clip_norm = p.clip_norm if clip is None else clip.clip_norm
        for pid in sampled_partitions(config, t):
            x, y = client_data(train, config, pid, device)
            if len(y) == 0:
                updates.append([np.zeros(s, dtype=w.dtype) for s, w in zip(shapes, weights, strict=True)])
                norms.append(0.0)
                continue
            set_weights(model, weights)
            local_train(model, x.to(dtype), y, config, t, use_sam, shuffle_generator(config, t, pid))
            update = [new - old for new, old in zip(get_weights(model, dtype), weights, strict=True)]
            clipped, norm = mech.clip_update(update, clip_norm)
            updates.append(clipped if private else update)
            norms.append(norm)
        if private:
            average = mech.uniform_average(updates, m, shapes)
        else:
            average = mech.uniform_average(updates, max(len(updates), 1), shapes)
        weights = server_step(config, weights, average, t, private, clip)
        if clip is not None:
            clip.step(config, norms, t)
        result.round_seconds.append(time.perf_counter() - t0)
        result.clients_per_round.append(len(updates))
    result.weights = weights
    return result


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.baseline [hydra overrides] --threads N --device cpu|cuda --out result.json``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of conf/config.yaml, as for apps.main")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, required=True, help="JSON result; the model goes next to it (.npz)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    limit_library_threads(torch.get_num_threads())
    result = run_baseline(compose_config(args.overrides), device=args.device)
    weights_file = args.out.with_suffix(".npz")
    np.savez(weights_file, *result.weights)
    summary = {
        "round_seconds": result.round_seconds,
        "clients_per_round": result.clients_per_round,
        "threads": torch.get_num_threads(),
        "library_threads": library_thread_counts(),
        "device": args.device,
        "weights_file": str(weights_file),
    }
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
