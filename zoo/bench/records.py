"""JSON records: the common header of every record, file names, writing."""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any

from zoo.bench.accel import gpu_info
from zoo.bench.peaks import device_info, versions
from zoo.runtime import precision as policy

SCHEMA = 2
RESULTS_DIR = os.path.join("bench", "results")
OWN = "own program, raw jax.jit"  # the call of a dispatch row timing a library's own program


def record_base(kind: str) -> dict[str, Any]:
    """Header of every record: device (with GPU name, driver, CUDA and cuDNN versions), library
    versions, the precision settings in effect, host load and PyTorch threads."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    threads = None
    if "torch" in sys.modules:
        threads = sys.modules["torch"].get_num_threads()
    device = device_info()
    gpu = gpu_info()
    if gpu:
        device["gpu"] = gpu
    return {"schema": SCHEMA, "kind": kind, "torch_threads": threads,
            "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "device": device, "versions": versions(), "precision_settings": policy.current(),
            "host_load_avg": list(load) if load else None}


def host_load(record: dict[str, Any]) -> tuple[float | None, int | None]:
    """(1-minute host load average while the record was taken, host cores)."""
    load = record.get("host_load_avg")
    return (load[0] if load else None), record["device"].get("host_cores")


def is_loaded(record: dict[str, Any]) -> bool:
    """Taken while the host's load average exceeded its core count: other jobs competed for
    the cores, so absolute times and even ratios may be off."""
    load, cores = host_load(record)
    return load is not None and cores is not None and load > cores


def record_name(record: dict[str, Any]) -> str:
    """File name of a model record: arch, preset or batch, dtype, modes, methods, precision,
    steps per call (`-k10`), mesh and strategy (`-mesh8-fsdp`), XLA:CPU flag preset
    (`-xla-onednn`) and freed memory kept (`-malloc-keep`)."""
    if record["kind"] == "dispatch":
        return "dispatch.json"
    cfg = record["config"]
    tag = cfg["preset"] or f"b{cfg['batch']}"
    modes = "both" if len(cfg["modes"]) == 2 else cfg["modes"][0]
    resolved = cfg.get("resolved_config") or {}
    has_method = "method" in resolved or "conv_method" in resolved
    method = "" if cfg["method"] == "auto" or not has_method else f"-{cfg['method']}"
    if len(cfg.get("methods") or ()) > 1:
        method = "-methods"
    prec = cfg.get("precision", "default")
    prec = "" if prec == "default" else f"-{prec}"
    k = cfg.get("steps_per_call") or 1
    extra = f"-k{k}" if k > 1 else ""
    if cfg.get("mesh"):
        extra += f"-mesh{'x'.join(map(str, cfg['mesh']))}-{cfg['strategy']}"
    flags = cfg.get("xla_cpu_flags")
    if flags:
        extra += "-xla-" + (flags if flags.replace("-", "").isalnum() else "custom")
    if record.get("malloc", {}).get("applied"):
        extra += "-malloc-keep"
    return f"{cfg['arch']}-{tag}-{cfg['dtype']}-{modes}{method}{prec}{extra}.json"


def dispatch_results(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a dispatch record, each with its `role` and `impl` only where a library owns
    it. Records written before roles named the floor and the bounds as pseudo-impls ("floor",
    "bound") and gave every row a ratio to its own program (the floor's where none)."""
    rows = record["results"]
    if all("role" in r for r in rows):
        return rows
    own = {(r["impl"], r["workload"]) for r in rows if r["call"] == OWN}
    upgraded = []
    for r in rows:
        pseudo = r["impl"] in ("floor", "bound")
        role = r["impl"] if pseudo else "own" if r["call"] == OWN else "style"
        has_own = (r["impl"], r["workload"]) in own
        upgraded.append({**{k: v for k, v in r.items() if not (pseudo and k == "impl")},
                         "role": role, "ratio_to_own": r["ratio_to_own"] if has_own else None})
    return upgraded


def _jsonable(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, tuple | set):
        return list(o)
    return str(o)


def write_json(record: dict[str, Any], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=1, default=_jsonable)
        f.write("\n")


def save(record: dict[str, Any], json_path: str | None, results_dir: str | None,
         console: Any = None) -> list[str]:
    """Write `record` to `json_path` and/or `results_dir/<device>/<name>.json`."""
    paths = [json_path] if json_path else []
    if results_dir:
        paths.append(os.path.join(results_dir, record["device"]["slug"], record_name(record)))
    for path in paths:
        write_json(record, path)
        if console is not None:
            console.print(f"wrote {path}")
    return paths
