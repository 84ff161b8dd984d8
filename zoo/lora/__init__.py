"""Low-rank adapters (LoRA) in every library, matched, exchanged with `peft`'s files.

    model = zoo.lora.add(model, "nnx", rank=8, alpha=16, targets=("q_proj", "v_proj"))
    step = zoo.runtime.fast.train_step(model, "nnx", optax.adamw(1e-3), loss,
                                       trainable=zoo.lora.TRAINABLE)  # only the factors train
    zoo.lora.save(step.model(), "nnx", "adapter/")               # peft's adapter folder
    model = zoo.lora.load(base, "linen", "adapter/")             # any library, or peft's own
    merged = zoo.lora.merge(model, "linen")                      # a plain model, W + s B A

Each targeted layer (by its canonical, transformers module name: `q_proj`, GPT-2's `c_attn`)
becomes, in its library's idiom, the layer plus `scale * lora_B(lora_A(x))` (`scale = alpha /
rank`, `alpha / sqrt(rank)` with `use_rslora`): Equinox replaces the `Linear` leaves
(`eqx.tree_at`), Linen intercepts the targeted Dense calls (`nn.intercept_methods`) of a
subclass of the model holding the factors beside each kernel, NNX puts a module whose factors
are `nnx.LoRAParam`s in the layer's place, PyTorch a module as peft's (`base_layer`, `lora_A`,
`lora_B`). The factors start as peft's do (A: kaiming-uniform with a = sqrt(5), that is
U(-1/sqrt(in), 1/sqrt(in)); B: zeros), drawn from `seed` and the layer's canonical name, so
every library gets the same numbers. Each library's part is its module `Library.lora`
(`zoo/lora/<library>.py`: `wrap`, `unwrap`, `factors`, `spec`).
"""

from __future__ import annotations

import importlib
import math
import zlib
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import canonical
from zoo.libraries import library
from zoo.lora.spec import Adapter, LoraSpec, Target
from zoo.partition import Partition

__all__ = ["TRAINABLE", "Adapter", "LoraSpec", "Target", "adapter", "add", "attach", "base",
           "find_targets", "load", "merge", "save", "unmerge"]

TRAINABLE = Partition.only("*.lora_A.*", "*.lora_B.*")
"""The partition that trains the LoRA factors only (`zoo.runtime.fast.train_step(trainable=)`)."""

# The layer kinds LoRA adapts, and whether their canonical weight is `(in, out)` (peft's
# `fan_in_fan_out`: transformers' Conv1D, GPT-2's projections).
FAN_IN_FAN_OUT: dict[str, bool] = {"linear": False, "hf_conv1d": True}


def _module(impl: str) -> Any:
    lib = library(impl)
    if lib.lora is None:
        raise ValueError(f"impl={impl!r} has no LoRA layers")
    return importlib.import_module(lib.lora)


def _spec(rank: Any, alpha: Any, targets: Any, dropout: Any, use_rslora: bool) -> LoraSpec:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"rank must be a positive int, got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        raise ValueError(f"alpha must be a positive number, got {alpha!r}")
    targets = (targets,) if isinstance(targets, str) else tuple(targets)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(f"targets must be module names, got {targets!r}")
    if dropout != 0.0:
        raise ValueError(f"dropout={dropout!r}: LoRA dropout is not supported yet (only 0.0)")
    return LoraSpec(rank, alpha, targets, float(dropout), bool(use_rslora))


def _facts(model: Any, impl: str) -> dict[str, Any]:
    from zoo.registry import walk_facts

    config = getattr(model[0] if isinstance(model, tuple) else model, "config", None)
    return {} if config is None else walk_facts(config, impl)


def find_targets(model: Any, impl: str, names: Iterable[str]) -> list[Target]:
    """The layers of the plain `model` that `names` target (peft's rule: a module whose name
    is one of `names` or ends with `.` + one), in canonical order; a ValueError in one line
    names a target that matches no adaptable layer."""
    facts = _facts(model, impl)
    found = [layer for layer in canonical.layers(model, impl, **facts)
             if layer.kind in FAN_IN_FAN_OUT]
    state = canonical.read(model, impl, **facts)
    names = tuple(names)
    unknown = [n for n in names if not any(_named(layer.name, n) for layer in found)]
    if unknown:
        known = sorted({layer.name.rsplit(".", 1)[-1] for layer in found})
        raise ValueError(f"no layer of the {impl} model is named {unknown[0]!r} (its linear "
                         f"layers: {', '.join(known)})")
    out = []
    for layer in found:
        if any(_named(layer.name, n) for n in names):
            fan = FAN_IN_FAN_OUT[layer.kind]
            shape = np.shape(state[f"{layer.name}.weight"])
            n_in, n_out = shape if fan else shape[::-1]
            out.append(Target(layer.name, layer.path or tuple(layer.name.split(".")),
                              n_in, n_out, fan))
    return out


