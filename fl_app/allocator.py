"""Memory a training process keeps: the C allocator's freed memory (glibc's ``mallopt``), so local steps stop
page-faulting, and the objects it imported, out of the garbage collector's full passes; and the driver's malloc
arenas, kept few.

Why: every local step allocates and frees the same activation, gradient and update buffers (from kilobytes to a few
megabytes each). glibc's malloc serves blocks above its *mmap threshold* with fresh ``mmap``'d pages and hands them
back on ``free``, and it returns the top of the heap to the kernel whenever more than its *trim threshold* is free
there; by default both thresholds start low (128 KiB) and only adapt slowly. A training step then page-faults its
buffers in again on every step. Measured on the development machine (bench/peer.py's compute limit, the paper CNN's
SGD step at batch 32 on one thread, channels-last): 850-940 samples/s with glibc's defaults against 1,100-1,170
with the thresholds below. PyTorch's CPU performance guide makes the same point by recommending jemalloc or
tcmalloc; this is that effect without preloading another allocator.

:func:`keep_freed_memory` raises the mmap threshold to glibc's maximum (32 MiB on 64-bit: larger blocks, such as
a dataset's tensors, are still mapped and unmapped on their own) and the trim threshold to 128 MiB (at most that
much freed memory stays in the process beyond what it uses). Setting either also switches off glibc's dynamic
adjustment. Numbers are unaffected: only where memory comes from changes. A no-op returning False where the C
library has no ``mallopt`` (macOS, musl); idempotent.

:func:`limit_malloc_arenas` caps the number of glibc malloc arenas of a process that runs many threads but does its
heavy allocation on few (the driver: Ray's and Flower's threads, the noise drawn ahead on a thread of its own). glibc
gives a thread that meets a locked arena an arena of its own, up to 8 per core, and each keeps what was freed in it;
the driver's model-sized buffers, allocated now in one thread and now in another, then leave freed memory in several
arenas. Measured on the P2 simulation (peak RSS, bench/processes.py's monitor): the driver 1,322 MiB with glibc's
default, 1,132 MiB with two arenas, the same s/round.

:func:`freeze_imported_objects` moves every object the process holds so far (torch, Flower and the app, imported
once and kept for the worker's life) into the collector's permanent generation (``gc.freeze``): a full collection
then walks only what was made since. Measured with ``gc.callbacks`` in the P2 simulation's workers: each worker ran
two full collections of 0.18-0.24 s in its first round, 0.01-0.03 s with the imports frozen. Garbage that was
already unreachable when frozen is not freed (import-time leftovers: a one-off, not a per-round cost).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable

__all__ = [
    "MALLOC_ARENAS",
    "MMAP_THRESHOLD_BYTES",
    "TRIM_THRESHOLD_BYTES",
    "freeze_imported_objects",
    "keep_freed_memory",
    "limit_malloc_arenas",
]

#: glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX = 4 MiB · sizeof(long)).
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 128 * 2**20
#: The driver's malloc arenas (:func:`limit_malloc_arenas`).
MALLOC_ARENAS = 2
# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


@functools.cache
def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


@functools.cache
def keep_freed_memory() -> bool:
    """Set this process's malloc thresholds (see the module docstring); True when the C library took both."""
    mallopt = _mallopt()
    # mallopt returns 1 on success, 0 on error.
    return (
        mallopt is not None
        and bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
        and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    )


@functools.cache
def limit_malloc_arenas(count: int = MALLOC_ARENAS) -> bool:
    """At most ``count`` malloc arenas in this process from now on (see the module docstring); True when the C
    library took it. Early in the process: arenas made before stay."""
    mallopt = _mallopt()
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, count))


@functools.cache
def freeze_imported_objects() -> int:
    """``gc.freeze()`` once per process (see the module docstring); the number of objects frozen then."""
    gc.freeze()
    return gc.get_freeze_count()
