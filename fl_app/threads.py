"""Pin the thread pools of the native libraries a process has loaded (BLAS, OpenMP) with ``threadpoolctl``.

Why: NumPy's OpenBLAS starts one thread per core and, after each threaded call, keeps those threads
*spinning* (busy-waiting for the next call) for a while instead of sleeping. The only BLAS work in this app is
small — the float64 ``np.dot`` of :func:`fl_app.privacy.mechanisms.global_l2_norm`, block by block, when an
update is clipped — but one such call per client is enough: the spinning OpenBLAS threads then compete with
torch's compute threads for the same cores. On the 2-core development machine the plain PyTorch loop of
``bench/baseline.py`` ran 1.6× faster with ``OPENBLAS_NUM_THREADS=1``, and under load a single
``global_l2_norm`` of the paper CNN's 1.66M coordinates took 15–40 ms with OpenBLAS threaded against < 1 ms
on one thread. Environment variables only help if they are set before the library is loaded (and they leak
into every child process); :func:`limit_library_threads` pins the pools of the running process instead.

What it sets, in the libraries threadpoolctl finds loaded in this process:

* OpenMP runtimes (libgomp, libiomp, LLVM's libomp) → ``num_threads``. torch's Linux wheels run their
  intra-op pool on OpenMP, so this is torch's thread count too: call it with ``torch.get_num_threads()`` (or
  after ``torch.set_num_threads(n)`` with that n); it keeps native libraries using OpenMP inside that budget.
* BLAS libraries that ship with torch (e.g. an OpenBLAS or MKL inside ``torch/lib`` or ``torch.libs`` on some
  platforms: torch's own matrix products) → ``num_threads`` as well.
* Every other BLAS (NumPy's and SciPy's OpenBLAS, MKL, BLIS, FlexiBLAS) → ``blas_threads``, 1 by default:
  their work here is too small to gain from threads, and their idle threads only spin.

Idempotent and cheap to call repeatedly (e.g. once per client fit): after the first call it only re-reads
each known pool's thread count (a C call, microseconds) and re-scans the loaded libraries (about a
millisecond) only when new modules have been imported since. Thread-safe.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy  # noqa: F401  (loaded here so that NumPy's BLAS is among the libraries found and pinned)
from threadpoolctl import ThreadpoolController

__all__ = ["library_thread_counts", "limit_library_threads"]


@dataclass
class _State:
    modules_seen: int
    controllers: list[Any]  # threadpoolctl LibController objects: user_api, filepath, num_threads, set_num_threads


_LOCK = threading.Lock()
_STATE: _State | None = None


def _torch_dirs() -> tuple[str, ...]:
    """Directories whose native libraries belong to torch (its package dir and the wheel's ``torch.libs``)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return ()
    package = os.path.realpath(next(iter(spec.submodule_search_locations)))
    return (package + os.sep, package + ".libs" + os.sep)


_TORCH_DIRS = _torch_dirs()


def _wanted(controller: Any, num_threads: int, blas_threads: int) -> int:
    if controller.user_api == "openmp":
        return num_threads
    path = os.path.realpath(controller.filepath or "")
    return num_threads if path.startswith(_TORCH_DIRS) else blas_threads


def limit_library_threads(num_threads: int, blas_threads: int = 1) -> None:
    """Pin OpenMP pools (and torch's own BLAS) to ``num_threads`` and every other BLAS pool to ``blas_threads``.

    Call it in every process that computes, with the number of threads torch uses there (a Ray worker's
    ``client_cpus``, the loop's ``--threads``). See the module docstring for why BLAS gets 1 thread by default.
    """
    for name, value in (("num_threads", num_threads), ("blas_threads", blas_threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    global _STATE
    with _LOCK:
        modules = len(sys.modules)
        if _STATE is None or _STATE.modules_seen != modules:
            _STATE = _State(modules, list(ThreadpoolController().lib_controllers))
        for controller in _STATE.controllers:
            wanted = _wanted(controller, num_threads, blas_threads)
            if controller.num_threads != wanted:
                controller.set_num_threads(wanted)


def library_thread_counts() -> dict[str, int]:
    """``{"<user_api>:<internal_api>:<file name>": threads}`` for every pool threadpoolctl finds (for reports)."""
    return {
        f"{c.user_api}:{c.internal_api}:{os.path.basename(c.filepath or '?')}": int(c.num_threads)
        for c in ThreadpoolController().lib_controllers
    }
