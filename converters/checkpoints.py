"""Checkpoint files of Equinox, Flax Linen, Flax NNX and PyTorch, converted through the canonical
layout (PyTorch ``state_dict`` names and layouts). See docs/checkpoints.md.

    ckpt = converters.load("run/model.eqx")                 # a Checkpoint (canonical arrays)
    model = converters.load("run/model.eqx", "nnx")         # a native NNX model
    converters.save(model, "model.safetensors", "canonical")
    converters.convert_file("model.pt", "model_nnx", to="nnx", config=cfg)

Formats (each the library's own way of saving):

- ``eqx``: an ``eqx.tree_serialise_leaves`` file plus a JSON sidecar ``<file>.json``;
- ``linen``: an orbax-checkpoint directory of the variables (plus ``zoo.json`` inside);
- ``nnx``: an orbax-checkpoint directory of ``nnx.state(model)`` (plus ``zoo.json`` inside);
- ``canonical``: safetensors, PyTorch names and layouts, metadata with architecture and config;
- ``torch``: a ``state_dict`` as ``.pt`` (read only with ``weights_only=True``) or ``.safetensors``.

Nothing read is ever executed: no pickle except PyTorch's ``weights_only`` loader, ``.npy``
records with ``allow_pickle=False``, JSON for metadata. Output is atomic: written next to the
destination under a temporary name and renamed at the end.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pickle
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from converters.ckpt_io import (
    DIR_METADATA,
    NPY_MAGIC,
    SIDECAR_MARKER,
    CheckpointError,
    ProgressFn,
    atomic_outputs,
    file_size,
    load_npy,
    no_progress,
    read_json_meta,
    scan_npy_stream,
    sidecar_path,
)
from converters.core import (
    ConversionError,
    as_numpy_state,
    canonical_spec,
    config_of,
    from_canonical,
    to_canonical,
    validate,
)
from converters.optim import (
    CanonicalOptState,
    abstract_params,
    build,
    canonical_from_native,
    opt_state_like,
    param_keys,
    to_canonical_opt,
    to_native_opt,
    validate_opt,
)
from zoo.configs import CONFIGS, Config, ConfigError, config_from_dict
from zoo.interface import interface
from zoo.registry import ARCHS, make_config, skeleton

__all__ = [
    "FORMATS", "FORMAT_VERSION", "Checkpoint", "CheckpointError", "Detection", "Report",
    "convert_file", "detect", "detect_impl", "inspect_checkpoint", "load", "load_canonical",
    "parse_config", "read", "save", "save_canonical", "write",
]

FORMATS: tuple[str, ...] = ("eqx", "linen", "nnx", "canonical", "torch")
FORMAT_VERSION = 1
OPT_PREFIX = "optimizer/"
ORBAX_MARKERS = ("_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt", "checkpoint")
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
                       "U8": "uint8", "BOOL": "bool"}


@dataclass
class Detection:
    """What a path holds: `fmt` (one of FORMATS), why we think so, and our metadata if any."""

    fmt: str
    reason: str
    meta: dict[str, Any] | None = None
    variant: str = ""  # torch: "pt" or "safetensors"


@dataclass
class Checkpoint:
    """A checkpoint in the canonical layout: everything every format can be written from.

    `state` is the canonical model state (numpy arrays, dtypes as stored); `optimizer` the
    canonical optimizer state (see `converters.optim`) and `step` the training step, both None
    for a model-only checkpoint.
    """

    config: Config
    state: dict[str, np.ndarray]
    optimizer: CanonicalOptState | None = None
    step: int | None = None
    source: Detection | None = field(default=None, compare=False)
    _validated: tuple[Any, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def training(self) -> bool:
        return self.optimizer is not None or self.step is not None

    @property
    def dtype(self) -> np.dtype:
        return self.validate()

    def validate(self) -> np.dtype:
        """Check every key, shape and dtype (model and optimizer); ConversionError otherwise."""
        stamp = self._stamp()
        if self._validated is not None and self._validated[0] == stamp:
            return self._validated[1]  # nothing that validation looks at has changed
        dtype = validate(self.state, self.config)
        if self.optimizer is not None:
            validate_opt(self.optimizer, self.config, OPT_PREFIX)
        self._validated = (stamp, dtype)
        return dtype

    def _stamp(self) -> tuple[Any, ...]:
        arrays = dict(self.state)
        if self.optimizer is not None:
            arrays.update({OPT_PREFIX + k: v for k, v in self.optimizer.arrays.items()})
        opt_layout = None if self.optimizer is None else json.dumps(self.optimizer.layout)
        return (self.config, opt_layout, tuple(
            (k, type(v), tuple(np.shape(v)), str(getattr(v, "dtype", ""))) for k, v in
            arrays.items()))

    def model_only(self) -> Checkpoint:
        return dataclasses.replace(self, optimizer=None, step=None)

    def model(self, impl: str) -> Any:
        """The native model of `impl` ("canonical" gives the state dict itself)."""
        if impl == "canonical":
            return dict(self.state)
        return from_canonical(self.state, self.config, impl)

    def opt_state(self, impl: str, optimizer: Any = None, *, template: Any = None) -> Any:
        """The optimizer state for `impl`.

        With an optax `optimizer` (or a `template` state such as ``tx.init(params)``) the result
        has exactly the optimizer's structure, ready for ``optimizer.update``; without, it is
        built from plain lists and dicts (the structure orbax stores).
        """
        if self.optimizer is None:
            raise CheckpointError("this checkpoint holds no optimizer state")
        if optimizer is not None:
            params = interface(impl).split(self.model(impl))[1]
            template = jax.eval_shape(optimizer.init, params)
        if template is None:
            return to_native_opt(self.optimizer, self.state, self.config, impl)
        return opt_state_like(self.optimizer, self.state, self.config, impl, template)


# --------------------------------------------------------------------------- helpers
class _Task:
    def __init__(self, progress: ProgressFn | None, description: str, total: int | None):
        self.progress, self.description, self.total, self.done = (
            progress or no_progress, description, total, 0)
        self.progress(description, 0, total)

    def advance(self, n: int = 1) -> None:
        self.done += n
        self.progress(self.description, self.done, self.total)


def parse_config(arch: str | None = None, config: Any = None) -> Config | None:
    """A config from `--arch` and/or `--config` (a Config, a dict, a JSON string or file)."""
    if arch is None and config is None:
        return None
    if isinstance(config, Config):
        if arch is not None and arch != config.arch:
            raise ConfigError(f"--arch {arch!r} contradicts the config's arch {config.arch!r}")
        return config
    data: dict[str, Any] = {}
    if isinstance(config, Mapping):
        data = dict(config)
    elif config is not None:
        text = str(config)
        if not text.lstrip().startswith("{"):
            p = Path(text)
            if not p.is_file():
                raise ConfigError(f"--config {text!r}: neither a JSON object nor a file")
            text = p.read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--config is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"--config must be a JSON object, found {type(data).__name__}")
    if arch is not None:
        if data.get("arch", arch) != arch:
            raise ConfigError(f"--arch {arch!r} contradicts the config's arch {data['arch']!r}")
        data["arch"] = arch
    if "arch" not in data:
        raise ConfigError(f"the config names no architecture: pass --arch (one of {list(ARCHS)})")
    return config_from_dict(data)


def _guess_arch(keys: list[str]) -> str:
    """A hint naming the architectures whose canonical keys equal `keys`."""
    hits = [a for a in ARCHS if set(canonical_spec(CONFIGS[a]())) == set(keys)]
    return f" (its keys are those of {' or '.join(map(repr, hits))})" if hits else ""


def _resolve_config(path: Path, meta: dict[str, Any] | None, given: Config | None,
                    keys: list[str] | None = None) -> Config:
    stored = None
    if meta and meta.get("config") is not None:
        try:
            stored = config_from_dict(meta["config"])
        except (ConfigError, TypeError) as e:
            raise CheckpointError(f"{path}: the stored config is invalid: {e}") from e
    if stored is not None and given is not None and stored != given:
        raise CheckpointError(
            f"{path} says it holds {stored.arch} {stored.to_json()}, but --arch/--config gave "
            f"{given.arch} {given.to_json()}; drop --arch/--config to use the stored one")
    config = stored or given
    if config is None:
        hint = _guess_arch(keys) if keys else ""
        raise CheckpointError(
            f"{path} carries no architecture or config{hint}: pass --arch (and --config if it "
            "is not the default)")
    return config


def _np_state(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in as_numpy_state(state).items()}


def _nbt(state: Mapping[str, Any]) -> dict[str, int]:
    return {k: int(np.asarray(v)) for k, v in state.items() if k.endswith("num_batches_tracked")}


def _restore_nbt(state: dict[str, np.ndarray], meta: dict[str, Any] | None) -> None:
    for k, v in ((meta or {}).get("num_batches_tracked") or {}).items():
        if k in state:
            state[k] = np.asarray(int(v), np.int64)


def _meta(ck: Checkpoint, fmt: str, dtype: np.dtype) -> dict[str, Any]:
    meta: dict[str, Any] = {
        SIDECAR_MARKER: FORMAT_VERSION, "format": fmt, "arch": ck.config.arch,
        "config": ck.config.to_dict(), "dtype": np.dtype(dtype).name,
        "kind": "training" if ck.training else "model", "step": ck.step,
        "optimizer": ck.optimizer.layout if ck.optimizer is not None else None,
    }
    if fmt in ("eqx", "linen", "nnx"):  # these libraries keep no BatchNorm batch counter
        meta["num_batches_tracked"] = _nbt(ck.state)
    return meta


def _check_version(path: Path, meta: dict[str, Any] | None) -> None:
    if meta is None:
        return
    version = meta.get(SIDECAR_MARKER, meta.get("format_version"))
    try:
        newer = int(version) > FORMAT_VERSION
    except (TypeError, ValueError):
        newer = True
    if newer:
        raise CheckpointError(f"{path}: checkpoint format version {version!r} is not supported "
                              f"(this version reads {FORMAT_VERSION})")


def _dtype_of(meta: dict[str, Any] | None) -> np.dtype | None:
    import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)

    name = (meta or {}).get("dtype")
    return None if name is None else np.dtype(jnp.dtype(name))


def _most_common(dtypes: list[np.dtype]) -> np.dtype:
    return Counter(dtypes).most_common(1)[0][0] if dtypes else np.dtype("float32")


# --------------------------------------------------------------------------- detection
def _safetensors_meta(path: Path, size: int) -> tuple[dict[str, str] | None, str]:
    """The safetensors header metadata, or None and why this is not a safetensors file."""
    if size < 10:
        return None, f"only {size} bytes"
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            return None, f"header length {n} exceeds the file size {size}"
        header = f.read(n)
    if not header.startswith(b"{"):
        return None, "no JSON header"
    try:
        data = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return None, f"corrupted JSON header ({e})"
    if not isinstance(data, dict):
        return None, "header is not a JSON object"
    meta = data.get("__metadata__") or {}
    return {str(k): str(v) for k, v in meta.items()}, ""


def _normalise_safetensors_meta(raw: dict[str, str]) -> dict[str, Any] | None:
    if "arch" not in raw and "zoo_format" not in raw:
        return None
    meta: dict[str, Any] = {"format_version": raw.get("format_version", FORMAT_VERSION),
                            "format": raw.get("zoo_format"), "dtype": raw.get("dtype")}
    try:
        meta["config"] = json.loads(raw["config"]) if "config" in raw else {"arch": raw["arch"]}
        meta["optimizer"] = json.loads(raw["optimizer"]) if raw.get("optimizer") else None
        meta["step"] = int(raw["step"]) if raw.get("step") not in (None, "", "null") else None
    except (json.JSONDecodeError, ValueError) as e:
        raise CheckpointError(f"corrupted checkpoint metadata in the safetensors header: {e}"
                              ) from e
    meta["kind"] = raw.get("kind", "model")
    return meta


def _orbax_tree(path: Path) -> dict[str, Any]:
    """The stored tree of an orbax checkpoint directory: {dotted name: metadata}."""
    import orbax.checkpoint as ocp

    try:
        with ocp.StandardCheckpointer() as ckptr:
            md = ckptr.metadata(path.absolute())
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read the orbax checkpoint metadata "
                              f"({type(e).__name__}: {_first_line(e)}): damaged?") from e
    tree = getattr(md, "item_metadata", md)
    tree = getattr(tree, "tree", tree)
    flat: dict[str, Any] = {}

    def visit(node: Any, name: str) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                visit(v, f"{name}.{k}" if name else str(k))
        elif isinstance(node, list | tuple):
            for i, v in enumerate(node):
                visit(v, f"{name}.{i}" if name else str(i))
        elif node is not None:
            flat[name] = node

    visit(tree, "")
    if not flat:
        raise CheckpointError(f"{path}: the orbax checkpoint holds no arrays")
    return flat


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def detect(path: str | os.PathLike) -> Detection:
    """The format of a checkpoint path, and why; CheckpointError if it is none we know."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    if path.is_dir():
        return _detect_dir(path)
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(f"{path}: empty file (0 bytes), not a checkpoint")
    with open(path, "rb") as f:
        head = f.read(16)
    side = read_json_meta(sidecar_path(path))
    if head.startswith(NPY_MAGIC):
        why = "starts with the .npy magic: an Equinox tree_serialise_leaves file"
        return Detection("eqx", why + (f", sidecar {sidecar_path(path).name}" if side else ""),
                         side)
    if head.startswith(b"PK\x03\x04"):
        return Detection("torch", "zip archive: a torch.save file", side, "pt")
    if head[:1] == b"\x80":
        return Detection("torch", "pickle stream: a legacy torch.save file", side, "pt")
    raw, why_not = _safetensors_meta(path, size)
    if raw is not None:
        meta = _normalise_safetensors_meta(raw)
        if meta is not None and meta.get("format") == "canonical":
            return Detection("canonical", "safetensors with zoo metadata format 'canonical'",
                             meta, "safetensors")
        return Detection("torch", "safetensors without canonical metadata: a PyTorch state_dict",
                         meta, "safetensors")
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        raise CheckpointError(f"{path}: not a valid safetensors file ({why_not}): truncated or "
                              "corrupted")
    if suffix in (".pt", ".pth", ".bin"):
        raise CheckpointError(f"{path}: not a torch.save file (neither a zip archive nor a "
                              "pickle stream): corrupted")
    if suffix == ".eqx":
        raise CheckpointError(f"{path}: not an Equinox leaf file (no .npy magic): corrupted")
    raise CheckpointError(
        f"cannot detect the format of {path}: not safetensors ({why_not}), not a torch.save zip "
        f"or pickle, not an Equinox .npy stream, not an orbax directory (first bytes {head[:8]!r})")


