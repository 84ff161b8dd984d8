"""The `Library` base class, the registry of libraries and the model contract's checks."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

import canonical
from canonical.walkers import Walker
from zoo.configs import Config
from zoo.interface import Interface


class ContractError(TypeError):
    """A model class that does not meet its library's model contract."""


class Library:
    """What the project knows about one library. Subclass it, set the facts, implement
    `owns`, `native_init` (and `skeleton` where the library can build abstract models).

    - `name`: the implementation name used everywhere ("eqx", "linen", ...).
    - `family`: its parameter layout (`canonical.layouts`: "eqx", "flax", "torch"), its
      walker's.
    - `channels_last`: native inputs are (N, *spatial, C).
    - `is_jax`: models are JAX pytrees with a functional `interface` (split / merge / apply).
    - `reference`: the library the benchmark compares the others with (PyTorch).
    - `package`, `install`: the module that must be installed to use it, and how (when it
      is an optional dependency).
    - `checkpoint_format`: the name of its native checkpoint format (`converters.checkpoints`).
    - `walker`, `interface`: its `canonical.Walker` and `zoo.Interface` instances.
    - `contract`: the `typing.Protocol` its model classes follow; `rng_argument` and
      `dtype_argument` name the constructor's keywords for randomness and parameter dtype.
    - `classes_of`: whose model classes (per architecture) it builds: its own name, or that of
      the library it is a flavour of.
    - `pads_same`: the library's convolutions pad as SAME unless given explicit pads (Flax),
      so a checkpoint of a model the zoo did not build may pad so (`zoo.configs.Padding`).
    - `lora`: the module of its LoRA layers (`zoo.lora`: `wrap`, `unwrap`, `factors`,
      `spec`), or None.
    - `abstract_skeleton`: its `skeleton` holds abstract arrays only (no memory), so one
      skeleton per (class, config, dtype) is built once and cloned (`zoo.registry.skeleton`).
    """

    name: ClassVar[str]
    channels_last: ClassVar[bool] = False
    is_jax: ClassVar[bool] = True
    reference: ClassVar[bool] = False
    package: ClassVar[str]
    install: ClassVar[str] = ""
    checkpoint_format: ClassVar[str]
    walker: ClassVar[Walker]
    interface: ClassVar[Interface]
    contract: ClassVar[type]
    rng_argument: ClassVar[str | None] = None
    dtype_argument: ClassVar[str | None] = None
    pads_same: ClassVar[bool] = False
    abstract_skeleton: ClassVar[bool] = False
    lora: ClassVar[str | None] = None

    @property
    def classes_of(self) -> str:
        return self.name

    @property
    def family(self) -> str:
        return self.walker.family

    def available(self) -> bool:
        """Whether the library is installed."""
        return importlib.util.find_spec(self.package) is not None

    def require(self) -> None:
        """Raise an ImportError saying how to install the library when it is missing."""
        if not self.available():
            hint = f": {self.install}" if self.install else ""
            raise ImportError(f"impl={self.name!r} needs {self.package}{hint}")

    def owns(self, obj: Any) -> bool:
        """Whether `obj` is a native model object of this library."""
        raise NotImplementedError

    def native_init(self, cls: type, config: Config, key: jax.Array, dtype: Any) -> Any:
        """A model of class `cls` initialised by the library's own initialisers."""
        raise NotImplementedError

    def skeleton(self, cls: type, config: Config, dtype: Any) -> Any:
        """The model's structure without computing weights (abstract arrays where possible)."""
        return self.native_init(cls, config, jax.random.key(0), dtype)

    def annotate_shardings(self, model: Any) -> Any:
        """`model`, whose arrays lie on a mesh, with their partitions also written where the
        library's own sharding tools read them (the arrays themselves carry theirs)."""
        return model

    def logical_box(self, array: Any, names: tuple[str | None, ...]) -> Any:
        """`array` wrapped with its logical axis `names` where the library has such a box
        (`zoo.runtime.sharding.logically_named`)."""
        raise ValueError(f"impl={self.name!r} has no box for logical axis names: its arrays "
                         "carry their shardings (zoo.runtime.sharding.shard)")

    def constrain(self, tree: Any, where: Any) -> Any:
        """Inside a jitted function: `tree`'s arrays constrained to lie as the sharding `where`
        says (`jax.lax.with_sharding_constraint`); how `zoo.runtime.fast` splits a batch over a
        mesh.
        A library with its own idiom for it implements it with that."""
        return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, where), tree)

    def set_threads(self, n: int) -> None:
        """Give the library's own thread pool `n` threads (a no-op where XLA decides)."""

    def input_shape(self, config: Config, batch: int) -> tuple[int, ...]:
        """The shape of a native input batch (channels-last for Flax where the architecture
        has a channel axis)."""
        c, *spatial = config.input_shape
        if spatial and self.channels_last and getattr(config, "CHANNELS", True):
            return (batch, *spatial, c)
        return (batch, *config.input_shape)

    def input_dtype(self, config: Config, dtype: Any = "float32") -> jnp.dtype:
        """The dtype of a native input to a model of `dtype`: the architecture's own where it
        takes integers (token ids), else `dtype`."""
        own = jnp.dtype(getattr(config, "INPUT_DTYPE", "float32"))  # a bench-only subject's
        # config (not a zoo Config) declares neither: a float input with channels
        return own if not jnp.issubdtype(own, jnp.floating) else jnp.dtype(dtype)

    def abstract_input(self, config: Config, batch: int = 1) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(self.input_shape(config, batch), self.input_dtype(config))

    # ------------------------------------------------------------------ the model contract
    def contract_problems(self, cls: type) -> list[str]:
        """The rules of the contract `cls` breaks that its signature shows."""
        params = _parameters(cls)
        takes = lambda n: n in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        problems = [] if "config" in params else ["its constructor takes no `config` argument"]
        for what, arg in (("RNG", self.rng_argument), ("dtype", self.dtype_argument)):
            if arg is not None and not takes(arg):
                problems.append(f"its constructor takes no `{arg}=` ({self.name}'s {what} "
                                "argument)")
        return problems

    def model_problems(self, model: Any) -> list[str]:
        """The rules of the contract the skeleton `model` breaks (checked on a tiny config)."""
        return [] if hasattr(model, "config") else ["its models have no `.config` attribute"]

    def check_class(self, cls: type, config: Config | None = None) -> None:
        """Refuse a model class breaking the contract (a ContractError names the class and the
        rule); with `config`, its skeleton is checked too."""
        problems = self.contract_problems(cls)
        if not problems and config is not None:
            problems = self.model_problems(self.skeleton(cls, config, "float32"))
        if problems:
            raise ContractError(f"{cls.__module__}.{cls.__qualname__} breaks the {self.name} "
                                f"model contract ({self.contract.__name__}): "
                                + "; ".join(problems))

    def __repr__(self) -> str:
        return f"<library {self.name}>"


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(cls.__init__).parameters)  # the metaclass may hide it
    except (TypeError, ValueError):
        return {}


