"""bench/step_variants.py: the GEMM convolution is the convolution (values and gradients, per client under vmap), and
every variant of the step runs on the CPU, checked against the default step on the same batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from bench.step_variants import VARIANTS, GemmConv2d, time_variants, with_gemm_convolutions
from clients.captured import step_plan
from clients.training import LocalTrainingConfig
from clients.vectorized import batch_schedule
from fl_app.models import build_model_for_dataset

CONFIG = LocalTrainingConfig(epochs=1, batch_size=4, lr=0.1, momentum=0.5, weight_decay=5e-4, lr_decay=0.998,
                             optimizer="sam", rho=0.5, adaptive=True)  # fmt: skip


@pytest.mark.parametrize(
    ("padding", "stride", "dilation", "bias"), [(2, 1, 1, True), (0, 2, 1, False), (1, 1, 2, True)]
)
def test_gemm_convolution_equals_the_convolution_per_client_under_vmap(
    padding: int, stride: int, dilation: int, bias: bool
) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, kernel_size=3, padding=padding, stride=stride, dilation=dilation, bias=bias).double()
    gemm = with_gemm_convolutions(nn.Sequential(conv))[0]
    assert type(gemm) is GemmConv2d and dict(gemm.named_parameters()).keys() == dict(conv.named_parameters()).keys()
    params = {n: torch.randn(4, *p.shape, dtype=torch.float64) for n, p in conv.named_parameters()}  # 4 clients
    x = torch.randn(4, 6, 3, 11, 11, dtype=torch.float64)

    def loss(module: nn.Module) -> object:
        return vmap(grad(lambda p, xb: functional_call(module, p, (xb,)).square().sum()))

    torch.testing.assert_close(
        vmap(lambda p, xb: functional_call(gemm, p, (xb,)))(params, x),
        vmap(lambda p, xb: functional_call(conv, p, (xb,)))(params, x),
    )
    got, want = loss(gemm)(params, x), loss(conv)(params, x)
    for name in want:
        torch.testing.assert_close(got[name], want[name])


def test_only_plain_convolutions_are_rewritten() -> None:
    with pytest.raises(ValueError, match="groups=1"):
        with_gemm_convolutions(nn.Sequential(nn.Conv2d(4, 4, 3, groups=2)))
    model = build_model_for_dataset("cnn", "fashion_mnist", seed=0)
    rewritten = with_gemm_convolutions(model)
    assert sum(isinstance(m, GemmConv2d) for m in rewritten.modules()) == 2
    assert not any(isinstance(m, GemmConv2d) for m in model.modules())  # a copy: the model is left as it was


def test_every_variant_of_the_step_runs_and_is_checked_against_the_default() -> None:
    torch.manual_seed(0)
    model = build_model_for_dataset("cnn", "fashion_mnist", seed=0)
    x, y = torch.randn(24, 1, 28, 28), torch.randint(0, 10, (24,))
    indices = [np.arange(0, 8), np.arange(8, 16), np.arange(16, 24)]
    schedules = [batch_schedule(8, CONFIG, torch.Generator().manual_seed(i)) for i in range(3)]
    plan = step_plan(indices, schedules, CONFIG.batch_size, torch.device("cpu"))
    result = time_variants(model, x, y, CONFIG, plan, lr=0.1, steps=1)
    assert set(result) == {*VARIANTS, "flop_per_step"} and result["flop_per_step"] > 0
    assert result["default"]["max_abs_diff_vs_default"] == 0.0
    assert result["gemm"]["max_abs_diff_vs_default"] <= 1e-5  # float32 rounding apart
    assert 0 < result["bf16"]["max_abs_diff_vs_default"] < 0.1  # bf16 is not float32, but the same step
    for name in VARIANTS:
        assert result[name]["step_ms"] > 0 and result[name]["tflops"] > 0 and not result[name]["captured"]