def _detect_dir(path: Path) -> Detection:
    meta = read_json_meta(path / DIR_METADATA)
    if not any((path / m).exists() for m in ORBAX_MARKERS):
        inner = sorted(str(p.parent.relative_to(path)) for m in ORBAX_MARKERS
                       for p in path.glob(f"*/{m}"))
        hint = (f"; it contains checkpoints, e.g. {path / inner[0]}: pass one of them"
                if inner else "")
        raise CheckpointError(
            f"{path} is a directory but not an orbax checkpoint (none of "
            f"{', '.join(ORBAX_MARKERS)} in it){hint}")
    if meta is not None and meta.get("format") in ("linen", "nnx"):
        return Detection(meta["format"], f"orbax checkpoint directory with {DIR_METADATA} "
                         f"saying format {meta['format']!r}", meta)
    names = list(_orbax_tree(path))
    top = sorted({n.split(".")[0] for n in names})
    if "params" in top:
        return Detection("linen", "orbax checkpoint directory with a top-level 'params' "
                         "collection: Linen variables", meta)
    if any(n.endswith(".value") for n in names):
        return Detection("nnx", "orbax checkpoint directory whose leaves are NNX Variable "
                         "'.value' entries: an nnx.state", meta)
    return Detection("nnx", f"orbax checkpoint directory without a 'params' collection (top-level "
                     f"keys {top[:6]}): taken as an NNX state", meta)