def _named(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def initial_factors(found: list[Target], spec: LoraSpec, seed: int
                    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """peft's initialisation, canonical layout: A `(rank, in)` uniform in +-1/sqrt(in)
    (kaiming-uniform, a = sqrt(5)), B `(out, rank)` zeros; each layer's draw keyed by `seed`
    and its canonical name."""
    out = {}
    for t in found:
        key = jax.random.fold_in(jax.random.key(seed), zlib.crc32(t.name.encode()))
        bound = 1.0 / math.sqrt(t.in_features)
        a = jax.random.uniform(key, (spec.rank, t.in_features), jnp.float32, -bound, bound)
        out[t.name] = (np.asarray(a), np.zeros((t.out_features, spec.rank), np.float32))
    return out


def add(model: Any, impl: str, rank: int = 8, alpha: float = 16,
        targets: Iterable[str] | str = ("q_proj", "v_proj"), dropout: float = 0.0,
        seed: int = 0, use_rslora: bool = False) -> Any:
    """`model` (a native model of `impl`, left as it was) with LoRA on the `targets` layers,
    initialised as peft does; a bad target name, rank or alpha refused in one line."""
    spec = _spec(rank, alpha, targets, dropout, use_rslora)
    found = find_targets(model, impl, spec.targets)
    return _module(impl).wrap(model, found, initial_factors(found, spec, seed), spec)


def attach(model: Any, impl: str, given: Adapter) -> Any:
    """The plain `model` with the adapter `given` (its factors, checked against each layer's
    sizes: a ValueError names the layer and the shapes)."""
    found = find_targets(model, impl, given.spec.targets)
    names = {t.name for t in found}
    if set(given.factors) != names:
        missing, extra = sorted(names - set(given.factors)), sorted(set(given.factors) - names)
        raise ValueError(f"the adapter's layers do not match the model's targets: missing "
                         f"{missing[:3]}, unexpected {extra[:3]}")
    for t in found:
        a, b = given.factors[t.name]
        want = ((given.spec.rank, t.in_features), (t.out_features, given.spec.rank))
        if (np.shape(a), np.shape(b)) != want:
            raise ValueError(f"{t.name}: lora_A / lora_B shapes {np.shape(a)} / {np.shape(b)}, "
                             f"the layer needs {want[0]} / {want[1]}")
    return _module(impl).wrap(model, found, given.factors, given.spec)


def adapter(model: Any, impl: str) -> Adapter:
    """The adapter of a LoRA model (spec and canonical factors, as NumPy arrays)."""
    lora = _module(impl)
    spec = lora.spec(model)
    if spec is None:
        raise ValueError(f"the {impl} model has no LoRA layers (zoo.lora.add gives them)")
    plain = lora.unwrap(model)
    found = find_targets(plain, impl, spec.targets)
    factors = {k: (np.asarray(a), np.asarray(b)) for k, (a, b) in lora.factors(model).items()}
    return Adapter(spec, factors, any(t.fan_in_fan_out for t in found))


def base(model: Any, impl: str) -> Any:
    """The plain model under a LoRA model: the adapters removed, the weights as they were
    (peft's `unload`)."""
    return _module(impl).unwrap(model)


def _shifted(plain: Any, impl: str, given: Adapter, sign: float) -> Any:
    facts = _facts(plain, impl)
    state = dict(canonical.read(plain, impl, **facts))
    for t in find_targets(plain, impl, given.spec.targets):
        a, b = (jnp.asarray(f, jnp.float32) for f in given.factors[t.name])
        delta = sign * given.spec.scale * (b @ a)
        w = state[f"{t.name}.weight"]
        state[f"{t.name}.weight"] = (w + (delta.T if t.fan_in_fan_out else delta)).astype(w.dtype)
    return canonical.write(plain, state, impl, **facts)


def merge(model: Any, impl: str) -> Any:
    """A plain model computing what the LoRA `model` computes: each adapted weight plus
    `scale * B @ A` (peft's `merge_and_unload`); converters and `--to hub` take it as any."""
    return _shifted(base(model, impl), impl, adapter(model, impl), 1.0)


def unmerge(merged: Any, impl: str, given: Adapter) -> Any:
    """The plain model before `merge`: each adapted weight of `merged` minus `scale * B @ A`
    of the adapter `given` (`zoo.lora.adapter` of the LoRA model)."""
    return _shifted(merged, impl, given, -1.0)


def save(model: Any, impl: str, folder: Any, base_model_name_or_path: str | None = None) -> None:
    """Write the LoRA `model`'s adapter as peft does (`zoo.lora.peft`)."""
    from zoo.lora.peft import write

    write(adapter(model, impl), folder, base_model_name_or_path)


def load(model: Any, impl: str, folder: Any) -> Any:
    """The plain `model` with the adapter of a peft folder (`adapter_config.json`,
    `adapter_model.safetensors`, written by peft or `save`)."""
    from zoo.lora.peft import read

    return attach(model, impl, read(folder))
