"""One split held in memory as normalised tensors (:class:`TensorData`: float32 ``N×C×H×W`` normalised with the
dataset's mean/std, int64 labels), made once from the decoded uint8 images after checking their shape, dtype
and label range.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fl_app.data.datasets.catalog import DatasetInfo


@dataclass(frozen=True, eq=False)
class TensorData:
    """One split held in memory: ``x`` float32 ``N×C×H×W`` (normalised), ``y`` int64 ``N``.

    The tensors are shared by every caller of the cached :func:`load_dataset`: never modify them in place.
    ``eq=False`` keeps identity semantics (element-wise tensor ``==`` has no single truth value).
    """

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        if self.x.dtype != torch.float32 or self.x.ndim != 4:
            raise ValueError(f"x must be float32 N×C×H×W, got {self.x.dtype} of shape {tuple(self.x.shape)}")
        if self.y.dtype != torch.int64 or self.y.shape != (self.x.shape[0],):
            raise ValueError(f"y must be int64 of shape ({len(self.x)},), got {self.y.dtype} {tuple(self.y.shape)}")

    def __len__(self) -> int:
        return int(self.y.shape[0])


def labels_of(data: TensorData) -> np.ndarray:
    """Labels as an int64 numpy array (what the partitioners consume)."""
    return data.y.numpy().astype(np.int64, copy=True)


def _checked_labels(labels: object, info: DatasetInfo) -> np.ndarray:
    y = np.asarray(labels, dtype=np.int64)
    if y.size and (int(y.min()) < 0 or int(y.max()) >= info.num_classes):
        raise ValueError(f"labels outside [0, {info.num_classes}): min {int(y.min())}, max {int(y.max())}")
    return y


def _checked_images(images: torch.Tensor | np.ndarray, info: DatasetInfo) -> torch.Tensor:
    """The uint8 images as N×C×H×W (a view where possible), or ValueError."""
    x = torch.as_tensor(np.asarray(images))
    if x.dtype != torch.uint8:
        raise ValueError(f"expected uint8 images, got {x.dtype}")
    if x.ndim == 3:  # grey N×H×W
        x = x.unsqueeze(1)
    elif x.ndim == 4 and x.shape[-1] == info.in_channels:  # torchvision CIFAR keeps N×H×W×C
        x = x.permute(0, 3, 1, 2)
    expected = (info.in_channels, info.image_size, info.image_size)
    if tuple(x.shape[1:]) != expected:
        raise ValueError(f"expected images of shape N×{expected}, got {tuple(x.shape)}")
    return x


def _to_tensor_data(images: torch.Tensor | np.ndarray, labels: object, info: DatasetInfo) -> TensorData:
    x = _checked_images(images, info)
    y = torch.as_tensor(_checked_labels(labels, info))
    mean = torch.tensor(info.mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(info.std, dtype=torch.float32).view(1, -1, 1, 1)
    xf = x.to(torch.float32).div_(255.0).sub_(mean).div_(std).contiguous()
    return TensorData(x=xf, y=y)
