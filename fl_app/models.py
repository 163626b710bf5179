"""Models and flat weight exchange (docs/running.md, "Data and models").

- :class:`CNN`: the paper CNN for 28×28 grey images — conv5×5 (in→32), ReLU, maxpool 2, conv5×5 (32→64),
  ReLU, maxpool 2, FC→512, ReLU, FC→classes. Padding 2 keeps 28→28→14→14→7, so the first FC is 64·7·7→512;
  this is ``CNN_OriginalFedAvg`` of the released DP-FedSAM/FedML code (the CNN of McMahan et al.'s FedAvg
  paper, 1,663,370 parameters for 10 classes). The released ``cnn_emnist`` variant uses no padding and a
  1600-wide FC, which only fits the 32×32 random crops that code applies to EMNIST; we do not replicate it.
- :func:`resnet18_gn`: torchvision ResNet-18 in its CIFAR form (3×3 stride-1 stem, no max-pool) with
  GroupNorm instead of BatchNorm. GroupNorm has no running statistics, so SAM's perturbed forward pass and
  client-level DP (every exchanged tensor is clipped and noised) have no hidden state to worry about.

Weight exchange (:func:`get_weights` / :func:`set_weights`) covers the **floating-point entries of the
state_dict, in state_dict order**: all parameters plus float buffers (e.g. BatchNorm running mean/var, which
are data-dependent and must therefore be inside the clipped, noised update). Integer buffers such as
BatchNorm's ``num_batches_tracked`` are left out: they are not weights, cannot be averaged or noised
meaningfully, and would reveal the client's number of local steps (hence its data size). The default models
(GroupNorm) have no buffers at all, so there the list is exactly the parameters.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fl_app.core.choices import MODEL_NAMES

__all__ = [
    "CNN",
    "MODELS",
    "build_model",
    "build_model_for_dataset",
    "check_vectorizable",
    "get_weights",
    "memory_format_for",
    "resnet18_gn",
    "set_weights",
    "to_compute_layout",
    "weight_names",
    "weight_shapes",
]


class CNN(nn.Module):
    """Paper CNN (module docstring), ``CNN_OriginalFedAvg`` layout; expects ``N×in_channels×image_size×image_size``."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> None:
        super().__init__()
        if image_size % 4:
            raise ValueError(f"image_size must be divisible by 4 (two 2×2 max-pools), got {image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        side = image_size // 4
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * side * side, 512),
            nn.ReLU(inplace=True),
            nn.Linear(512, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def resnet18_gn(num_classes: int, in_channels: int = 3, groups: int = 2, image_size: int = 32) -> nn.Module:
    """ResNet-18, CIFAR variant (3×3 stride-1 stem conv, no max-pool), GroupNorm with ``groups`` groups.

    Every normalised width in ResNet-18 (64…512) is divisible by the default 2 groups. ``image_size`` is accepted
    for a uniform model signature; global average pooling makes the network size-agnostic.
    """
    from torchvision.models import resnet18  # imported here: torchvision costs ~2 s of every process's startup

    model = resnet18(weights=None, num_classes=num_classes, norm_layer=lambda c: nn.GroupNorm(groups, c))
    # The ImageNet stem (7×7 stride 2 + max-pool) would shrink 32×32 inputs to 8×8 before the first block.
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    # Same init torchvision gives every other conv, so the replaced stem is not the odd one out.
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()
    return model


MODELS: dict[str, Callable[..., nn.Module]] = {"cnn": CNN, "resnet18": resnet18_gn}
if tuple(MODELS) != MODEL_NAMES:
    raise ImportError(f"fl_app/core/choices.py::MODEL_NAMES {MODEL_NAMES} are not the builders of MODELS")


def build_model(name: str, num_classes: int, in_channels: int, seed: int, **kwargs: int) -> nn.Module:
    """Instantiate ``MODELS[name]`` on the CPU with an initialisation determined by ``seed`` alone.

    The global torch RNG state is forked and restored, so building a model neither depends on nor perturbs
    other random draws. Only the CPU generator is reseeded (not ``torch.manual_seed``, which would also reseed
    every CUDA generator outside the fork); building under ``torch.device("cpu")`` makes the CPU generator
    the one the initialisers use even if a default device was set. Extra ``kwargs`` (e.g. ``image_size`` for
    the CNN, ``groups`` for the ResNet) go to the constructor.
    """
    try:
        factory = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}") from None
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):
        torch.default_generator.manual_seed(int(seed))
        return factory(num_classes=num_classes, in_channels=in_channels, **kwargs)


