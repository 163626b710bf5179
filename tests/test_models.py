"""Tests for fl_app.models (docs/running.md, "Data and models") and the flat weight exchange."""

from __future__ import annotations

import sys
import types
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from apps.local_ray import RAY_ENV
from fl_app.models import (
    CNN,
    MODELS,
    build_model,
    get_weights,
    resnet18_gn,
    resolve_device,
    set_weights,
    weight_names,
    weight_shapes,
)


def _num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_registry() -> None:
    assert MODELS["cnn"] is CNN and MODELS["resnet18"] is resnet18_gn
    with pytest.raises(ValueError, match="unknown model"):
        build_model("vgg", 10, 3, seed=0)


def test_cnn_shapes_and_parameter_count() -> None:
    model = CNN(num_classes=10, in_channels=1)
    assert model(torch.zeros(5, 1, 28, 28)).shape == (5, 10)
    # FedAvg-paper CNN / released CNN_OriginalFedAvg: 832 + 51,264 + 1,606,144 + 5,130.
    assert _num_params(model) == 1_663_370
    assert _num_params(CNN(num_classes=62)) == 1_690_046  # EMNIST byclass head
    assert model.classifier[1].in_features == 64 * 7 * 7  # padding 2: 28 → 14 → 7


def test_resnet18_gn() -> None:
    for num_classes in (10, 100):
        model = resnet18_gn(num_classes)
        assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
        assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
        model.eval()
        with torch.no_grad():
            assert model(torch.zeros(2, 3, 32, 32)).shape == (2, num_classes)
    model = resnet18_gn(10)
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)
    assert _num_params(model) == 11_173_962
    assert list(dict(model.named_buffers())) == [], "GroupNorm keeps no running statistics"
    assert resnet18_gn(10, in_channels=1)(torch.zeros(1, 1, 28, 28)).shape == (1, 10)


def test_build_model_deterministic_per_seed() -> None:
    a = get_weights(build_model("cnn", 10, 1, seed=1))
    b = get_weights(build_model("cnn", 10, 1, seed=1))
    c = get_weights(build_model("cnn", 10, 1, seed=2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    r1 = get_weights(build_model("resnet18", 10, 3, seed=5))
    r2 = get_weights(build_model("resnet18", 10, 3, seed=5))
    assert all(np.array_equal(x, y) for x, y in zip(r1, r2, strict=True))


def test_build_model_leaves_global_rng_alone() -> None:
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    build_model("cnn", 10, 1, seed=99)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(torch.rand(3), expected)


def test_get_set_weights_round_trip() -> None:
    src = build_model("cnn", 10, 1, seed=0)
    dst = build_model("cnn", 10, 1, seed=1)
    weights = get_weights(src)
    assert all(w.dtype == np.float32 for w in weights)
    assert [w.shape for w in weights] == weight_shapes(src)
    assert weight_names(src) == list(src.state_dict())  # no buffers: exactly the parameters, in order
    set_weights(dst, weights)
    x = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(dst(x), src(x), rtol=0, atol=0)
    # Copies, not views: editing the arrays does not touch the model.
    weights[0][...] = 0.0
    assert not np.array_equal(get_weights(src)[0], weights[0])


def test_set_weights_accepts_read_only_and_float64() -> None:
    model = build_model("cnn", 10, 1, seed=0)
    weights = [w.astype(np.float64) for w in get_weights(build_model("cnn", 10, 1, seed=3))]
    for w in weights:
        w.setflags(write=False)  # as deserialised from a message buffer
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        set_weights(model, weights)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    np.testing.assert_allclose(get_weights(model)[2], weights[2], rtol=1e-6)


def test_set_weights_shape_mismatch_names_tensor() -> None:
    model = build_model("cnn", 10, 1, seed=0)
    before = get_weights(model)
    bad = get_weights(build_model("cnn", 10, 1, seed=1))
    bad[-1] = np.zeros(62, dtype=np.float32)  # wrong head size on the last tensor
    with pytest.raises(ValueError, match=r"classifier\.3\.bias"):
        set_weights(model, bad)
    # Checked before writing: the model is untouched.
    assert all(np.array_equal(x, y) for x, y in zip(before, get_weights(model), strict=True))
    with pytest.raises(ValueError, match="expected 8 weight arrays"):
        set_weights(model, before[:-1])


def test_batchnorm_models_exchange_float_buffers_only() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    names = weight_names(model)
    assert "1.running_mean" in names and "1.running_var" in names
    assert "1.num_batches_tracked" not in names
    model.train()
    model(torch.randn(4, 1, 5, 5))  # updates running stats and the counter
    fresh = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    set_weights(fresh, get_weights(model))
    torch.testing.assert_close(fresh[1].running_mean, model[1].running_mean)
    assert int(fresh[1].num_batches_tracked) == 0, "the integer counter stays local"


class _StubRay(types.SimpleNamespace):
    """What ray_gave_no_gpu reads of Ray: initialised, the process's mode, the GPUs Ray gave it."""

    WORKER_MODE = 1

    def __init__(self, mode: int, gpus: list[int]) -> None:
        context = types.SimpleNamespace(
            worker=types.SimpleNamespace(mode=mode), get_accelerator_ids=lambda: {"GPU": gpus, "TPU": []}
        )
        super().__init__(is_initialized=lambda: True, get_runtime_context=lambda: context)


def test_device_auto_stays_on_the_cpu_in_a_ray_worker_given_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU twin of a GPU machine: torch sees a GPU (patched), and a Ray worker that Ray gave none (which sees
    the machine's GPUs under RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0) trains on the CPU under ``auto``."""
    assert RAY_ENV == {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}  # the value Ray's FutureWarning names
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "ray", _StubRay(mode=1, gpus=[]))
    assert [resolve_device(d).type for d in ("auto", "cpu", "cuda")] == ["cpu", "cpu", "cuda"]
    monkeypatch.setitem(sys.modules, "ray", _StubRay(mode=1, gpus=[0]))
    assert resolve_device("auto").type == "cuda"  # a worker Ray gave a GPU
    monkeypatch.setitem(sys.modules, "ray", _StubRay(mode=0, gpus=[]))
    assert resolve_device("auto").type == "cuda"  # the driver: the server's evaluation uses what torch sees
    monkeypatch.delitem(sys.modules, "ray")
    assert resolve_device("auto").type == "cuda"  # no Ray: a SuperNode
