"""Other formulations of the captured engine's local step, timed against its own (bench/captured_step.py
``--variants``), to find a faster step before the engine adopts one.

The captured step (:class:`clients.captured.CapturedCohort`) runs ``vmap`` over the clients' stacked weights; vmap's
batching rule turns each client's convolution into one grouped convolution over all clients, whose kernels (and the
NCHW↔NHWC conversions around them) dominate the step on a GPU. The variants:

* ``gemm``: every ``nn.Conv2d`` computed as im2col (``F.unfold``) and one matrix product (:class:`GemmConv2d`,
  the same parameters under the same names), so under vmap the clients' convolutions are batched GEMMs;
* ``bf16``: the step's forward and backward under ``torch.autocast(bfloat16)`` (:class:`AutocastCohort`), the
  weights, momentum and update staying float32;

and their product. Each variant's step is checked against the default's on the same batch (the largest difference
of the stepped weights) and timed as the engine runs it (its CUDA graph replayed on a GPU, eager on a CPU); the
step's floating-point operations are counted once (``torch.utils.flop_counter``) and reported as TFLOP/s.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from bench.captured_step import timed
from clients.captured import MIN_STEPS_FOR_GRAPH, CapturedCohort, StepPlan
from clients.training import LocalTrainingConfig


class GemmConv2d(nn.Conv2d):
    """``nn.Conv2d`` (groups 1, zero padding) as im2col and a matrix product: the same result to float rounding."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        kh, kw = self.kernel_size
        (ph, pw), (sh, sw), (dh, dw) = self.padding, self.stride, self.dilation  # type: ignore[misc]
        cols = F.unfold(x, (kh, kw), dilation=(dh, dw), padding=(ph, pw), stride=(sh, sw))
        out = self.weight.flatten(1) @ cols  # (out, in·kh·kw) @ (n, in·kh·kw, L) -> (n, out, L)
        if self.bias is not None:
            out = out + self.bias[:, None]
        oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        return out.view(n, self.out_channels, oh, ow)


def with_gemm_convolutions(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose ``nn.Conv2d`` layers are :class:`GemmConv2d` with the same weights and names."""
    out = copy.deepcopy(model)
    for name, module in list(out.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Conv2d:
                if child.groups != 1 or child.padding_mode != "zeros" or isinstance(child.padding, str):
                    raise ValueError(f"{name}.{child_name}: only groups=1 with numeric zero padding")
                gemm = GemmConv2d(child.in_channels, child.out_channels, child.kernel_size, child.stride,
                                  child.padding, child.dilation, bias=child.bias is not None)  # fmt: skip
                gemm.load_state_dict(child.state_dict())
                setattr(module, child_name, gemm.to(child.weight.device, child.weight.dtype))
    return out


class AutocastCohort(CapturedCohort):
    """The captured cohort with its step (forward, backward, update) under ``torch.autocast(bfloat16)``; a graph
    captures the autocast step."""

    def step(self, k: int) -> None:
        with torch.autocast(self.x.device.type, dtype=torch.bfloat16):
            super().step(k)


VARIANTS: dict[str, tuple[bool, bool]] = {  # name: (GEMM convolutions, bf16 autocast)
    "default": (False, False), "gemm": (True, False), "bf16": (False, True), "gemm+bf16": (True, True),
}  # fmt: skip


def _workspace(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: LocalTrainingConfig, k: int,
               width: int, variant: str) -> CapturedCohort:  # fmt: skip
    gemm, bf16 = VARIANTS[variant]
    cls = AutocastCohort if bf16 else CapturedCohort
    return cls(with_gemm_convolutions(model) if gemm else model, x, y, config, k, width,
               graphs=x.device.type == "cuda")  # fmt: skip


def _load(workspace: CapturedCohort, plan: StepPlan, lr: float) -> None:
    """From the round's global weights, the plan's first batch (every client training) taken as often as a shape
    needs to be captured (:data:`clients.captured.MIN_STEPS_FOR_GRAPH`; on a GPU), the batch left in the inputs."""
    k, n = len(plan.order), MIN_STEPS_FOR_GRAPH
    first = StepPlan(
        plan.order, plan.sizes, [k] * n, plan.index[:1].expand(n, -1, -1), plan.weight[:1].expand(n, -1, -1)
    )
    workspace.train({name: p.detach() for name, p in workspace.model.named_parameters()}, first, lr)


def time_variants(model: nn.Module, x: torch.Tensor, y: torch.Tensor, config: LocalTrainingConfig, plan: StepPlan,
                  lr: float, steps: int, names: tuple[str, ...] = tuple(VARIANTS)) -> dict[str, Any]:  # fmt: skip
    """Per variant: ms a full-width step (graph replay on a GPU, eager on a CPU), TFLOP/s, and the largest
    difference of its stepped weights from the default step's on the same batch."""
    k, device = len(plan.order), x.device
    out: dict[str, Any] = {}
    reference: dict[str, torch.Tensor] | None = None
    flops = 0
    for name in names:
        workspace = _workspace(model, x, y, config, k, config.batch_size, name)
        _load(workspace, plan, lr)  # the same steps from the same weights for every variant (a GPU captures)
        stepped = {n: t[:k].detach().clone() for n, t in workspace.params.items()}
        if reference is None:
            reference = stepped
            with FlopCounterMode(display=False) as counter, torch.no_grad():
                workspace.step(k)
            flops = counter.get_total_flops()
        graph = workspace.graphs.get(k)

        def run(graph: Any = graph, workspace: CapturedCohort = workspace) -> None:
            with torch.no_grad():
                for _ in range(steps):
                    graph.replay() if graph is not None else workspace.step(k)

        seconds = min(timed(run, 3, device)) / steps
        diff = max(float((stepped[n].float() - reference[n].float()).abs().max()) for n in stepped)
        out[name] = {"step_ms": seconds * 1e3, "tflops": flops / seconds / 1e12, "max_abs_diff_vs_default": diff,
                     "captured": graph is not None}  # fmt: skip
    out["flop_per_step"] = flops
    return out
