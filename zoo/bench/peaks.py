"""Device identification, peak throughput and library versions for the JSON records.

Peaks are dense (no sparsity) datasheet numbers for NVIDIA's SXM parts; for CPUs an estimate
from the core count, clock and vector width. Shares of peak are therefore indicative only.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
import re
from dataclasses import asdict, dataclass
from typing import Any

import jax


@dataclass(frozen=True)
class Peak:
    """Peak TFLOP/s per compute format (`zoo.runtime.precision.compute_format`: float32, tf32,
    bfloat16) and memory bandwidth in GB/s."""

    name: str
    tflops: dict[str, float]
    gbps: float
    estimate: bool = False
    note: str = ""

    def flops_per_s(self, dtype: str) -> float | None:
        t = self.tflops.get(dtype)
        return t * 1e12 if t else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# float32 on NVIDIA GPUs runs on TF32 tensor cores at the libraries' default precision and on
# CUDA cores at "highest": the share of peak uses the format the run computed in.
GPU_PEAKS: dict[str, Peak] = {
    "h100-pcie": Peak("NVIDIA H100 PCIe", {"float32": 51.0, "tf32": 378.0, "bfloat16": 756.0},
                      2000.0, note="tf32 = float32 at the default precision (tensor cores)"),
    "h100": Peak("NVIDIA H100 SXM", {"float32": 67.0, "tf32": 494.0, "bfloat16": 989.0}, 3350.0,
                 note="tf32 = float32 at the default precision (tensor cores)"),
    "h200": Peak("NVIDIA H200 SXM", {"float32": 67.0, "tf32": 494.0, "bfloat16": 989.0}, 4800.0,
                 note="tf32 = float32 at the default precision (tensor cores)"),
}
CPU_GBPS_PER_CORE = 10.0  # rough: a server core's share of DRAM bandwidth


def _cpuinfo() -> dict[str, str]:
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return {}
    info: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            info.setdefault(k.strip(), v.strip())
    return info


def cpu_peak() -> Peak:
    """cores x clock x FLOP/cycle: 32 float32 FLOP/cycle with AVX2 FMA or AMD AVX-512 (two
    256-bit FMA pipes), 64 with Intel AVX-512, 8 otherwise."""
    info = _cpuinfo()
    cores = os.cpu_count() or 1
    flags = set(info.get("flags", "").split())
    try:
        ghz = float(info.get("cpu MHz", "0")) / 1000 or 2.5
    except ValueError:
        ghz = 2.5
    amd = "AMD" in info.get("vendor_id", "") or "AMD" in info.get("model name", "")
    if "avx512f" in flags and not amd:
        per_cycle = 64
    elif "fma" in flags or "avx512f" in flags:
        per_cycle = 32
    else:
        per_cycle = 8
    tflops = cores * ghz * per_cycle / 1e3
    name = info.get("model name") or platform.processor() or "CPU"
    return Peak(f"{name} ({cores} cores)", {"float32": tflops, "bfloat16": tflops},
                cores * CPU_GBPS_PER_CORE, estimate=True,
                note=f"estimate: {cores} cores x {ghz:.2f} GHz x {per_cycle} FLOP/cycle; "
                     f"{CPU_GBPS_PER_CORE:g} GB/s per core")


def device_peak(device: Any = None) -> Peak | None:
    device = device or jax.devices()[0]
    if device.platform == "cpu":
        return cpu_peak()
    kind = device.device_kind.lower()
    if "h200" in kind:
        return GPU_PEAKS["h200"]
    if "h100" in kind:
        return GPU_PEAKS["h100-pcie" if "pcie" in kind else "h100"]
    return None


def device_slug(device: Any = None) -> str:
    """Directory name for results: "cpu", or the device kind ("nvidia-h100-80gb-hbm3")."""
    device = device or jax.devices()[0]
    if device.platform == "cpu":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", device.device_kind.lower()).strip("-") or device.platform


def device_info() -> dict[str, Any]:
    device = jax.devices()[0]
    peak = device_peak(device)
    info = {"slug": device_slug(device), "name": device.device_kind, "backend":
            jax.default_backend(), "platform": device.platform, "count": jax.device_count(),
            "host_cpu": _cpuinfo().get("model name") or platform.processor(),
            "host_cores": os.cpu_count(), "peak": peak.to_dict() if peak else None}
    with contextlib.suppress(Exception):
        info["platform_version"] = device.client.platform_version
    return info


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("jax", "jaxlib", "flax", "equinox", "optax", "numpy", "torch"):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception:
            out[name] = None
    try:
        import torch

        out["torch_cuda"] = torch.version.cuda
    except Exception:
        out["torch_cuda"] = None
    cuda = None
    if jax.default_backend() == "gpu":
        try:
            cuda = jax.devices()[0].client.platform_version
        except Exception:
            cuda = "unknown"
    out["jax_cuda"] = cuda
    return out
