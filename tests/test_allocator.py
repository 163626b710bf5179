"""fl_app/allocator.py: with the thresholds set, a training step stops page-faulting its buffers in again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fl_app.allocator import keep_freed_memory

ROOT = Path(__file__).resolve().parents[1]


# Minor page faults per steady-state SGD step of the paper CNN at batch 32 (channels-last, one thread), in a fresh
# process: glibc's defaults fault in thousands of pages a step (~3,700 measured), the kept memory none.
_FAULTS = r"""
import resource, sys, torch, torch.nn.functional as F
from fl_app.allocator import keep_freed_memory
from fl_app.models import CNN, to_compute_layout
torch.set_num_threads(1)
if sys.argv[1] == "keep":
    assert keep_freed_memory()
model = to_compute_layout(CNN(), torch.device("cpu"))
x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.5, weight_decay=5e-4)
def step():
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()
for _ in range(5):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def _faults_per_step(mode: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS, mode], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_step_reuses_its_freed_buffers_instead_of_faulting_them_in() -> None:
    assert _faults_per_step("default") > 1000  # the cost the module removes is there without it
    assert _faults_per_step("keep") < 50


def test_keep_freed_memory_is_idempotent() -> None:
    assert keep_freed_memory() is keep_freed_memory()
