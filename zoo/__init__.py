"""A zoo of matched models in Equinox, Flax Linen and Flax NNX (and a PyTorch reference).

    model = zoo.create("cnn", "nnx", seed=0)          # same seed -> same numbers everywhere
    module, variables = zoo.create("cnn", "linen", seed=0)
    model, state = zoo.create("cnn", "eqx", seed=0)
    model = zoo.create("resnet50.tv_in1k", "nnx", pretrained=True)   # timm's tags, the Hub
    tokens = zoo.generate(zoo.create("gpt2", "nnx"), "nnx", ids, max_new_tokens=32)
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import jax
import numpy as np

import canonical
import zoo.models  # noqa: F401  (registers every architecture folder)
from zoo import moved, tokenizer
from zoo.configs import Config, ConfigError
from zoo.embed import embed
from zoo.interface import Interface
from zoo.libraries import interface, library, native_interface
from zoo.names import list_models, make_config
from zoo.registry import (
    ARCHS,
    IMPLS,
    JAX_IMPLS,
    architecture,
    example_input,
    list_implementations,
    model_class,
    native_init,
    register,
    skeleton,
    tiny_config,
    walk_facts,
)
from zoo.runtime.generation import generate
from zoo.runtime.sharding import shard
from zoo.weights.init import canonical_init
from zoo.weights.loading import load as load_weights
from zoo.weights.loading import source_config
from zoo.weights.pretrained import (
    Pretrained,
    data_config,
    labels,
    list_pretrained,
    remember,
    resolve,
    transform,
)
from zoo.weights.sources import Source

moved.install()  # the old module paths (zoo.fast, zoo.hub, ...) import with a warning

__all__ = [
    "ARCHS", "IMPLS", "JAX_IMPLS", "Config", "ConfigError", "Interface", "Pretrained",
    "architecture", "canonical_init", "create", "data_config", "embed", "example_input",
    "generate", "interface",
    "labels", "library", "list_implementations", "list_models", "list_pretrained",
    "load_weights", "make_config", "model_class", "native_interface", "register", "sharding",
    "tiny_config", "tokenizer", "transform",
]


def model_config(name: str | Config, **overrides: Any) -> Config:
    """The config `zoo.create` builds for `name`: `make_config`'s, or for a source
    (``hf-hub:ORG/REPO``, ``local-dir:PATH``) the one its ``config.json`` describes (only that
    file is fetched), with `overrides` on top."""
    if isinstance(name, str) and Source.parse(name) is not None:
        base = source_config(name)
        return type(base)(**{**dataclasses.asdict(base), **overrides}) if overrides else base
    return make_config(name, **overrides)


def pretrained_plan(name: str | Config, overrides: dict[str, Any]
                    ) -> tuple[Config, str, Pretrained | None]:
    """(config, where the weights are, the tag) of `zoo.create(name, ..., pretrained=True)`:
    the tag's repository on the Hub (the default tag of an untagged name), or the source
    itself; the config is the named model's with the tag's class count and input size, or the
    source's own, `overrides` on top."""
    if isinstance(name, Config):
        raise ConfigError("pretrained=True takes a model name with its tag (resnet50.a1_in1k) "
                          "or a source (hf-hub:ORG/REPO); for a config, pass weights=")
    found = resolve(name)
    if found.source is not None:
        raw = found.source.config_json() or {}
        timm_cfg = raw.get("pretrained_cfg")
        tag = (Pretrained.of_source(str(found.source), timm_cfg)
               if isinstance(timm_cfg, dict) else None)
        return model_config(name, **overrides), str(found.source), tag
    tag = found.pretrained
    if tag is None:
        raise ConfigError(f"{name} has no pretrained weights (zoo.list_pretrained() lists the "
                          "names that have)")
    has_head = "num_classes" in {f.name for f in dataclasses.fields(make_config(found.name))}
    if has_head and not tag.fields.get("num_classes") and "num_classes" not in overrides:
        raise ConfigError(f"{tag}: the weights have no classifier (timm's num_classes "
                          f"{tag.fields.get('num_classes')}: features only) and the zoo's "
                          "models end in one: pass num_classes=N for a new one (drawn from "
                          "seed)")
    return make_config(str(tag), **overrides), found.weights, tag


def create(arch: str | Config, impl: str, *, seed: int = 0, init: str = "canonical",
           dtype: Any = "float32", weights: Any = None, pretrained: bool = False,
           mesh: jax.sharding.Mesh | None = None, strategy: str = "dp", **config: Any) -> Any:
    """A ready model of `arch` in library `impl`.

    Returns the library's native objects: Equinox `model` (or `(model, state)` for architectures
    with state), Linen `(module, variables)`, NNX `model`, PyTorch `nn.Module`.

    `init="canonical"` (default) draws the documented canonical initialisation (`zoo.weights.init`)
    from
    `seed` and converts it, so one seed gives numerically identical models in every library.
    `init="native"` uses the library's own initialisers instead.

    `weights` (a checkpoint path, read by the `converters` package, or a canonical state) loads
    those weights instead, adapted to the config as timm does for pretrained weights: another
    `num_classes` re-initialises the classifier (from `seed`), another ViT `image_size`
    resamples the position embedding, another `in_channels` adapts the first convolution (each
    change is reported as a warning; `zoo.weights.loading`, the architecture's `ADAPTERS`).

    `pretrained=True` loads the published weights of a name with a pretrained tag, as timm's
    `create_model(name, pretrained=True)`: ``resnet50.tv_in1k`` (an untagged name means its
    default tag, timm's), from the Hub repository the tag table names (`zoo.weights.pretrained`),
    through `huggingface_hub`'s cache (``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``), then read and
    adapted as `weights=` is; `arch` may also be a source, ``hf-hub:ORG/REPO[@REVISION]`` or
    ``local-dir:PATH``, whose ``config.json`` gives the config (and, without `pretrained`,
    only the config). `zoo.data_config(model)` then gives the tag's preprocessing.

    `mesh`: a `jax.sharding.Mesh` to place the arrays on, partitioned by `strategy` ("dp",
    "fsdp", "tp"; `zoo.runtime.sharding`); the numbers are those of the unsharded model.
    """
    made = None
    if pretrained:
        if weights is not None:
            raise ConfigError("pass pretrained=True or weights=..., not both")
        cfg, weights, made = pretrained_plan(arch, config)
    else:
        cfg = model_config(arch, **config)
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
    if made is not None:
        remember(model, made)
    return model if mesh is None else shard(model, impl, mesh, strategy, config=cfg)


def __getattr__(name: str) -> Any:
    """The modules that moved under their old short names (`zoo.fast`, `zoo.hub`, ...): each
    imported when first asked for, with the warning that names its new path."""
    if moved.new_name(f"{__name__}.{name}") is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module(f"{__name__}.{name}")
