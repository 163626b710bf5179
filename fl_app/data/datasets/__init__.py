"""Image datasets as normalised in-memory tensors (docs/running.md, "Data and models").

Fashion-MNIST is the offline default: the Debian package ``dataset-fashion-mnist`` installs the IDX
``.gz`` files in ``/usr/share/datasets/fashion-mnist``; they are extracted once into
``<data_dir>/FashionMNIST/raw`` and read through torchvision's ``FashionMNIST`` class. EMNIST (split
``byclass``, 62 classes — the released DP-FedSAM code loads ``letters`` into a 62-way model, a bug we do not
replicate), CIFAR-10 and CIFAR-100 are read through torchvision from ``data_dir``; they are downloaded only
when the caller passes ``download=True``.

Each split is converted once to a float32 ``N×C×H×W`` tensor normalised with the dataset's mean/std, so local
training indexes tensors instead of paying a PIL round trip and a transform per sample. The result is cached
per process, so a Flower simulation worker loads a dataset once, not once per round. Augmentation is
deliberately absent: the data setting (docs/running.md, "Data and models") has none, and per-sample random
transforms would break the "convert once" design.

One idea a module: ``catalog`` (the datasets, where their files live, the error that says how to get them),
``tensors`` (a split as normalised tensors), ``sources`` (the files: Fashion-MNIST's extraction, torchvision's
readers), ``decoded`` (the per-data-dir cache of decoded arrays), ``loading`` (the per-process cached loaders);
every name is imported from here.
"""

from fl_app.data.datasets.catalog import (
    DATASETS,
    DEFAULT_DATA_DIR,
    FASHION_MNIST_SYSTEM_DIR,
    DatasetInfo,
    DatasetUnavailableError,
    resolve_data_dir,
)
from fl_app.data.datasets.loading import check_dataset, clear_dataset_cache, load_dataset, load_labels, load_split
from fl_app.data.datasets.tensors import TensorData, labels_of

__all__ = [
    "DATASETS",
    "DEFAULT_DATA_DIR",
    "FASHION_MNIST_SYSTEM_DIR",
    "DatasetInfo",
    "DatasetUnavailableError",
    "TensorData",
    "check_dataset",
    "clear_dataset_cache",
    "labels_of",
    "load_dataset",
    "load_labels",
    "load_split",
    "resolve_data_dir",
]
