"""A zoo of matched models in Equinox, Flax Linen and Flax NNX (and a PyTorch reference).

    model = zoo.create("cnn", "nnx", seed=0)          # same seed -> same numbers everywhere
    module, variables = zoo.create("cnn", "linen", seed=0)
    model, state = zoo.create("cnn", "eqx", seed=0)
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

import canonical
import zoo.models  # noqa: F401  (registers every architecture folder)
from zoo import sharding
from zoo.configs import Config, ConfigError
from zoo.init import canonical_init
from zoo.interface import Interface, interface, native_interface
from zoo.libraries import library
from zoo.names import list_models
from zoo.registry import (
    ARCHS,
    IMPLS,
    JAX_IMPLS,
    architecture,
    example_input,
    list_implementations,
    make_config,
    model_class,
    native_init,
    register,
    skeleton,
    tiny_config,
    walk_facts,
)
from zoo.weights import load as load_weights

__all__ = [
    "ARCHS", "IMPLS", "JAX_IMPLS", "Config", "ConfigError", "Interface", "architecture",
    "canonical_init", "create", "example_input", "interface", "library", "list_implementations",
    "list_models", "load_weights", "make_config", "model_class", "native_interface", "register",
    "sharding",
    "tiny_config",
]


def create(arch: str | Config, impl: str, *, seed: int = 0, init: str = "canonical",
           dtype: Any = "float32", weights: Any = None, mesh: jax.sharding.Mesh | None = None,
           strategy: str = "dp", **config: Any) -> Any:
    """A ready model of `arch` in library `impl`.

    Returns the library's native objects: Equinox `model` (or `(model, state)` for architectures
    with state), Linen `(module, variables)`, NNX `model`, PyTorch `nn.Module`.

    `init="canonical"` (default) draws the documented canonical initialisation (`zoo.init`) from
    `seed` and converts it, so one seed gives numerically identical models in every library.
    `init="native"` uses the library's own initialisers instead.

    `weights` (a checkpoint path, read by the `converters` package, or a canonical state) loads
    those weights instead, adapted to the config as timm does for pretrained weights: another
    `num_classes` re-initialises the classifier (from `seed`), another ViT `image_size`
    resamples the position embedding, another `in_channels` adapts the first convolution (each
    change is reported as a warning; `zoo.weights`, the architecture's `ADAPTERS`).

    `mesh`: a `jax.sharding.Mesh` to place the arrays on, partitioned by `strategy` ("dp",
    "fsdp", "tp"; `zoo.sharding`); the numbers are those of the unsharded model.
    """
    cfg = make_config(arch, **config)
    if weights is not None:
        floating = np.dtype(jax.numpy.dtype(dtype))
        state = {k: v.astype(floating, copy=False) if np.issubdtype(v.dtype, np.floating)
                 else v for k, v in load_weights(weights, cfg, seed).items()}
        model = canonical.write(skeleton(cfg, impl, dtype), state, impl, **walk_facts(cfg, impl))
    elif init == "canonical":
        state = canonical_init(cfg, seed, dtype)
        model = canonical.write(skeleton(cfg, impl, dtype), state, impl, **walk_facts(cfg, impl))
    elif init == "native":
        model = native_init(cfg, impl, jax.random.key(seed), dtype)
    else:
        raise ValueError(f"init must be 'canonical' or 'native', got {init!r}")
    return model if mesh is None else sharding.shard(model, impl, mesh, strategy, config=cfg)
