"""The registry: which architectures exist, in which libraries, and how to build them."""

from __future__ import annotations

import importlib
from typing import Any

import jax
import jax.numpy as jnp

from zoo.configs import CONFIGS, Config, ConfigError
from zoo.models.common import dtype_of

ARCHS: tuple[str, ...] = tuple(CONFIGS)
IMPLS: tuple[str, ...] = ("eqx", "linen", "nnx", "torch")
JAX_IMPLS: tuple[str, ...] = ("eqx", "linen", "nnx")
_CLASS_NAMES = {"mlp": "MLP", "cnn": "CNN", "decoder3d": "Decoder3D"}


def _check(arch: str, impl: str | None = None) -> None:
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; available: {list(ARCHS)}")
    if impl is not None and impl not in IMPLS:
        raise ValueError(f"unknown implementation {impl!r}; available: {list(IMPLS)}")


def model_class(arch: str, impl: str) -> type:
    """The class implementing `arch` in library `impl` (imports torch only for impl='torch')."""
    _check(arch, impl)
    if impl == "torch" and importlib.util.find_spec("torch") is None:
        raise ImportError("impl='torch' needs PyTorch: pip install 'jax-model-zoo[torch]'")
    return getattr(importlib.import_module(f"zoo.models.{arch}.{impl}"), _CLASS_NAMES[arch])


def list_models(impl: str | None = None) -> list[tuple[str, str]]:
    """Every available (arch, impl) pair; torch pairs only when PyTorch is installed."""
    have_torch = importlib.util.find_spec("torch") is not None
    impls = IMPLS if impl is None else (impl,)
    return [(a, i) for a in ARCHS for i in impls if i != "torch" or have_torch]


def make_config(arch: str | Config, **overrides: Any) -> Config:
    """A config from an architecture name (plus overrides) or an existing config."""
    if isinstance(arch, Config):
        if overrides:
            raise ConfigError("pass overrides with an architecture name, not with a config")
        return arch
    _check(arch)
    return CONFIGS[arch](**overrides)


def example_input(config: Config, batch: int = 2, seed: int = 0, dtype: Any = "float32"):
    """Non-degenerate random input in the canonical layout: (batch, C, *spatial)."""
    key = jax.random.key(seed)
    return jax.random.normal(key, (batch, *config.input_shape), jnp.float32).astype(dtype)


def channels_last_input(config: Config, batch: int = 1) -> jax.ShapeDtypeStruct:
    c, *spatial = config.input_shape
    shape = (batch, *spatial, c) if spatial else (batch, c)
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def native_init(config: Config, impl: str, key: jax.Array, dtype: Any = "float32") -> Any:
    """A model initialised by the library's own initialisers (init='native')."""
    cls = model_class(config.arch, impl)
    dt = dtype_of(dtype)
    if impl == "eqx":
        if getattr(cls, "has_state", False):
            import equinox as eqx

            return eqx.nn.make_with_state(cls)(config, key=key, dtype=dt)
        return cls(config, key=key, dtype=dt)
    if impl == "linen":
        module = cls(config, param_dtype=dt.name)
        x = jnp.zeros(channels_last_input(config).shape, dt)
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
        module = model_class(config.arch, impl)(config, param_dtype=dtype_of(dtype).name)
        x = channels_last_input(config)
        return module, jax.eval_shape(module.init, {"params": key, "dropout": key}, x)
    if impl == "nnx":
        from flax import nnx

        return nnx.eval_shape(lambda: native_init(config, impl, key, dtype))
    return native_init(config, impl, key, dtype)
