"""The registry: which architectures exist, in which libraries, and how to build them.

An architecture is one folder, `zoo/models/<arch>/`, whose package registers its config class
and its four model classes with `register`; nothing else in the zoo, the converters, the tests or
the benchmark names it. The classes may be given as "module:Class" strings (a leading "." is
relative to the config's package), imported when first used, so PyTorch is imported only for
impl="torch".
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp

import canonical
from zoo.configs import CONFIGS, Config
from zoo.libraries import IMPLS, jax_libraries, library
from zoo.libraries import JAX_IMPLS as JAX_IMPLS  # re-exported: live views of the libraries


@dataclass(frozen=True)
class Architecture:
    """A registered architecture: its config class and its model class per implementation."""

    config: type[Config]
    classes: dict[str, type | str]
    _checked: dict[str, type] = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.config.arch

    def model_class(self, impl: str) -> type:
        """The class of library `impl` (of the library it is a flavour of), imported and
        checked against the library's model contract when first asked for."""
        lib = library(impl)
        if lib.classes_of not in self._checked:
            cls = self.classes[lib.classes_of]
            if isinstance(cls, str):
                module, _, attr = cls.partition(":")
                package = self.config.__module__.rpartition(".")[0]
                cls = getattr(importlib.import_module(
                    module, package if module[:1] == "." else None), attr)
            library(lib.classes_of).check_class(cls, self.config.tiny())
            self._checked[lib.classes_of] = cls
        return self._checked[lib.classes_of]

    def has(self, impl: str) -> bool:
        """Whether the architecture has a class for library `impl`."""
        return library(impl).classes_of in self.classes


_ARCHITECTURES: dict[str, Architecture] = {}


def register(config: type[Config], **classes: type | str) -> Architecture:
    """Register an architecture: its config class (with `arch` set) and one model class per
    library (`eqx=`, `linen=`, `nnx=`, `torch=`). Classes given as classes are checked against
    their library's model contract now (a ContractError names the class and the rule), those
    given as "module:Class" strings when first imported."""
    unknown = sorted(set(classes) - set(IMPLS))
    if unknown or not classes:
        raise ValueError(f"register({config.__name__}): give model classes for {list(IMPLS)}, "
                         f"got {sorted(classes)}")
    entry = Architecture(config, dict(classes))
    for impl, cls in classes.items():
        if not isinstance(cls, str):
            entry.model_class(impl)
    _ARCHITECTURES[config.arch] = entry
    CONFIGS[config.arch] = config
    return entry


@contextlib.contextmanager
def restoring() -> Iterator[None]:
    """Architectures registered inside the `with` block are gone after it (tests' toys)."""
    saved, configs = dict(_ARCHITECTURES), dict(CONFIGS)
    try:
        yield
    finally:
        _ARCHITECTURES.clear()
        _ARCHITECTURES.update(saved)
        CONFIGS.clear()
        CONFIGS.update(configs)


class _Names(Sequence[str]):
    """The registered architecture names, read live from the registry."""

    def __getitem__(self, i: Any) -> Any:
        return tuple(_ARCHITECTURES)[i]

    def __len__(self) -> int:
        return len(_ARCHITECTURES)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(_ARCHITECTURES))

    def __contains__(self, arch: object) -> bool:
        return arch in _ARCHITECTURES

    def __repr__(self) -> str:
        return repr(tuple(_ARCHITECTURES))


ARCHS: Sequence[str] = _Names()


def architecture(arch: str) -> Architecture:
    """The registered architecture `arch`: its config class and model classes."""
    if arch not in _ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; available: {list(ARCHS)}")
    return _ARCHITECTURES[arch]


def _check_impl(arch: str, impl: str) -> None:
    if not architecture(arch).has(impl):
        raise ValueError(f"{arch} has no {impl} implementation")
    library(impl).require()


def model_class(arch: str, impl: str) -> type:
    """The class implementing `arch` in library `impl` (imports torch only for impl='torch')."""
    _check_impl(arch, impl)
    return architecture(arch).model_class(impl)


def list_implementations(impl: str | None = None) -> list[tuple[str, str]]:
    """Every available (arch, impl) pair; a library's pairs only when it is installed."""
    impls = IMPLS if impl is None else (impl,)
    return [(a, i) for a in ARCHS for i in impls
            if architecture(a).has(i) and library(i).available()]



def tiny_config(arch: str, **overrides: Any) -> Config:
    """The architecture's small config (its `TINY` overrides), for tests and CI presets."""
    return architecture(arch).config.tiny(**overrides)


def example_input(config: Config, batch: int = 2, seed: int = 0, dtype: Any = "float32"):
    """Non-degenerate random input in the canonical layout, (batch, *input_shape): normal
    values in `dtype`, token ids for language models (`Config.sample_input`)."""
    return config.sample_input(jax.random.key(seed), batch, dtype)


def abstract_input(config: Config, impl: str, batch: int = 1) -> jax.ShapeDtypeStruct:
    """An abstract input of `impl`'s layout (channels-last for Flax)."""
    return library(impl).abstract_input(config, batch)


def walk_facts(config: Config, impl: str) -> dict[str, Any]:
    """What the canonical walkers need to know of a zoo model beyond its tree (`canonical.read`
    keyword arguments): an input to trace it with and the flattened feature map."""
    return {"example": abstract_input(config, impl), "flatten_shape": config.flatten_shape}


def native_init(config: Config, impl: str, key: jax.Array, dtype: Any = "float32") -> Any:
    """A model initialised by the library's own initialisers (init='native')."""
    return library(impl).native_init(model_class(config.arch, impl), config, key, dtype)


def skeleton(config: Config, impl: str, dtype: Any = "float32") -> Any:
    """The model's structure without computing any weights (abstract arrays where possible).
    An abstract skeleton (`Library.abstract_skeleton`) is built once per class, config and
    dtype; each call gets its own clone, safe to write into."""
    lib, cls = library(impl), model_class(config.arch, impl)
    try:
        hash(config)
    except TypeError:
        return lib.skeleton(cls, config, dtype)
    if not lib.abstract_skeleton:
        return lib.skeleton(cls, config, dtype)
    return lib.interface.clone(_abstract_skeleton(lib, cls, config, jnp.dtype(dtype).name))


@functools.lru_cache(maxsize=256)
def _abstract_skeleton(lib: Any, cls: type, config: Config, dtype: str) -> Any:
    return lib.skeleton(cls, config, dtype)


def reference_impl(config: Config) -> str:
    """The implementation whose skeleton gives an architecture's schema when no model is at
    hand: the first JAX library it is registered in (all give the same schema)."""
    arch = architecture(config.arch)
    return next((lib.name for lib in jax_libraries() if arch.has(lib.name)),
                next(iter(arch.classes)))


@functools.lru_cache(maxsize=128)
def schema(config: Config, impl: str | None = None) -> tuple[list[Any], dict[str, Any]]:
    """(layers, canonical spec) of `config`, read from the skeleton of `impl` (default:
    `reference_impl`): every canonical key with its float32 shape and dtype."""
    impl = impl or reference_impl(config)
    model = skeleton(config, impl)
    facts = walk_facts(config, impl)
    return canonical.layers(model, impl, **facts), canonical.spec(model, impl, **facts)
