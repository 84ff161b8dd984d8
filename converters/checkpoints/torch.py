"""Safetensors (canonical and PyTorch) and torch.save files: readers and writers."""

from __future__ import annotations

import functools
import json
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from canonical.torch_arrays import numpy_to_torch
from converters.checkpoints.base import (
    FORMAT_VERSION,
    OPT_PREFIX,
    Checkpoint,
    Detection,
    _first_line,
    _np_state,
    _resolve_config,
    _Task,
)
from converters.checkpoints.io import CheckpointError, ProgressFn, has_sidecar
from converters.core import canonical_spec
from converters.optim import CanonicalOptState
from zoo.configs import Config

_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
                       "U8": "uint8", "BOOL": "bool"}


def _split_opt(arrays: dict[str, np.ndarray], layout: Any) -> tuple[dict, CanonicalOptState | None]:
    state = {k: v for k, v in arrays.items() if not k.startswith(OPT_PREFIX)}
    opt = {k[len(OPT_PREFIX):]: v for k, v in arrays.items() if k.startswith(OPT_PREFIX)}
    if layout is None:
        state.update({OPT_PREFIX + k: v for k, v in opt.items()})  # reported as unexpected
        return state, None
    return state, CanonicalOptState(layout, opt)


def _read_safetensors(path: Path, det: Detection, given: Config | None,
                      progress: ProgressFn | None) -> Checkpoint:
    from safetensors import safe_open

    arrays: dict[str, np.ndarray] = {}
    try:
        with safe_open(str(path), "np") as f:
            keys = list(f.keys())
            task = _Task(progress, "reading", len(keys))
            for k in keys:
                arrays[k] = f.get_tensor(k)
                task.advance()
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read the safetensors file ({_first_line(e)}): "
                              "truncated or corrupted") from e
    meta = det.meta or {}
    state, opt = _split_opt(arrays, meta.get("optimizer"))
    config = _resolve_config(path, det.meta, given, list(state))
    state = _ordered_state(state, config)  # safetensors stores its keys sorted by name
    return Checkpoint(config, state, opt, meta.get("step"))


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise CheckpointError("reading or writing .pt files needs PyTorch: "
                              "pip install 'jax-model-zoo[torch]'") from e
    return torch


_TORCH_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                 "uint8", "bool")


def _check_zip(path: Path) -> None:
    """A torch.save zip whose every member passes its CRC-32 check (torch.load checks none)
    and claims no more bytes than the file holds; CheckpointError otherwise."""
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as z:
            big = [i.filename for i in z.infolist() if i.file_size > size]
            if big:
                raise CheckpointError(f"{path}: zip member {big[0]!r} claims more bytes than the "
                                      "file holds: corrupted")
            bad = z.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError,
            NotImplementedError, RuntimeError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: damaged zip archive ({_first_line(e)})") from e
    if bad is not None:
        raise CheckpointError(f"{path}: zip member {bad!r} fails its CRC-32 check: the file is "
                              "corrupted")


def _check_tensors(path: Path, obj: Mapping[str, Any]) -> None:
    torch = _import_torch()
    for k, v in obj.items():
        if v.layout != torch.strided:
            raise CheckpointError(f"{path}: {k!r} is a {v.layout} tensor: only dense tensors "
                                  "are supported")
        if v.device.type == "meta":
            raise CheckpointError(f"{path}: {k!r} is a meta tensor (it holds no data)")
        name = str(v.dtype).removeprefix("torch.")
        if name not in _TORCH_DTYPES:
            raise CheckpointError(f"{path}: {k!r} has dtype {name}, which the zoo does not "
                                  f"store (supported: {', '.join(_TORCH_DTYPES)})")


def _load_pt(path: Path) -> dict[str, Any]:
    torch = _import_torch()
    if zipfile.is_zipfile(path):
        _check_zip(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message wraps the reason in advice to retry unsafely: keep only the reason
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "GLOBAL" in ln or ln.startswith("Unsupported")),
                   "not a plain tensor pickle.")
        raise CheckpointError(
            f"{path}: refused by PyTorch's safe loader (torch.load(weights_only=True)): {why} "
            "The file is corrupted or holds more than tensors (e.g. pickled objects that would "
            "run code); this tool never loads it any other way") from e
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read the torch.save file ({type(e).__name__}: "
                              f"{_first_line(e)}): truncated or corrupted") from e
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{path}: holds a {type(obj).__name__}, not a state_dict")
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{path}: not a state_dict of tensors: entries {bad[:10]} are not "
                              "name -> tensor")
    _check_tensors(path, obj)
    return dict(obj)


def _read_torch(path: Path, det: Detection, given: Config | None,
                progress: ProgressFn | None) -> Checkpoint:
    if det.variant == "safetensors":
        return _read_safetensors(path, det, given, progress)
    task = _Task(progress, "reading", 1)
    state = _np_state(_load_pt(path))
    task.advance()
    config = _resolve_config(path, det.meta, given, list(state))
    return Checkpoint(config, state)


@functools.lru_cache(maxsize=64)
def _key_order(config: Config) -> dict[str, int]:
    return {k: i for i, k in enumerate(canonical_spec(config))}


def _ordered_state(state: dict[str, Any], config: Config) -> dict[str, Any]:
    """`state` in the canonical order (PyTorch's state_dict order), unknown keys last."""
    order = _key_order(config)
    return {k: state[k] for k in sorted(state, key=lambda k: order.get(k, 1 << 30))}


def _safetensors_metadata(ck: Checkpoint, fmt: str, dtype: np.dtype) -> dict[str, str]:
    meta = {"format": "pt", "zoo_format": fmt, "format_version": str(FORMAT_VERSION),
            "arch": ck.config.arch, "config": ck.config.to_json(), "dtype": np.dtype(dtype).name,
            "kind": "training" if ck.training else "model"}
    if ck.step is not None:
        meta["step"] = str(int(ck.step))
    if ck.optimizer is not None:
        meta["optimizer"] = json.dumps(ck.optimizer.layout)
    return meta


def _write_safetensors(ck: Checkpoint, fmt: str, dtype: np.dtype, native: Any, tmp: Path,
                       dst: Path) -> None:
    from safetensors.numpy import save_file

    arrays = dict(_ordered_state(ck.state, ck.config))
    if ck.optimizer is not None:
        arrays.update({OPT_PREFIX + k: v for k, v in ck.optimizer.arrays.items()})
    arrays = {k: np.asarray(v, order="C") for k, v in arrays.items()}  # keeps 0-d
    save_file(arrays, str(tmp), metadata=_safetensors_metadata(ck, fmt, dtype))


def _write_torch(ck: Checkpoint, fmt: str, dtype: np.dtype, native: Any, tmp: Path,
                 dst: Path) -> None:
    if not has_sidecar(dst, fmt):  # .safetensors: a state_dict with canonical's metadata
        _write_safetensors(ck, fmt, dtype, native, tmp, dst)
        return
    from collections import OrderedDict

    torch = _import_torch()
    state = OrderedDict((k, numpy_to_torch(v))
                        for k, v in _ordered_state(ck.state, ck.config).items())
    torch.save(state, tmp)
