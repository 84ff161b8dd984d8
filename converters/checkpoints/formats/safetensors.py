"""Safetensors files: the canonical layout with our metadata, and PyTorch state_dicts."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from converters.checkpoints.checkpoint import (
    FORMAT_VERSION,
    OPT_PREFIX,
    Checkpoint,
    Detection,
    ordered_state,
)
from converters.checkpoints.configs import resolve_config
from converters.checkpoints.format import CheckpointFormat, Entry, ForeignTree, Probe
from converters.checkpoints.formats.safetensors_io import mapped_tensors, write_stream
from converters.checkpoints.io import CheckpointError, ProgressFn, first_line
from converters.checkpoints.metadata import check_meta, loads_json
from converters.optim import CanonicalOptState
from zoo.configs import Config

DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
          "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
          "BOOL": "bool"}
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
Header = dict[str, Any]


def read_header(path: Path) -> tuple[Header | None, str]:
    """The validated safetensors header, or None and why this is not a safetensors file: the
    length fits the file, the header is a JSON object, every tensor's offsets lie inside the
    data and match its shape and dtype (all in Python integers: nothing overflows)."""
    size = path.stat().st_size
    if size < 10:
        return None, f"only {size} bytes"
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n < 2 or n > size - 8:
            return None, f"header length {n} does not fit the file size {size}"
        if n > 100 * 2**20:
            return None, f"header length {n} exceeds 100 MiB"
        raw = f.read(n)
    if not raw.startswith(b"{"):
        return None, "no JSON header"
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        return None, f"corrupted JSON header ({type(e).__name__})"
    if not isinstance(header, dict):
        return None, "header is not a JSON object"
    data = size - 8 - n
    for name, t in header.items():
        if name == "__metadata__":
            continue
        ok = (isinstance(t, dict) and t.get("dtype") in _ITEMSIZE
              and isinstance(t.get("shape"), list) and isinstance(t.get("data_offsets"), list)
              and all(isinstance(d, int) and d >= 0 for d in t["shape"])
              and len(t["data_offsets"]) == 2
              and all(isinstance(o, int) for o in t["data_offsets"]))
        if not ok:
            return None, f"tensor {name!r}: malformed header entry"
        begin, end = t["data_offsets"]
        if not 0 <= begin <= end <= data:
            return None, f"tensor {name!r}: offsets {begin}..{end} outside the {data} data bytes"
        if end - begin != math.prod(t["shape"]) * _ITEMSIZE[t["dtype"]]:
            return None, f"tensor {name!r}: offsets do not match its shape and dtype"
    return header, ""


def header_meta(path: Path, header: Header) -> dict[str, Any] | None:
    """Our metadata from a safetensors header (None if the file is not ours), type-checked."""
    raw = header.get("__metadata__")
    if raw is None:
        return None
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise CheckpointError(f"{path}: safetensors __metadata__ must be an object of strings, "
                              f"found {str(raw)[:80]!r}")
    if "arch" not in raw and "zoo_format" not in raw:
        return None
    meta: dict[str, Any] = {"format_version": raw.get("format_version", str(FORMAT_VERSION)),
                            "format": raw.get("zoo_format"), "dtype": raw.get("dtype"),
                            "kind": raw.get("kind", "model")}
    meta["config"] = (loads_json(raw["config"], path, "metadata field 'config'")
                      if "config" in raw else {"arch": raw["arch"]})
    meta["optimizer"] = (loads_json(raw["optimizer"], path, "metadata field 'optimizer'")
                         if raw.get("optimizer") else None)
    step = raw.get("step")
    if step in (None, "", "null"):
        meta["step"] = None
    elif step.isdigit() and len(step) < 20:
        meta["step"] = int(step)
    else:
        raise CheckpointError(f"{path}: metadata field 'step': expected a non-negative "
                              f"integer, found {step[:40]!r}")
    return check_meta(meta, path)


def _probed(probe: Probe) -> tuple[Header | None, str, dict[str, Any] | None]:
    """(header, why not safetensors, our metadata) of a probed file, computed once."""
    def compute(path: Path) -> tuple[Header | None, str, dict[str, Any] | None]:
        header, why_not = read_header(path)
        return header, why_not, None if header is None else header_meta(path, header)
    return probe.fact("safetensors", compute)


def _split_opt(arrays: dict[str, np.ndarray], layout: Any
               ) -> tuple[dict[str, np.ndarray], CanonicalOptState | None]:
    state = {k: v for k, v in arrays.items() if not k.startswith(OPT_PREFIX)}
    opt = {k[len(OPT_PREFIX):]: v for k, v in arrays.items() if k.startswith(OPT_PREFIX)}
    if layout is None:
        state.update({OPT_PREFIX + k: v for k, v in opt.items()})  # reported as unexpected
        return state, None
    return state, CanonicalOptState(layout, opt)


class Safetensors(CheckpointFormat):
    """A safetensors file: canonical names and layouts, optimizer arrays under ``optimizer/``,
    the rest in the header's string metadata."""

    suffixes: ClassVar[tuple[str, ...]] = (".safetensors",)
    priority: ClassVar[int] = 1

    def rejection(self, probe: Probe) -> str:
        return f"not safetensors ({_probed(probe)[1]})"

    def damaged(self, probe: Probe) -> str:
        return (f"{probe.path}: not a valid safetensors file ({_probed(probe)[1]}): truncated "
                "or corrupted")

    def read(self, path: Path, det: Detection, given: Config | None,
             progress: ProgressFn | None) -> Checkpoint:
        header, why_not = read_header(path)
        if header is None:
            raise CheckpointError(f"{path}: cannot read the safetensors file ({why_not}): "
                                  "truncated or corrupted")
        return self.assemble(path, det, given, mapped_tensors(path, header))

    def assemble(self, path: Path, det: Detection, given: Config | None,
                 arrays: dict[str, np.ndarray]) -> Checkpoint:
        """The checkpoint of the (mapped) `arrays` read at `path`."""
        meta = det.meta or {}
        state, opt = _split_opt(arrays, meta.get("optimizer"))
        config = resolve_config(path, det.meta, given, list(state))
        ck = Checkpoint(config, state, opt, meta.get("step"))
        ck.state = ordered_state(ck)  # safetensors stores its keys sorted by name
        return ck

    def read_tree(self, path: Path, weights: str | None = None) -> ForeignTree:
        self.one_set(path, weights)
        header, why_not = read_header(path)
        if header is None:
            raise CheckpointError(f"{path}: cannot read the safetensors file ({why_not}): "
                                  "truncated or corrupted")
        tree = mapped_tensors(path, header)
        return ForeignTree(tree, "torch", False)  # stored sorted by name: no definition order

    def save_plain(self, res_state: Mapping[str, Any], model: Any, data: Path) -> None:
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in res_state.items()}, str(data))

    def write(self, ck: Checkpoint, data: Path) -> None:
        self.write_counted(ck, data, lambda n: None)

    def write_counted(self, ck: Checkpoint, data: Path, advance: Callable[[int], None]) -> None:
        write_stream(data, self.arrays(ck), self.header_metadata(ck), advance)

    @staticmethod
    def arrays(ck: Checkpoint) -> dict[str, np.ndarray]:
        """What the file stores, in order: the model in canonical order, then the optimizer."""
        arrays = dict(ordered_state(ck))
        if ck.optimizer is not None:
            arrays.update({OPT_PREFIX + k: v for k, v in ck.optimizer.arrays.items()})
        return arrays

    def header_metadata(self, ck: Checkpoint) -> dict[str, str]:
        meta = {"format": "pt", "zoo_format": self.name, "format_version": str(FORMAT_VERSION),
                "arch": ck.config.arch, "config": ck.config.to_json(),
                "dtype": np.dtype(ck.dtype).name, "kind": "training" if ck.training else "model"}
        if ck.step is not None:
            meta["step"] = str(int(ck.step))
        if ck.optimizer is not None:
            meta["optimizer"] = json.dumps(ck.optimizer.layout)
        return meta

    def entries(self, path: Path, det: Detection, ck: Checkpoint | None) -> list[Entry]:
        from safetensors import safe_open

        try:
            with safe_open(str(path), "np") as f:
                out = []
                for k in f.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                    s = f.get_slice(k)
                    d = s.get_dtype()
                    out.append((k, tuple(s.get_shape()), DTYPES.get(d, d.lower())))
                return out
        except Exception as e:
            raise CheckpointError(f"{path}: cannot read the safetensors file ({first_line(e)})"
                                  ) from e


class CanonicalSafetensors(Safetensors):
    """``canonical``: safetensors whose metadata says ``zoo_format: canonical``."""

    name: ClassVar[str] = "canonical"

    def detect(self, probe: Probe) -> Detection | None:
        header, _, meta = _probed(probe)
        if header is None or meta is None or meta.get("format") != "canonical":
            return None
        return self.detection("safetensors with zoo metadata format 'canonical'", meta)


class TorchSafetensors(Safetensors):
    """``torch`` as ``.safetensors``: any other safetensors file is a PyTorch state_dict."""

    name: ClassVar[str] = "torch"
    variant: ClassVar[str] = "safetensors"

    def detect(self, probe: Probe) -> Detection | None:
        header, _, meta = _probed(probe)
        if header is None or (meta is not None and meta.get("format") == "canonical"):
            return None
        return self.detection("safetensors without canonical metadata: a PyTorch state_dict",
                              meta)
