"""The registry: which architectures exist, in which libraries, and how to build them.

An architecture is one folder, `zoo/models/<arch>/`, whose package registers its config class
and its four model classes with `register`; nothing else in the zoo, the converters, the tests or
the benchmark names it. The classes may be given as "module:Class" strings (a leading "." is
relative to the config's package), imported when first used, so PyTorch is imported only for
impl="torch".
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

import canonical
from zoo.configs import CONFIGS, Config, ConfigError
from zoo.names import named_config

IMPLS: tuple[str, ...] = ("eqx", "linen", "nnx", "torch")
JAX_IMPLS: tuple[str, ...] = ("eqx", "linen", "nnx")
CHANNELS_LAST: frozenset[str] = frozenset({"linen", "nnx"})


@dataclass(frozen=True)
class Architecture:
    """A registered architecture: its config class and its model class per implementation."""

    config: type[Config]
    classes: dict[str, type | str]

    @property
    def name(self) -> str:
        return self.config.arch

    def model_class(self, impl: str) -> type:
        cls = self.classes[impl]
        if isinstance(cls, str):
            module, _, attr = cls.partition(":")
            package = self.config.__module__.rpartition(".")[0]
            cls = getattr(importlib.import_module(module, package if module[:1] == "." else None),
                          attr)
        return cls


_ARCHITECTURES: dict[str, Architecture] = {}


def register(config: type[Config], **classes: type | str) -> Architecture:
    """Register an architecture: its config class (with `arch` set) and one model class per
    implementation (`eqx=`, `linen=`, `nnx=`, `torch=`)."""
    unknown = sorted(set(classes) - set(IMPLS))
    if unknown or not classes:
        raise ValueError(f"register({config.__name__}): give model classes for {list(IMPLS)}, "
                         f"got {sorted(classes)}")
    entry = Architecture(config, dict(classes))
    _ARCHITECTURES[config.arch] = entry
    CONFIGS[config.arch] = config
    return entry


def unregister(arch: str) -> None:
    """Remove a registered architecture (tests that register toy ones clean up with it)."""
    _ARCHITECTURES.pop(arch, None)
    CONFIGS.pop(arch, None)


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
    if arch not in _ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; available: {list(ARCHS)}")
    return _ARCHITECTURES[arch]


def _check_impl(arch: str, impl: str) -> None:
    if impl not in IMPLS:
        raise ValueError(f"unknown implementation {impl!r}; available: {list(IMPLS)}")
    if impl not in architecture(arch).classes:
        raise ValueError(f"{arch} has no {impl} implementation")


def model_class(arch: str, impl: str) -> type:
    """The class implementing `arch` in library `impl` (imports torch only for impl='torch')."""
    _check_impl(arch, impl)
    if impl == "torch" and importlib.util.find_spec("torch") is None:
        raise ImportError("impl='torch' needs PyTorch: pip install 'jax-model-zoo[torch]'")
    return architecture(arch).model_class(impl)


def list_implementations(impl: str | None = None) -> list[tuple[str, str]]:
    """Every available (arch, impl) pair; torch pairs only when PyTorch is installed."""
    have_torch = importlib.util.find_spec("torch") is not None
    impls = IMPLS if impl is None else (impl,)
    return [(a, i) for a in ARCHS for i in impls
            if i in architecture(a).classes and (i != "torch" or have_torch)]


def make_config(arch: str | Config, **overrides: Any) -> Config:
    """A config from an architecture or model name ("resnet50", `zoo.names`) plus overrides,
    or an existing config."""
    if isinstance(arch, Config):
        if overrides:
            raise ConfigError("pass overrides with an architecture name, not with a config")
        return arch
    return named_config(arch, **overrides)


def tiny_config(arch: str, **overrides: Any) -> Config:
    """The architecture's small config (its `TINY` overrides), for tests and CI presets."""
    return architecture(arch).config.tiny(**overrides)


def example_input(config: Config, batch: int = 2, seed: int = 0, dtype: Any = "float32"):
    """Non-degenerate random input in the canonical layout: (batch, C, *spatial)."""
    key = jax.random.key(seed)
    return jax.random.normal(key, (batch, *config.input_shape), jnp.float32).astype(dtype)


def abstract_input(config: Config, impl: str, batch: int = 1) -> jax.ShapeDtypeStruct:
    """An abstract input of `impl`'s layout (channels-last for Flax)."""
    c, *spatial = config.input_shape
    shape = (batch, *spatial, c) if spatial and impl in CHANNELS_LAST else (
        batch, *config.input_shape)
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def walk_facts(config: Config, impl: str) -> dict[str, Any]:
    """What the canonical walkers need to know of a zoo model beyond its tree (`canonical.read`
    keyword arguments): an input to trace it with and the flattened feature map."""
    return {"example": abstract_input(config, impl), "flatten_shape": config.flatten_shape}


def native_init(config: Config, impl: str, key: jax.Array, dtype: Any = "float32") -> Any:
    """A model initialised by the library's own initialisers (init='native')."""
    cls = model_class(config.arch, impl)
    dt = jnp.dtype(dtype)
    if impl == "eqx":
        if getattr(cls, "has_state", False):
            import equinox as eqx

            return eqx.nn.make_with_state(cls)(config, key=key, dtype=dt)
        return cls(config, key=key, dtype=dt)
    if impl == "linen":
        module = cls(config, param_dtype=dt.name)
        x = jnp.zeros(abstract_input(config, impl).shape, dt)
        return module, module.init({"params": key, "dropout": key}, x)
    if impl == "nnx":
        from flax import nnx

        return cls(config, rngs=nnx.Rngs(params=key, dropout=key), param_dtype=dt)
    import torch

    torch.manual_seed(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    return cls(config).to(getattr(torch, dt.name))


def skeleton(config: Config, impl: str, dtype: Any = "float32") -> Any:
    """The model's structure without computing any weights (abstract arrays where possible)."""
    key = jax.random.key(0)
    if impl == "eqx":
        import equinox as eqx

        return eqx.filter_eval_shape(native_init, config, impl, key, dtype)
    if impl == "linen":
        module = model_class(config.arch, impl)(config, param_dtype=jnp.dtype(dtype).name)
        x = abstract_input(config, impl)
        return module, jax.eval_shape(module.init, {"params": key, "dropout": key}, x)
    if impl == "nnx":
        from flax import nnx

        return nnx.eval_shape(lambda: native_init(config, impl, key, dtype))
    return native_init(config, impl, key, dtype)


def reference_impl(config: Config) -> str:
    """The implementation whose skeleton gives an architecture's schema when no model is at
    hand: the first JAX library it is registered in (all give the same schema)."""
    classes = architecture(config.arch).classes
    return next((i for i in JAX_IMPLS if i in classes), next(iter(classes)))


@functools.lru_cache(maxsize=128)
def schema(config: Config, impl: str | None = None) -> tuple[list[Any], dict[str, Any]]:
    """(layers, canonical spec) of `config`, read from the skeleton of `impl` (default:
    `reference_impl`): every canonical key with its float32 shape and dtype."""
    impl = impl or reference_impl(config)
    model = skeleton(config, impl)
    facts = walk_facts(config, impl)
    return canonical.layers(model, impl, **facts), canonical.spec(model, impl, **facts)