# --------------------------------------------------------------------------- the registry
LIBRARIES: dict[str, Library] = {}


def register_library(lib: Library) -> Library:
    """Add (or replace) a library; its walker becomes `canonical.walker(lib.name)`."""
    LIBRARIES[lib.name] = lib
    canonical.WALKERS[lib.name] = lib.walker
    return lib


@contextlib.contextmanager
def registered(*libs: Library) -> Iterator[tuple[Library, ...]]:
    """Register `libs` for the duration of a `with` block, then restore the registry (and the
    walkers) as they were."""
    saved, walkers = dict(LIBRARIES), dict(canonical.WALKERS)
    try:
        yield tuple(register_library(lib) for lib in libs)
    finally:
        LIBRARIES.clear()
        LIBRARIES.update(saved)
        canonical.WALKERS.clear()
        canonical.WALKERS.update(walkers)


def library(name: str) -> Library:
    """The library called `name` (a ValueError names the known ones)."""
    if name not in LIBRARIES:
        raise ValueError(f"unknown implementation {name!r}; available: {list(LIBRARIES)}")
    return LIBRARIES[name]


def interface(impl: str) -> Interface:
    """The functional interface of a JAX implementation ("eqx", "linen" or "nnx")."""
    if impl not in JAX_IMPLS:
        raise ValueError(f"no functional interface for {impl!r}; JAX impls: {list(JAX_IMPLS)}")
    return library(impl).interface


def native_interface(impl: str) -> Interface:
    """The interface of any implementation, "torch" included: for whole native models
    (`forward`, `eval_fn`, `clone`, `checkpoint_tree`) and the layout. PyTorch's has no
    functional split / merge / apply; the JAX libraries' is `interface(impl)`."""
    if impl not in IMPLS:
        raise ValueError(f"no interface for {impl!r}; impls: {list(IMPLS)}")
    return library(impl).interface


def owner(obj: Any) -> Library | None:
    """The library a native model object belongs to, or None."""
    return next((lib for lib in LIBRARIES.values() if lib.owns(obj)), None)


def jax_libraries() -> list[Library]:
    return [lib for lib in LIBRARIES.values() if lib.is_jax]


class _Names(Sequence[str]):
    """Library names, read live from the registry (filtered by `keep`)."""

    def __init__(self, keep: Callable[[Library], bool]) -> None:
        self._keep = keep

    def _names(self) -> tuple[str, ...]:
        return tuple(n for n, lib in LIBRARIES.items() if self._keep(lib))

    def __getitem__(self, i: Any) -> Any:
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._names())


IMPLS: Sequence[str] = _Names(lambda lib: True)
JAX_IMPLS: Sequence[str] = _Names(lambda lib: lib.is_jax)