def check_vectorizable(model: nn.Module) -> None:
    """Raise ValueError if ``model`` cannot be trained stacked by the vectorized cohort engine
    (:mod:`clients.vectorized`): it has buffers (e.g. BatchNorm statistics) or dropout. A property of the model,
    checked by the strategy at construction (before any worker starts) and by the engine."""
    dropout = [name for name, m in model.named_modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
    if dropout:
        raise ValueError(
            "the vectorized cohort engine needs a model without dropout (its random masks would need per-client "
            f"randomness under vmap); this model has {dropout[:3]}"
        )
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        raise ValueError(
            "the vectorized cohort engine needs a model without buffers (BatchNorm running statistics cannot be "
            f"kept per client under vmap; use GroupNorm); this model has {buffers[:3]}"
        )


def build_model_for_dataset(name: str, dataset: str, seed: int) -> nn.Module:
    """Model ``name`` shaped for ``dataset`` (classes, input channels and image size of ``DATASETS[dataset]``)."""
    from fl_app.data.datasets import DATASETS

    info = DATASETS[dataset]
    return build_model(name, info.num_classes, info.in_channels, seed, image_size=info.image_size)


def memory_format_for(device: torch.device) -> torch.memory_format:
    """The memory format convolution weights and activations are kept in on ``device``.

    On a CPU, channels-last (NHWC): oneDNN's convolutions, their backward passes and max-pooling run on it without
    the reorders the NCHW layout costs; the paper CNN's SGD step at batch 32 on one thread runs ~1.3× faster
    (bench/peer.py's compute limit measures the step in this format; docs/performance.md). Elsewhere the default
    contiguous format (cuDNN picks its own algorithms per layout, and the GPU path was measured on it).
    """
    return torch.channels_last if device.type == "cpu" else torch.contiguous_format


def to_compute_layout(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` moved to ``device`` with its 4-D weights in :func:`memory_format_for` ``(device)``, in place.

    The layout changes how the weights are stored, not their values; a convolution on channels-last weights
    produces channels-last activations, so every layer after it follows. Float results differ from the NCHW
    computation in the last bits only (summation order), so every path that must agree bit for bit (the app, the
    plain loop, the parallel loops, the compute limit) trains in this layout.
    """
    return model.to(device=device, memory_format=memory_format_for(device))


def _exchanged(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    # keep_vars so parameters come back as the live tensors (set_weights writes through them).
    return [(k, v) for k, v in model.state_dict(keep_vars=True).items() if v.is_floating_point()]


def weight_names(model: nn.Module) -> list[str]:
    """state_dict keys of the exchanged tensors, in exchange order."""
    return [k for k, _ in _exchanged(model)]


def weight_shapes(model: nn.Module) -> list[tuple[int, ...]]:
    """Shapes of the exchanged tensors, in exchange order."""
    return [tuple(v.shape) for _, v in _exchanged(model)]


def get_weights(model: nn.Module, dtype: torch.dtype = torch.float32) -> list[np.ndarray]:
    """numpy copies (float32 unless ``dtype`` says otherwise) of the floating-point state_dict entries, in
    state_dict order."""
    # contiguous_format: a channels-last weight (to_compute_layout) is exchanged in the logical C order like any other.
    return [
        v.detach().to(device="cpu", dtype=dtype, memory_format=torch.contiguous_format, copy=True).numpy()
        for _, v in _exchanged(model)
    ]


def set_weights(model: nn.Module, weights: Sequence[np.ndarray]) -> None:
    """Copy ``weights`` (as returned by :func:`get_weights`) into ``model`` in place.

    Every shape is checked before anything is written, so a mismatch leaves the model untouched; the error
    names the offending tensor. Values are cast to each tensor's own dtype and device.
    """
    entries = _exchanged(model)
    if len(weights) != len(entries):
        raise ValueError(f"expected {len(entries)} weight arrays for this model, got {len(weights)}")
    arrays = [np.asarray(w) for w in weights]
    for (name, tensor), w in zip(entries, arrays, strict=True):
        if tuple(w.shape) != tuple(tensor.shape):
            raise ValueError(f"shape mismatch for {name!r}: model has {tuple(tensor.shape)}, got {tuple(w.shape)}")
    with torch.no_grad():
        for (_, tensor), w in zip(entries, arrays, strict=True):
            # torch.tensor copies, so read-only arrays (e.g. deserialised from a Flower message) are fine.
            tensor.copy_(torch.tensor(w))


def resolve_device(name: str) -> torch.device:
    """``simulation.device``: ``cuda``, ``cpu``, or ``auto`` (CUDA when torch sees a GPU, except in a Ray worker
    that Ray gave none: :func:`ray_gave_no_gpu`)."""
    if name == "cuda" or (name == "auto" and torch.cuda.is_available() and not ray_gave_no_gpu()):
        return torch.device("cuda")
    return torch.device("cpu")


def ray_gave_no_gpu() -> bool:
    """True in a Ray worker (a simulated ClientApp) to which Ray assigned no GPU (``simulation.client_gpus=0``).

    Our processes start Ray with ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0`` (apps/local_ray.py, as Ray's FutureWarning
    asks), under which such a worker sees every GPU of the machine instead of none; ``device=auto`` must still
    train it on the CPU, or every worker would crowd onto the GPUs outside Ray's resource accounting. The driver (the
    server's evaluation), a SuperNode and any process without Ray use what torch sees."""
    ray = sys.modules.get("ray")  # a Ray worker has imported it; nothing here imports it
    if ray is None or not ray.is_initialized():
        return False
    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE:
        return False
    return not context.get_accelerator_ids().get("GPU")


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device, batch_size: int = 1024
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on (x, y) in eval mode (running BN stats, no dropout).

    The model is moved to ``device``; its previous train/eval mode is restored afterwards. An empty set gives
    ``(nan, nan)``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = int(x.shape[0])
    if n == 0:
        return math.nan, math.nan
    was_training = model.training
    to_compute_layout(model, device)
    model.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    try:
        with torch.inference_mode():
            for start in range(0, n, batch_size):
                xb = x[start : start + batch_size].to(device)
                yb = y[start : start + batch_size].to(device=device, dtype=torch.long)
                logits = model(xb)
                loss_sum += F.cross_entropy(logits, yb, reduction="sum")
                correct += (logits.argmax(dim=1) == yb).sum()
    finally:
        model.train(was_training)
    return loss_sum.item() / n, correct.item() / n
