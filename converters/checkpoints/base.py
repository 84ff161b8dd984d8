"""Shared pieces of the checkpoint code: format names, `Detection`, `Checkpoint`, config
resolution and metadata helpers. See `converters.checkpoints` for the public API.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from converters.checkpoints.io import (
    SIDECAR_MARKER,
    CheckpointError,
    ProgressFn,
    UsageError,
    no_progress,
)
from converters.core import (
    ConversionError,
    as_numpy_state,
    canonical_spec,
    from_canonical,
    validate,
)
from converters.optim import CanonicalOptState, opt_state_like, to_native_opt, validate_opt
from zoo.configs import CONFIGS, Config, ConfigError, config_from_dict
from zoo.interface import interface
from zoo.names import resolve
from zoo.registry import ARCHS

FORMATS: tuple[str, ...] = ("eqx", "linen", "nnx", "canonical", "torch")
FORMAT_VERSION = 1
OPT_PREFIX = "optimizer/"


@dataclass
class Detection:
    """What a path holds: `fmt` (one of FORMATS), why we think so, and our metadata if any."""

    fmt: str
    reason: str
    meta: dict[str, Any] | None = None
    variant: str = ""  # torch: "pt" or "safetensors"
    note: str = ""  # e.g. a stale sidecar that was ignored


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
    notes: list[str] = field(default_factory=list, compare=False)  # adaptations made on reading
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
        mixed = sorted(k for k, v in self.state.items()
                       if jnp.issubdtype(v.dtype, jnp.floating) and v.dtype != dtype)
        if mixed:
            raise ConversionError(
                f"the checkpoint mixes floating dtypes: {dtype} parameters, but "
                + ", ".join(f"{k!r} is {self.state[k].dtype}" for k in mixed[:10])
                + f"; the canonical layout holds one floating dtype: pass --cast {dtype} "
                "(cast=...) to convert them")
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

    def cast(self, dtype: Any) -> Checkpoint:
        """A copy whose floating arrays (model and optimizer) are `dtype`; integers are kept."""
        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)

        dtype = np.dtype(jnp.dtype(dtype))
        if not jnp.issubdtype(dtype, jnp.floating):
            raise UsageError(f"--cast {dtype}: not a floating dtype")
        conv = lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a
        opt = self.optimizer
        if opt is not None:
            opt = CanonicalOptState(opt.layout, {k: conv(np.asarray(v))
                                                 for k, v in opt.arrays.items()})
        return dataclasses.replace(self, state={k: conv(v) for k, v in self.state.items()},
                                   optimizer=opt, _validated=None)

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
        text, where = str(config), "--config"
        if not text.lstrip().startswith("{"):
            p = Path(text)
            if not p.is_file():
                raise ConfigError(f"--config {text!r}: neither a JSON object nor a file")
            where = f"--config file {p}"
            try:
                text = p.read_bytes().decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(f"{where} is not UTF-8 text (binary?)") from e
            except OSError as e:
                raise ConfigError(f"{where}: cannot read it ({e.strerror or e})") from e
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
            raise ConfigError(f"{where} is not valid JSON: {why}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be a JSON object, found {type(data).__name__}")
    if arch is not None:
        arch, named = resolve(arch)  # a model name ("resnet50"): its architecture and overrides
        if data.get("arch", arch) != arch:
            raise ConfigError(f"--arch {arch!r} contradicts the config's arch {data['arch']!r}")
        data = {**named, **data, "arch": arch}
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


JAX_FORMATS = ("eqx", "linen", "nnx")


def check_target_dtype(ck: Checkpoint, fmt: str, dtype: np.dtype) -> None:
    """Refuse a dtype the JAX formats would silently change (float64 without jax x64)."""
    if fmt in JAX_FORMATS and np.dtype(dtype) == np.float64 and not jax.config.jax_enable_x64:
        raise CheckpointError(
            f"the checkpoint holds float64 arrays, which {fmt} (JAX without jax_enable_x64) "
            "would store as float32: pass --cast float32 (cast='float32') to convert them "
            "explicitly, or enable x64")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _with_dtype(tree: Any, dtype: Any) -> Any:
    """Every floating abstract leaf in `dtype`: the canonical layout holds one floating dtype
    (Linen, for one, keeps float32 batch statistics next to bfloat16 parameters)."""
    dtype = jnp.dtype(dtype)
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, dtype) if isinstance(x, jax.ShapeDtypeStruct)
        and jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
