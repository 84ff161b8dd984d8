"""Keep freed memory for reuse: no page faults for each call's fresh buffers on Linux (glibc).

XLA:CPU allocates every call's temporaries and outputs afresh, and glibc hands large blocks back
to the kernel when they are freed (blocks above its mmap threshold, and those of the worker
threads' own arenas, whose heaps it trims), so each call touches new pages and pays a page
fault per 4 KiB: the vit-cifar training step (batch 32) took 29,400 minor faults and 60-76 ms of
kernel time per step (30% of its CPU time; PyTorch's step 4,000-6,600 faults, 10-20 ms). glibc's
own tunables keep freed memory for reuse: one arena, no mmap for large blocks, no trimming,

    MALLOC_ARENA_MAX=1 MALLOC_MMAP_THRESHOLD_=2147483647 MALLOC_TRIM_THRESHOLD_=2147483647

in the environment, or `keep_freed_memory()` early in the process (before JAX's and
PyTorch's worker threads start). What it gains depends on the model and the library
(docs/investigations/cpu_training_step.md, "Page faults"): the NNX vit-cifar training step
123 -> 89 ms, PyTorch's
3-D U-Net step 1.94 -> 1.23 s, XLA's U-Net nothing. The cost: the process keeps the memory it
freed (its peak stays resident), which is why the converters never do this, and `zoo.bench`
only when asked (`--malloc keep`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any

__all__ = ["KEEP", "keep_freed_memory"]

# glibc's mallopt parameters (malloc.h) and the values set
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
LARGEST = 2**31 - 1  # mallopt takes an int
KEEP = {"arena_max": 1, "mmap_threshold": LARGEST, "trim_threshold": LARGEST}


def keep_freed_memory() -> dict[str, Any]:
    """Set glibc's malloc to keep and reuse freed memory (see the module's docstring); what
    was done, for a benchmark record. Does nothing off Linux/glibc (`applied` False)."""
    if not sys.platform.startswith("linux"):
        return {"applied": False, "reason": f"not glibc ({sys.platform})"}
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return {"applied": False, "reason": "no glibc mallopt in this process"}
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    done = {name: bool(mallopt(param, KEEP[name])) for name, param in
            (("arena_max", M_ARENA_MAX), ("mmap_threshold", M_MMAP_THRESHOLD),
             ("trim_threshold", M_TRIM_THRESHOLD))}
    if not all(done.values()):
        refused = [name for name, ok in done.items() if not ok]
        return {"applied": False, "reason": f"mallopt refused {', '.join(refused)}"}
    return {"applied": True, **KEEP}
