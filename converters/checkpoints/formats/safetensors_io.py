"""Safetensors at disk speed in bounded memory: tensors mapped from the file (nothing is read
until used) and files written tensor by tensor (the header first, then each tensor's bytes)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from converters.checkpoints.io import contiguous, detached

Header = dict[str, Any]
ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
             "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64",
             "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
             "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
_CODES = {v: k for k, v in ST_DTYPES.items()}
ALIGN = 8  # the header is padded so that the data starts 8-byte aligned (as HF writes it)


def _np_dtype(name: str) -> np.dtype:
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)

    return np.dtype(name)


def mapped_tensors(path: Path, header: Header) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file with a validated `header`, each a copy-on-write
    memory map of its own bytes: nothing is read until used, nothing is copied by the reader."""
    with open(path, "rb") as f:
        start = 8 + int.from_bytes(f.read(8), "little")
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        dtype = _np_dtype(ST_DTYPES[t["dtype"]])
        shape = tuple(t["shape"])
        out[name] = (np.memmap(path, dtype, mode="c", offset=start + begin, shape=shape)
                     if end > begin else np.zeros(shape, dtype))
    return out


def nbytes(arrays: Mapping[str, Any]) -> int:
    """The bytes of the tensors in `arrays` (without any header)."""
    return sum(math.prod(np.shape(a)) * np.dtype(a.dtype).itemsize for a in arrays.values())


def encode_header(arrays: Mapping[str, Any], metadata: Mapping[str, str] | None) -> bytes:
    """The length-prefixed, padded JSON header of a safetensors file holding `arrays` in order."""
    header: Header = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, a in arrays.items():
        dtype = np.dtype(a.dtype).name
        if dtype not in _CODES:
            raise ValueError(f"{name!r}: dtype {dtype} cannot be stored in safetensors")
        size = math.prod(np.shape(a)) * np.dtype(a.dtype).itemsize
        header[name] = {"dtype": _CODES[dtype], "shape": list(np.shape(a)),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % ALIGN)
    return len(raw).to_bytes(8, "little") + raw


def write_stream(path: Path, arrays: Mapping[str, Any], metadata: Mapping[str, str] | None,
                 advance: Callable[[int], None] = lambda n: None) -> int:
    """Write `arrays` (in their order) as one safetensors file, one tensor at a time: each is
    made contiguous (if it is not), written and dropped before the next. Returns the bytes
    written; `advance(n)` is told each tensor's size."""
    with open(path, "wb") as f:
        total = f.write(encode_header(arrays, metadata))
        for a in arrays.values():
            a = contiguous(detached(a))  # a mapped tensor: read afresh, dropped after
            if a.size:
                total += f.write(memoryview(a.reshape(-1).view(np.uint8)))
            advance(a.nbytes)
            del a
    return total


def plan_shards(arrays: Mapping[str, Any], max_bytes: int) -> list[list[str]]:
    """The keys of each shard, in order: a new shard whenever the next tensor would take the
    current one past `max_bytes` (a tensor larger than that gets a shard of its own)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, a in arrays.items():
        n = math.prod(np.shape(a)) * np.dtype(a.dtype).itemsize
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def shard_names(count: int, stem: str = "model") -> list[str]:
    """HF's shard file names: ``model-00001-of-00003.safetensors``, ..."""
    return [f"{stem}-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def index_json(weight_map: Mapping[str, str], total_size: int,
               metadata: Mapping[str, str] | None = None) -> str:
    """HF's ``model.safetensors.index.json`` (our metadata, if any, beside ``total_size``)."""
    return json.dumps({"metadata": {"total_size": total_size, **(metadata or {})},
                       "weight_map": dict(weight_map)}, indent=2) + "\n"


def parse_size(text: str | int) -> int:
    """A byte count from ``5GB``, ``500MB``, ``2GiB``, ``1000000`` (HF's ``max_shard_size``)."""
    if isinstance(text, int):
        value = text
    else:
        units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
                 "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
        s = text.strip().upper()
        digits = s.rstrip("KMGTIB")
        unit = s[len(digits):]
        try:
            value = int(float(digits) * units[unit])
        except (ValueError, KeyError):
            raise ValueError(f"shard size {text!r}: expected a size such as 5GB, 500MB or "
                             "2GiB") from None
    if value <= 0:
        raise ValueError(f"shard size {text!r}: must be positive")
    return value

