"""Accelerator facts for the records: the GPU and its software, JAX's allocator, PyTorch memory.

JAX preallocates 75% of a GPU's memory when its backend starts; PyTorch in the same process then
runs out. `configure_allocator` therefore turns preallocation off (unless the user chose a
setting) before JAX initialises, and says in the record whether it was in time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from typing import Any

PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
ALLOCATOR_VARS = (PREALLOCATE, MEM_FRACTION, "XLA_PYTHON_CLIENT_ALLOCATOR")


def jax_backend_started() -> bool:
    """Whether JAX has created its backends (after that, allocator variables are ignored)."""
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - JAX layout changed; assume the worst
        return True
    return bool(getattr(xla_bridge, "_backends", {}))


def configure_allocator(torch_in_process: bool) -> dict[str, Any]:
    """With PyTorch in the process, stop JAX preallocating the GPU (a user's own setting wins).

    Returns what the record states: the variables in effect, who set them, and whether JAX's
    backend was still to start (the setting applies only then).
    """
    user = {k: os.environ[k] for k in ALLOCATOR_VARS if k in os.environ}
    set_here = torch_in_process and not user
    if set_here:
        os.environ[PREALLOCATE] = "false"
    return {"env": {k: os.environ[k] for k in ALLOCATOR_VARS if k in os.environ},
            "set_by": "zoo.bench" if set_here else ("user" if user else None),
            "reason": "PyTorch runs in the same process" if torch_in_process else None,
            "applied": not jax_backend_started()}


# --------------------------------------------------------------------------- PyTorch on CUDA
def torch_cuda() -> Any:
    """The torch module if it is imported and sees a CUDA device, else None."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_available() else None


def torch_reset_peak() -> None:
    torch = torch_cuda()
    if torch is not None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def torch_peak_bytes() -> int | None:
    """`torch.cuda.max_memory_allocated()` since the last reset (None without CUDA)."""
    torch = torch_cuda()
    if torch is None:
        return None
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())


# --------------------------------------------------------------------------- versions
def _nvidia_smi() -> dict[str, str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    with contextlib.suppress(Exception):
        out = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20).stdout.splitlines()
        if out:
            name, driver, memory = (v.strip() for v in out[0].split(","))
            return {"name": name, "driver": driver, "memory": memory}
    return {}


def _jax_cuda_versions() -> dict[str, Any]:
    """CUDA runtime, cuDNN and driver versions as JAX's CUDA plugin reports them (private API,
    guarded: `jax._src.lib.cuda_versions` is the plugin's `_versions` module)."""
    out: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        from jax._src.lib import cuda_versions

        for key, fn in (("cuda_runtime", "cuda_runtime_get_version"),
                        ("cudnn", "cudnn_get_version"),
                        ("cuda_driver", "cuda_driver_get_version")):
            with contextlib.suppress(Exception):
                out[key] = getattr(cuda_versions, fn)()
    return out


def gpu_info() -> dict[str, Any] | None:
    """GPU name, driver, and the CUDA / cuDNN versions of JAX and PyTorch (None on CPU)."""
    import jax

    if jax.default_backend() != "gpu":
        return None
    info: dict[str, Any] = {"name": jax.devices()[0].device_kind, **_nvidia_smi(),
                            "jax": _jax_cuda_versions()}
    with contextlib.suppress(Exception):
        info["jax"]["platform_version"] = jax.devices()[0].client.platform_version
    torch = torch_cuda()
    if torch is not None:
        info["torch"] = {"cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                         "device": torch.cuda.get_device_name()}
    return info