# --------------------------------------------------------------------------- readers
def read(path: str | os.PathLike, *, arch: str | None = None, config: Any = None,
         model_only: bool = False, progress: ProgressFn | None = None) -> Checkpoint:
    """Read any supported checkpoint into a validated canonical `Checkpoint`.

    `arch` / `config` are needed only when the file does not carry them (e.g. a bare
    ``torch.save(model.state_dict())``); if both exist they must agree.
    """
    path = Path(path)
    det = detect(path)
    _check_version(path, det.meta)
    given = parse_config(arch, config)
    reader = {"eqx": _read_eqx, "linen": _read_orbax, "nnx": _read_orbax,
              "canonical": _read_safetensors, "torch": _read_torch}[det.fmt]
    ck = reader(path, det, given, progress)
    if model_only:
        ck = ck.model_only()
    ck.source = det
    try:
        ck.validate()
    except ConversionError as e:
        raise ConversionError(f"{path}: {e}") from e
    return ck


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
    return Checkpoint(config, state, opt, meta.get("step"))


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise CheckpointError("reading or writing .pt files needs PyTorch: "
                              "pip install 'jax-model-zoo[torch]'") from e
    return torch


def _load_pt(path: Path) -> dict[str, Any]:
    torch = _import_torch()
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


def _eqx_leaves(like: Any) -> list[tuple[str, Any]]:
    """(name, leaf) of every leaf that `eqx.tree_serialise_leaves` writes, in file order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(like)
    return [(jax.tree_util.keystr(p), x) for p, x in flat
            if isinstance(x, jax.ShapeDtypeStruct | jax.Array | np.ndarray)
            or eqx.is_array_like(x)]


def _with_dtype(tree: Any, dtype: Any) -> Any:
    """Every floating abstract leaf in `dtype`: the canonical layout holds one floating dtype
    (Linen, for one, keeps float32 batch statistics next to bfloat16 parameters)."""
    dtype = jnp.dtype(dtype)
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, dtype) if isinstance(x, jax.ShapeDtypeStruct)
        and jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _eqx_like(config: Config, dtype: Any, meta: dict[str, Any] | None) -> Any:
    model = _with_dtype(skeleton(config, "eqx", dtype), dtype)
    if not meta or meta.get("kind") != "training":
        return model
    layout, step = meta.get("optimizer"), meta.get("step")
    opt = None
    if layout is not None:
        mirror = abstract_params(model, "eqx")
        opt = build(layout, lambda p, m: mirror if m["__leaf__"] == "params" else
                    jax.ShapeDtypeStruct(tuple(m["shape"]), jnp.dtype(m["dtype"])), ordered=True)
    return (model, opt, None if step is None else 0)


def _eqx_problems(headers: list, leaves: list[tuple[str, Any]]) -> list[str]:
    problems = []
    if len(headers) != len(leaves):
        problems.append(f"the file holds {len(headers)} arrays, the model expects {len(leaves)}")
    for i, ((name, like), (shape, dtype)) in enumerate(zip(leaves, headers, strict=False)):
        if isinstance(like, jax.ShapeDtypeStruct | jax.Array | np.ndarray):
            want = (tuple(like.shape), np.dtype(like.dtype))
            if want != (shape, np.dtype(dtype)):
                problems.append(f"array #{i} {name}: expected shape {want[0]} {want[1]}, found "
                                f"{shape} {dtype}")
        elif shape != ():
            problems.append(f"array #{i} {name}: expected a scalar, found shape {shape}")
    return problems


def _read_eqx(path: Path, det: Detection, given: Config | None,
              progress: ProgressFn | None) -> Checkpoint:
    config = _resolve_config(path, det.meta, given)
    size = path.stat().st_size
    with open(path, "rb") as f:
        headers = scan_npy_stream(f, size, str(path))
    dtype = _dtype_of(det.meta)
    if dtype is None:  # no sidecar: the most common float dtype at floating-parameter positions
        leaves = _eqx_leaves(_eqx_like(config, "float32", det.meta))
        dtype = _most_common([
            np.dtype(d) for (_, like), (_, d) in zip(leaves, headers, strict=False)
            if isinstance(like, jax.ShapeDtypeStruct) and jnp.issubdtype(like.dtype, jnp.floating)
            and jnp.issubdtype(np.dtype(d), jnp.floating)])
    like = _eqx_like(config, dtype, det.meta)
    leaves = _eqx_leaves(like)
    problems = _eqx_problems(headers, leaves)
    if problems:
        hint = ("\n(is this an Equinox checkpoint of this architecture and config?)"
                if len(headers) != len(leaves) else "")
        raise ConversionError(f"{path} does not fit {config.arch} {config.to_json()}: "
                              f"{len(problems)} problem(s):\n  - " + "\n  - ".join(problems[:50])
                              + hint)
    task = _Task(progress, "reading", len(leaves))

    def spec(f: Any, x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct | jax.Array):
            a = jnp.asarray(load_npy(f))
        elif isinstance(x, np.ndarray):
            a = load_npy(f)
        elif eqx.is_array_like(x):
            a = type(x)(load_npy(f).item())
        else:
            return x
        task.advance()
        return a

    try:
        with open(path, "rb") as f:
            out = eqx.tree_deserialise_leaves(f, like, filter_spec=spec)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read the Equinox file ({_first_line(e)}): "
                              "truncated or corrupted") from e
    if det.meta and det.meta.get("kind") == "training":
        model, opt_tree, step = out
    else:
        model, opt_tree, step = out, None, None
    state = _np_state(to_canonical(model, "eqx"))
    _restore_nbt(state, det.meta)
    opt = None
    if opt_tree is not None:
        opt = canonical_from_native(det.meta["optimizer"], opt_tree, model, "eqx", ordered=True)
    return Checkpoint(config, state, opt, None if step is None else int(step))


def _flat_abstract(tree: Any) -> dict[str, Any]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    name = lambda p: ".".join(str(getattr(k, a)) for k in p for a in ("name", "key", "idx")
                              if hasattr(k, a))
    return {name(p): x for p, x in flat}


def _orbax_problems(stored: dict[str, Any], target: dict[str, Any]) -> list[str]:
    problems = [f"missing key {k!r} (expected shape {tuple(np.shape(v))})"
                for k, v in target.items() if k not in stored]
    problems += [f"unexpected key {k!r} (shape {tuple(getattr(v, 'shape', ()) or ())})"
                 for k, v in stored.items() if k not in target]
    for k in stored.keys() & target.keys():
        got, want = stored[k], target[k]
        if not isinstance(want, jax.ShapeDtypeStruct):
            continue  # a Python scalar such as the step
        gshape = tuple(getattr(got, "shape", ()) or ())
        gdtype = getattr(got, "dtype", None)
        if gshape != tuple(want.shape):
            problems.append(f"{k!r}: expected shape {tuple(want.shape)}, found {gshape}")
        elif gdtype is not None and np.dtype(gdtype) != np.dtype(want.dtype):
            problems.append(f"{k!r}: expected dtype {np.dtype(want.dtype)}, found {gdtype}")
    return sorted(problems)


def _orbax_target(fmt: str, config: Config, dtype: Any, meta: dict[str, Any] | None,
                  pure_nnx: bool = False) -> tuple[Any, Any]:
    """(skeleton, abstract restore target) of a Linen / NNX checkpoint we would write."""
    skel = _with_dtype(skeleton(config, fmt, dtype), dtype)
    if fmt == "linen":
        model_target: Any = dict(skel[1])
    else:
        from flax import nnx

        model_target = nnx.split(skel)[1]
        if pure_nnx:
            model_target = nnx.to_pure_dict(model_target)
    if not meta or meta.get("kind") != "training":
        return skel, model_target
    layout, step = meta.get("optimizer"), meta.get("step")
    target = dict(model_target) if fmt == "linen" else {"model": model_target}
    if layout is not None:
        mirror = abstract_params(skel, fmt)
        target["opt_state"] = build(
            layout, lambda p, m: mirror if m["__leaf__"] == "params" else
            jax.ShapeDtypeStruct(tuple(m["shape"]), jnp.dtype(m["dtype"])), ordered=False)
    if step is not None:
        target["step"] = 0
    return skel, target


def _read_orbax(path: Path, det: Detection, given: Config | None,
                progress: ProgressFn | None) -> Checkpoint:
    import orbax.checkpoint as ocp

    fmt, meta = det.fmt, det.meta
    config = _resolve_config(path, meta, given)
    stored = _orbax_tree(path)
    pure = fmt == "nnx" and not any(k.endswith(".value") for k in stored)
    dtype = _dtype_of(meta)
    if dtype is None:
        skel, target = _orbax_target(fmt, config, "float32", meta, pure)
        floats = [np.dtype(stored[k].dtype) for k, v in _flat_abstract(target).items()
                  if k in stored and isinstance(v, jax.ShapeDtypeStruct)
                  and jnp.issubdtype(v.dtype, jnp.floating) and getattr(stored[k], "dtype", None)
                  is not None and jnp.issubdtype(np.dtype(stored[k].dtype), jnp.floating)]
        dtype = _most_common(floats)
    skel, target = _orbax_target(fmt, config, dtype, meta, pure)
    problems = _orbax_problems(stored, _flat_abstract(target))
    if problems:
        missing = sum(p.startswith("missing") for p in problems)
        hint = ("\n(most keys do not match: is this a "
                f"{'Linen' if fmt == 'linen' else 'NNX'} {config.arch} checkpoint with this "
                "config?)" if missing > len(_flat_abstract(target)) // 2 else "")
        raise ConversionError(f"{path} does not fit {config.arch} {config.to_json()}: "
                              f"{len(problems)} problem(s):\n  - " + "\n  - ".join(problems[:50])
                              + hint)
    task = _Task(progress, "reading", 1)
    try:
        with ocp.StandardCheckpointer() as ckptr:
            restored = ckptr.restore(path.absolute(), target)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot restore the orbax checkpoint "
                              f"({type(e).__name__}: {_first_line(e)}): damaged?") from e
    task.advance()
    training = bool(meta and meta.get("kind") == "training")
    if fmt == "linen":
        model_part = {k: v for k, v in restored.items() if k not in ("opt_state", "step")}
        model: Any = (skel[0], model_part)
    else:
        from flax import nnx

        model_part = restored["model"] if training else restored
        graphdef, abstract_state = nnx.split(skel)
        if pure:
            nnx.replace_by_pure_dict(abstract_state, model_part)
            model_part = abstract_state
        model = nnx.merge(graphdef, model_part)
    state = _np_state(to_canonical(model, fmt))
    _restore_nbt(state, meta)
    opt = step = None
    if training:
        if meta.get("optimizer") is not None:
            opt = canonical_from_native(meta["optimizer"], restored["opt_state"], model, fmt,
                                        ordered=False)
        step = int(restored["step"]) if "step" in restored else None
    return Checkpoint(config, state, opt, step)


# --------------------------------------------------------------------------- writers
def _outputs(path: Path, fmt: str) -> tuple[Path, ...]:
    """Extra files written next to `path` (sidecars)."""
    if fmt == "eqx" or (fmt == "torch" and path.suffix.lower() != ".safetensors"):
        return (sidecar_path(path),)
    return ()


def write(ck: Checkpoint, path: str | os.PathLike, fmt: str, *, force: bool = False,
          progress: ProgressFn | None = None) -> Path:
    """Write a canonical checkpoint in format `fmt`, validated first, atomically."""
    if fmt not in FORMATS:
        raise CheckpointError(f"unknown format {fmt!r}; formats: {list(FORMATS)}")
    path = Path(path)
    dtype = ck.validate()
    if fmt == "torch" and ck.training:
        raise CheckpointError(
            "the torch format holds a model state_dict only, but this checkpoint has optimizer "
            "state / a step: pass --model-only (model_only=True) to drop them, or use another "
            "format")
    side = _outputs(path, fmt)
    writer = {"eqx": _write_eqx, "linen": _write_orbax, "nnx": _write_orbax,
              "canonical": _write_safetensors, "torch": _write_torch}[fmt]
    with atomic_outputs(path, side, force) as outs:
        task = _Task(progress, "writing", 2)
        native = _native(ck, fmt)
        task.advance()
        writer(ck, fmt, dtype, native, outs[path], [outs[s] for s in side])
        task.advance()
    return path


def _native(ck: Checkpoint, fmt: str) -> tuple[Any, Any]:
    """(native model, native optimizer state or None) for the JAX formats."""
    if fmt not in ("eqx", "linen", "nnx"):
        return None, None
    model = from_canonical(ck.state, ck.config, fmt)
    opt = None
    if ck.optimizer is not None:
        opt = to_native_opt(ck.optimizer, ck.state, ck.config, fmt, ordered=fmt == "eqx")
    return model, opt


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")


def _write_eqx(ck: Checkpoint, fmt: str, dtype: np.dtype, native: tuple[Any, Any], tmp: Path,
               side: list[Path]) -> None:
    model, opt = native
    tree = (model, opt, ck.step) if ck.training else model
    with open(tmp, "wb") as f:  # a handle: given a path, Equinox would force a .eqx suffix
        eqx.tree_serialise_leaves(f, tree)
    _write_json(side[0], _meta(ck, fmt, dtype))


def _write_orbax(ck: Checkpoint, fmt: str, dtype: np.dtype, native: tuple[Any, Any], tmp: Path,
                 side: list[Path]) -> None:
    import orbax.checkpoint as ocp

    model, opt = native
    if fmt == "linen":
        tree: dict[str, Any] = dict(model[1])
    else:
        from flax import nnx

        tree = nnx.state(model)
        if ck.training:
            tree = {"model": tree}
    if ck.training:
        if opt is not None:
            tree["opt_state"] = opt
        if ck.step is not None:
            tree["step"] = int(ck.step)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(tmp.absolute(), tree)
        ckptr.wait_until_finished()
    _write_json(tmp / DIR_METADATA, _meta(ck, fmt, dtype))


@functools.lru_cache(maxsize=64)
def _key_order(config: Config) -> dict[str, int]:
    return {k: i for i, k in enumerate(canonical_spec(config))}


def _ordered_state(ck: Checkpoint) -> dict[str, np.ndarray]:
    order = _key_order(ck.config)
    return {k: ck.state[k] for k in sorted(ck.state, key=lambda k: order.get(k, 1 << 30))}


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
                       side: list[Path]) -> None:
    from safetensors.numpy import save_file

    arrays = dict(_ordered_state(ck))
    if ck.optimizer is not None:
        arrays.update({OPT_PREFIX + k: v for k, v in ck.optimizer.arrays.items()})
    arrays = {k: np.asarray(v, order="C") for k, v in arrays.items()}  # keeps 0-d
    save_file(arrays, str(tmp), metadata=_safetensors_metadata(ck, fmt, dtype))


def _write_torch(ck: Checkpoint, fmt: str, dtype: np.dtype, native: Any, tmp: Path,
                 side: list[Path]) -> None:
    if not side:  # .safetensors: a PyTorch state_dict with the same metadata as canonical
        _write_safetensors(ck, fmt, dtype, native, tmp, side)
        return
    from collections import OrderedDict

    from converters.trees import numpy_to_torch

    torch = _import_torch()
    state = OrderedDict((k, numpy_to_torch(v)) for k, v in _ordered_state(ck).items())
    torch.save(state, tmp)
    meta = _meta(ck, fmt, dtype)
    _write_json(side[0], meta)


# --------------------------------------------------------------------------- public API
def detect_impl(obj: Any) -> str:
    """Which library a native model object belongs to."""
    import flax.linen as nn
    from flax import nnx

    if isinstance(obj, nnx.Module):
        return "nnx"
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], nn.Module):
        return "linen"
    if isinstance(obj, eqx.Module) or (isinstance(obj, tuple) and obj
                                       and isinstance(obj[0], eqx.Module)):
        return "eqx"
    if any(c.__module__.startswith("torch.nn") for c in type(obj).__mro__):
        return "torch"
    raise CheckpointError(f"cannot tell which library a {type(obj).__name__} belongs to: pass "
                          "a native model, a canonical state dict or a Checkpoint")


def as_checkpoint(obj: Any, *, impl: str | None = None, config: Any = None,
                  opt_state: Any = None, step: int | None = None) -> Checkpoint:
    """A canonical Checkpoint from a Checkpoint, a canonical state (plus `config`) or a native
    model (plus an optax `opt_state` built for ``zoo.interface(impl).split(model)[1]``)."""
    if isinstance(obj, Checkpoint):
        if opt_state is not None or step is not None:
            obj = dataclasses.replace(obj, step=step if step is not None else obj.step)
            if opt_state is not None:
                if not isinstance(opt_state, CanonicalOptState):
                    raise CheckpointError("a Checkpoint takes a CanonicalOptState")
                obj.optimizer = opt_state
        return obj
    if isinstance(obj, Mapping):
        cfg = (make_config(config) if isinstance(config, str) and config in ARCHS
               else parse_config(None, config))
        if cfg is None:
            raise CheckpointError("saving a canonical state needs its config")
        if opt_state is not None and not isinstance(opt_state, CanonicalOptState):
            raise CheckpointError("with a canonical state, pass opt_state as a CanonicalOptState")
        return Checkpoint(cfg, _np_state(obj), opt_state, step)
    impl = impl or detect_impl(obj)
    cfg = config_of(obj, impl)
    state = _np_state(to_canonical(obj, impl))
    opt = None
    if opt_state is not None:
        opt = (opt_state if isinstance(opt_state, CanonicalOptState)
               else to_canonical_opt(opt_state, obj, impl))
    return Checkpoint(cfg, state, opt, None if step is None else int(step))


def save(obj: Any, path: str | os.PathLike, fmt: str, *, impl: str | None = None,
         config: Any = None, opt_state: Any = None, step: int | None = None,
         force: bool = False, progress: ProgressFn | None = None) -> Path:
    """Save a native model (optionally with its optax state and step), a canonical state dict
    (with `config`) or a Checkpoint as `fmt` at `path`, validated and atomically."""
    ck = as_checkpoint(obj, impl=impl, config=config, opt_state=opt_state, step=step)
    return write(ck, path, fmt, force=force, progress=progress)


def load(path: str | os.PathLike, impl: str | None = None, *, arch: str | None = None,
         config: Any = None, optimizer: Any = None, model_only: bool = False,
         progress: ProgressFn | None = None) -> Any:
    """Read a checkpoint of any format.

    - ``load(path)``: the `Checkpoint` (canonical arrays, config, optimizer state, step);
    - ``load(path, impl)``: the native model of `impl` (what ``zoo.create`` returns;
      ``impl="canonical"`` gives the state dict);
    - ``load(path, impl, optimizer=tx)``: ``(model, opt_state, step)``, `opt_state` in the
      structure of ``tx.init(zoo.interface(impl).split(model)[1])``.
    """
    ck = read(path, arch=arch, config=config, model_only=model_only, progress=progress)
    if impl is None:
        return ck
    model = ck.model(impl)
    if optimizer is None:
        return model
    return model, ck.opt_state(impl, optimizer), ck.step


def convert_file(src: str | os.PathLike, dst: str | os.PathLike, to: str, *,
                 force: bool = False, arch: str | None = None, config: Any = None,
                 model_only: bool = False, progress: ProgressFn | None = None) -> Checkpoint:
    """Convert the checkpoint at `src` into format `to` at `dst`; returns what was converted.

    The source is only read. Nothing is written unless the whole checkpoint validates, and
    `dst` appears complete or not at all.
    """
    src, dst = Path(src), Path(dst)
    if to not in FORMATS:
        raise CheckpointError(f"unknown target format {to!r}; formats: {list(FORMATS)}")
    if dst.absolute() == src.absolute() or src.absolute() in dst.absolute().parents:
        raise CheckpointError(f"refusing to write {dst} over or inside its source {src}")
    ck = read(src, arch=arch, config=config, model_only=model_only, progress=progress)
    write(ck, dst, to, force=force, progress=progress)
    return ck


def save_canonical(path: str | os.PathLike, state: Mapping[str, Any], config: Config, *,
                   force: bool = False) -> Path:
    """Write a canonical state as safetensors (PyTorch names and layouts, metadata with the
    architecture, config JSON and format version)."""
    return write(Checkpoint(make_config(config), _np_state(state)), path, "canonical",
                 force=force)


def load_canonical(path: str | os.PathLike, *, arch: str | None = None, config: Any = None
                   ) -> tuple[dict[str, np.ndarray], Config]:
    """(canonical state, config) of a checkpoint (canonical safetensors or any other format)."""
    ck = read(path, arch=arch, config=config, model_only=True)
    return ck.state, ck.config


# --------------------------------------------------------------------------- inspect
@dataclass
class Report:
    """What `inspect_checkpoint` found."""

    path: Path
    fmt: str
    reason: str
    config: Config | None
    entries: list[tuple[str, tuple[int, ...], str]]
    kind: str = "model"
    step: int | None = None
    loads: bool | None = None
    problem: str | None = None
    parameters: int | None = None
    stored_values: int = 0
    checkpoint: Checkpoint | None = None


def _entries(path: Path, det: Detection, config: Config | None
             ) -> list[tuple[str, tuple[int, ...], str]]:
    if det.fmt in ("canonical", "torch") and det.variant == "safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), "np") as f:
                out = []
                for k in f.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                    s = f.get_slice(k)
                    d = s.get_dtype()
                    out.append((k, tuple(s.get_shape()), _SAFETENSORS_DTYPES.get(d, d.lower())))
                return out
        except Exception as e:
            raise CheckpointError(f"{path}: cannot read the safetensors file ({_first_line(e)})"
                                  ) from e
    if det.fmt == "torch":
        return [(k, tuple(v.shape), str(v.dtype).removeprefix("torch."))
                for k, v in _load_pt(path).items()]
    if det.fmt == "eqx":
        with open(path, "rb") as f:
            headers = scan_npy_stream(f, path.stat().st_size, str(path))
        names = [f"#{i}" for i in range(len(headers))]
        if config is not None:
            dtype = _dtype_of(det.meta) or "float32"
            leaves = _eqx_leaves(_eqx_like(config, dtype, det.meta))
            if len(leaves) == len(headers):
                names = [f"#{i} {n}" for i, (n, _) in enumerate(leaves)]
        return [(n, s, np.dtype(d).name) for n, (s, d) in zip(names, headers, strict=True)]
    return [(k, tuple(getattr(v, "shape", ()) or ()),
             np.dtype(v.dtype).name if getattr(v, "dtype", None) is not None else "scalar")
            for k, v in _orbax_tree(path).items()]


def inspect_checkpoint(path: str | os.PathLike, *, arch: str | None = None,
                       config: Any = None) -> Report:
    """Format, architecture, config, every stored key with shape and dtype, parameter count, and
    whether the checkpoint loads into the zoo (validated against its config)."""
    path = Path(path)
    det = detect(path)
    _check_version(path, det.meta)
    given = parse_config(arch, config)
    stored_cfg = None
    if det.meta and det.meta.get("config") is not None:
        try:
            stored_cfg = config_from_dict(det.meta["config"])
        except (ConfigError, TypeError):
            stored_cfg = None
    cfg = stored_cfg or given
    entries = _entries(path, det, cfg)
    report = Report(path, det.fmt, det.reason, cfg, entries,
                    kind=(det.meta or {}).get("kind", "model"), step=(det.meta or {}).get("step"))
    report.stored_values = sum(int(np.prod(s, dtype=np.int64)) for _, s, _ in entries)
    if cfg is None:
        keys = [k for k, _, _ in entries]
        report.problem = ("no architecture or config stored: pass --arch/--config to validate"
                          + _guess_arch(keys))
        return report
    try:
        ck = read(path, arch=arch, config=config)
    except (ConversionError, CheckpointError, ConfigError) as e:
        report.loads, report.problem = False, str(e)
        return report
    report.loads, report.checkpoint, report.config = True, ck, ck.config
    report.kind, report.step = ("training" if ck.training else "model"), ck.step
    report.parameters = sum(int(np.prod(ck.state[k].shape, dtype=np.int64))
                            for k in param_keys(ck.config))
    return report


def disk_size(path: str | os.PathLike) -> int:
    """Bytes on disk of a checkpoint file or directory (0 if unreadable)."""
    try:
        return file_size(Path(path))
    except OSError:
        return 0
