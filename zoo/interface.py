"""A small uniform functional interface over the three JAX libraries.

Tests and benchmarks use it so that they never special-case a library:

    api = zoo.interface("nnx")
    static, params, state = api.split(model)        # once, outside any timed region
    y, state = api.apply(static, params, state, api.to_native(x), train=True, key=key)

`params` is the differentiable pytree, `state` the BatchNorm statistics (or None), `static`
everything else. `apply` is pure: jit it with `static` closed over or marked static.
Inputs and outputs of `to_native` / `to_canonical` are batched, in the canonical channels-first
layout `(N, C, *spatial)`; token models' `(N, L)` ids and `(N, L, vocab)` logits have one layout
in every library (pass the config: `api.to_native(x, config)`).

A model's other inputs are keyword arguments of `apply`, passed to its call as they are, every
one batched along its first axis (a language model's `attention_mask` and `position_ids`:
`api.apply(static, params, state, ids, attention_mask=mask)`; None is left out). Equinox
models, called per sample, get each sample's slice under the same `vmap`.

Whole native models, the zoo's or a user's own (a Linen module without `train=`, an
`eqx.nn.MLP`, an NNX tutorial model), have the per-library operations that tools otherwise
special-case: `forward` (one eval-mode call that leaves the caller's model as it was),
`eval_fn` (the same, pure, to jit or trace), `clone` (a copy safe to write into) and
`checkpoint_tree` (what the library's own checkpointing stores). `zoo.native_interface(impl)`
gives them for PyTorch too, with the layout but no functional split / merge / apply.

Language models decode through `generate` (`zoo.generate`): the JAX libraries give their
decoding step in their own idiom (`decoding`: Equinox's explicit cache, Linen's "cache"
collection, NNX's `nnx.Cache` variables) to one decode loop (`zoo.runtime.generation.loop`);
PyTorch's reference runs its own.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from canonical.walkers import list_item_name


def _channels_last(x: jax.Array) -> jax.Array:
    return x if x.ndim <= 2 else x.transpose(0, *range(2, x.ndim), 1)


def _channels_first(x: jax.Array) -> jax.Array:
    return x if x.ndim <= 2 else x.transpose(0, x.ndim - 1, *range(1, x.ndim - 1))


def _has_channels(config: Any) -> bool:
    """Whether arrays of `config`'s architecture have a channel axis (unknown: they do)."""
    return getattr(config, "CHANNELS", True)


def _takes(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` accepts the keyword `name` (a user's model may take no `train=`/`key=`)."""
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class Interface:
    """split / merge / apply, plus layout changes between canonical and native inputs, and the
    whole-model operations (`forward`, `eval_fn`, `clone`, `checkpoint_tree`).

    `apply` passes `train=` / `key=` only to models whose `__call__` takes them, so models not
    built by the zoo run too (in eval mode: they have no training switch to give).
    """

    impl: ClassVar[str]
    channels_last: ClassVar[bool]

    def split(self, model: Any) -> tuple[Any, Any, Any]:
        raise NotImplementedError(f"{self.impl} has no functional split")

    def merge(self, static: Any, params: Any, state: Any) -> Any:
        raise NotImplementedError(f"{self.impl} has no functional merge")

    def apply(self, static: Any, params: Any, state: Any, x: jax.Array, *, train: bool = False,
              key: jax.Array | None = None, **inputs: Any) -> tuple[jax.Array, Any]:
        raise NotImplementedError(f"{self.impl} has no functional apply")

    def leaf_names(self, static: Any, params: Any) -> list[str]:
        """The dotted name of each leaf of `params`, in `jax.tree.leaves` order: its native
        path, list items as `.N` (`transformer.h.0.attn.c_attn.weight`); what a partition
        (`zoo.partition.Partition`) matches."""
        return [_dotted(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]

    def partition(self, static: Any, params: Any,
                  trainable: Callable[[str], bool]) -> tuple[Any, Any]:
        """`(trainable, frozen)`: `params` split two ways by `trainable(name)` of each leaf's
        name, each part with None in the other's places (Equinox's `eqx.partition`); a
        ValueError when nothing would train."""
        names = self.leaf_names(static, params)
        if not any(trainable(n) for n in names):
            raise ValueError(f"the partition {trainable!r} trains none of the {len(names)} "
                             "parameters")
        mask = jax.tree.unflatten(jax.tree.structure(params), [trainable(n) for n in names])
        return eqx.partition(params, mask)

    def combine(self, trainable: Any, frozen: Any) -> Any:
        """The inverse of `partition`: the whole parameter tree."""
        return eqx.combine(trainable, frozen)

    def to_native(self, x: jax.Array, config: Any = None) -> jax.Array:
        """A canonical batch in this library's layout: channels last for Flax, unless
        `config` (the model's `zoo.Config`) says its samples have no channel axis (tokens)."""
        return _channels_last(x) if self.channels_last and _has_channels(config) else x

    def to_canonical(self, y: jax.Array, config: Any = None) -> jax.Array:
        """The inverse of `to_native` (outputs: channels first, token models' as they are)."""
        return _channels_first(y) if self.channels_last and _has_channels(config) else y

    def eval_fn(self, model: Any) -> tuple[Callable[[Any, Any], Any], Any]:
        """(fn, arrays): `fn(arrays, x)` is the eval-mode output of the whole native `model` on
        the native batch `x`, a pure function of the model's arrays (a skeleton's abstract ones
        too) to `jax.jit` or `jax.make_jaxpr`. Nothing reaches the caller's model."""
        static, params, state = self.split(model)

        def fn(arrays: Any, x: Any) -> Any:
            return self.apply(static, *arrays, x, train=False)[0]

        return fn, (params, state)

    def forward(self, model: Any, x: Any) -> Any:
        """The eval-mode output of the whole native `model` (zoo-built or not) on the native
        batch `x`, in one compiled call; the caller's model is not changed."""
        fn, arrays = self.eval_fn(model)
        return jax.jit(fn)(arrays, x)

    def call(self, model: Any, method: str, x: Any, *, inputs: dict[str, Any] | None = None,
             **kwargs: Any) -> Any:
        """The eval-mode result of the native `model`'s `method` (`forward_features`,
        `forward_head`, `forward_intermediates`, `encode`, ...) on the native batch `x`, as the
        method returns it (an array, or lists / tuples of them); `inputs`: other batched
        inputs by keyword (an attention mask; None: left out), `kwargs` the method's options;
        the caller's model is not changed."""
        raise NotImplementedError(f"{self.impl} models have no method calls here")

    def clone(self, model: Any) -> Any:
        """A model that writing into leaves `model` as it was (immutable ones are their own)."""
        return model

    def checkpoint_tree(self, model: Any) -> Any:
        """The tree of arrays the library's own checkpointing stores for `model`."""
        raise NotImplementedError

    def decoding(self, model: Any, batch: int, max_length: int) -> Any:
        """The language `model`'s decoding step, pure (`zoo.runtime.generation.loop.Prepared`), with
        an
        empty KV cache of `batch` sequences of `max_length` slots; `model` stays as it was."""
        raise NotImplementedError(f"{self.impl} models have no decoding step")

    def generate(self, model: Any, ids: np.ndarray, mask: np.ndarray, settings: Any,
                 style: str = "compiled") -> Any:
        """The sequences `model` generates after the prompt `ids`, `mask` `(N, L)` under
        `settings` (`zoo.runtime.generation.Settings`), through the library's `decoding` step in the
        decode loop's call `style` (compiled once per model structure, settings and prompt
        bucket: `zoo.runtime.generation.loop.generate`)."""
        from zoo.runtime.generation.loop import generate

        limit = getattr(_config_of(model), "max_length", None)
        return generate(lambda batch, length: self.decoding(model, batch, length), ids, mask,
                        settings, limit, style)


def _dotted(path: tuple) -> str:
    """A key path (`jax.tree_util`) as a dotted name, list indices as `.N`."""
    parts = (getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path)
    return ".".join(str(p) for p in parts)


def _given(inputs: dict[str, Any]) -> dict[str, Any]:
    """The other inputs given (None: left out, the model's default)."""
    return {k: v for k, v in inputs.items() if v is not None}


def _is_param(a: Any) -> bool:
    """A floating array, or a skeleton's abstract one (`eqx.filter_eval_shape`)."""
    return eqx.is_inexact_array(a) or (
        isinstance(a, jax.ShapeDtypeStruct) and jnp.issubdtype(a.dtype, jnp.inexact))


class EqxInterface(Interface):
    """Per-sample models batched with `jax.vmap(axis_name="batch")`; one dropout key per sample.
    """

    impl = "eqx"
    channels_last = False

    def split(self, model: Any) -> tuple[Any, Any, Any]:
        model, state = model if isinstance(model, tuple) else (model, None)
        params, static = eqx.partition(model, _is_param)
        return static, params, state

    def merge(self, static: Any, params: Any, state: Any) -> Any:
        model = eqx.combine(params, static)
        return model if state is None else (model, state)

    def apply(self, static, params, state, x, *, train=False, key=None, **inputs):
        model = eqx.combine(params, static)
        if not train:
            model = eqx.nn.inference_mode(model)
        keys = None if key is None else jax.random.split(key, x.shape[0])
        kw = (lambda ki: {"key": ki}) if _takes(type(model).__call__, "key") else (lambda ki: {})
        inputs = _given(inputs)  # each sample's slice of every other input, as keywords
        if state is not None:  # a fresh handle: the caller's state stays usable (pure apply)
            leaves, treedef = jax.tree.flatten(state)
            state = jax.tree.unflatten(treedef, leaves)
        if state is None:
            y = jax.vmap(lambda xi, ki, more: model(xi, **kw(ki), **more))(x, keys, inputs)
            return y, None
        return jax.vmap(lambda xi, ki, more: model(xi, state, **kw(ki), **more),
                        axis_name="batch", out_axes=(0, None))(x, keys, inputs)

    def call(self, model: Any, method: str, x: Any, *, inputs: dict[str, Any] | None = None,
             **kwargs: Any) -> Any:
        model, state = model if isinstance(model, tuple) else (model, None)
        fn = getattr(eqx.nn.inference_mode(model), method)
        more = _given(inputs or {})  # each sample's slice, as keywords
        if state is not None and _takes(fn, "state"):  # (output, state): the output
            return jax.vmap(lambda xi, m: fn(xi, state, **m, **kwargs)[0],
                            axis_name="batch")(x, more)
        return jax.vmap(lambda xi, m: fn(xi, **m, **kwargs))(x, more)

    def checkpoint_tree(self, model: Any) -> Any:
        return model  # `eqx.tree_serialise_leaves` stores the model (or `(model, state)`)

    def decoding(self, model: Any, batch: int, max_length: int) -> Any:
        """Equinox's explicit cache: `model(ids, ..., cache=cache) -> (logits, cache)` per
        sequence, vmapped over a batch of caches."""
        from zoo.runtime.generation.loop import Prepared

        model = eqx.nn.inference_mode(model[0] if isinstance(model, tuple) else model)
        params, static = eqx.partition(model, eqx.is_array)
        one = model.init_cache(max_length)
        # the sequences' keys and values batched, their common index not: a batched index
        # would turn every cache write into a scatter
        axes = type(one)(keys=0, values=0, index=None)
        cache = type(one)(*(tuple(jnp.zeros((batch, *a.shape), a.dtype) for a in kv)
                            for kv in (one.keys, one.values)), one.index)

        def apply(params, cache, ids, mask, positions):
            m = eqx.combine(params, static)
            call = lambda i, c, a, p: m(i, attention_mask=a, position_ids=p, cache=c)
            return jax.vmap(call, in_axes=(0, axes, 0, 0), out_axes=(0, axes))(
                ids, cache, mask, positions)

        return Prepared(apply, params, cache, max_length, jax.tree.structure(static))


class LinenInterface(Interface):
    """`module.apply` with the non-`params` collections as state (mutable in training)."""

    impl = "linen"
    channels_last = True

    def split(self, model: Any) -> tuple[Any, Any, Any]:
        module, variables = model
        state = {k: v for k, v in variables.items() if k != "params"} or None
        return module, variables["params"], state

    def merge(self, static: Any, params: Any, state: Any) -> Any:
        return static, {"params": params, **(state or {})}

    def leaf_names(self, static: Any, params: Any) -> list[str]:
        """Linen names a list's items `h_0`: `h.0` here, as in the other libraries (read on
        the module bound to `params`)."""
        bound = static.bind({"params": params})
        names = []
        for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
            owner, parts = bound, []
            for key in path:
                part = str(getattr(key, "key", key))
                parts.append(list_item_name(owner, part))
                owner = _child(owner, parts[-1])
            names.append(".".join(parts))
        return names

    def apply(self, static, params, state, x, *, train=False, key=None, **inputs):
        variables = {"params": params, **(state or {})}
        rngs = None if key is None else {"dropout": key}
        kw = {"train": train} if _takes(type(static).__call__, "train") else {}
        kw |= _given(inputs)
        if train and state:
            y, updates = static.apply(variables, x, rngs=rngs, mutable=list(state), **kw)
            return y, dict(updates)
        return static.apply(variables, x, rngs=rngs, **kw), state

    def call(self, model: Any, method: str, x: Any, *, inputs: dict[str, Any] | None = None,
             **kwargs: Any) -> Any:
        module, variables = model
        return module.apply(variables, x, method=method, **_given(inputs or {}), **kwargs)

    def clone(self, model: Any) -> Any:
        """The module (immutable) with new containers of the same arrays: the variables'
        dicts can be written into."""
        module, variables = model
        return module, jax.tree.map(lambda a: a, variables)

    def checkpoint_tree(self, model: Any) -> Any:
        return model[1]  # the variables

    def decoding(self, model: Any, batch: int, max_length: int) -> Any:
        """Flax's `decode=True` idiom: `init` on a full-length batch gives the "cache"
        collection's shapes; each step applies with `mutable=["cache"]`."""
        from zoo.runtime.generation.loop import Prepared

        module, variables = model
        module = module.clone(decode=True)
        ids = jax.ShapeDtypeStruct((batch, max_length), jnp.int32)
        shapes = jax.eval_shape(module.init, jax.random.key(0), ids)["cache"]
        cache = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)

        def apply(params, cache, ids, mask, positions):
            logits, updated = module.apply({"params": params, "cache": cache}, ids,
                                           attention_mask=mask, position_ids=positions,
                                           mutable=["cache"])
            return logits, updated["cache"]

        return Prepared(apply, variables["params"], cache, max_length, module)


class NNXInterface(Interface):
    """`nnx.split(model, nnx.Param, ...)`: params, then everything else (BatchStat) as state.
    Flax is imported when an NNX model is at hand."""

    impl = "nnx"
    channels_last = True

    def split(self, model: Any) -> tuple[Any, Any, Any]:
        from flax import nnx

        return nnx.split(model, nnx.Param, ...)

    def merge(self, static: Any, params: Any, state: Any) -> Any:
        from flax import nnx

        return nnx.merge(static, params, state)

    def leaf_names(self, static: Any, params: Any) -> list[str]:
        names = super().leaf_names(static, params)  # each Variable's array is its `.value`
        return [n.removesuffix(".value") for n in names]

    def partition(self, static: Any, params: Any,
                  trainable: Callable[[str], bool]) -> tuple[Any, Any]:
        """NNX's idiom: `nnx.split_state` with a filter on each Variable's path."""
        from flax import nnx

        names = self.leaf_names(static, params)
        if not any(trainable(n) for n in names):
            raise ValueError(f"the partition {trainable!r} trains none of the {len(names)} "
                             "parameters")
        chosen = lambda path, _: trainable(".".join(str(p) for p in path))
        return nnx.split_state(params, chosen, ...)

    def combine(self, trainable: Any, frozen: Any) -> Any:
        from flax import nnx

        return nnx.merge_state(trainable, frozen)

    def apply(self, static, params, state, x, *, train=False, key=None, **inputs):
        from flax import nnx

        model = nnx.merge(static, params, state, copy=True)  # never mutate the caller's state
        model.train() if train else model.eval()
        inputs = _given(inputs)
        y = model(x, **inputs) if key is None else model(x, rngs=key, **inputs)
        return y, nnx.split(model, nnx.Param, ...)[2]

    def call(self, model: Any, method: str, x: Any, *, inputs: dict[str, Any] | None = None,
             **kwargs: Any) -> Any:
        from flax import nnx

        m = nnx.clone(model)
        m.eval()
        return getattr(m, method)(x, **_given(inputs or {}), **kwargs)

    def clone(self, model: Any) -> Any:
        from flax import nnx

        return nnx.clone(model)

    def checkpoint_tree(self, model: Any) -> Any:
        from flax import nnx

        return nnx.state(model)

    def decoding(self, model: Any, batch: int, max_length: int) -> Any:
        """NNX's idiom on a copy of `model`: `init_cache` puts `nnx.Cache` variables on it;
        `nnx.split` / `nnx.merge` make the step pure."""
        from flax import nnx

        from zoo.runtime.generation.loop import Prepared

        model = nnx.clone(model)
        model.eval()
        model.init_cache(batch, max_length)
        graphdef, cache, weights = nnx.split(model, nnx.Cache, ...)

        def apply(weights, cache, ids, mask, positions):
            m = nnx.merge(graphdef, cache, weights)
            logits = m(ids, attention_mask=mask, position_ids=positions)
            return logits, nnx.state(m, nnx.Cache)

        return Prepared(apply, weights, cache, max_length, graphdef)


class TorchInterface(Interface):
    """PyTorch: no functional split / merge / apply (modules are stateful), only the layout
    and the whole-model operations. torch is imported when a model is at hand."""

    impl = "torch"
    channels_last = False

    def eval_fn(self, model: Any) -> tuple[Callable[[Any, Any], Any], Any]:
        raise NotImplementedError("a PyTorch module cannot be traced by JAX")

    def forward(self, model: Any, x: Any) -> Any:
        import torch

        m = copy.deepcopy(model).eval()  # eval mode on a copy: the caller's model keeps its own
        with torch.no_grad():
            return m(torch.from_numpy(np.array(x))).numpy()

    def call(self, model: Any, method: str, x: Any, *, inputs: dict[str, Any] | None = None,
             **kwargs: Any) -> Any:
        import torch

        m = copy.deepcopy(model).eval()
        more = {k: torch.as_tensor(np.array(v)) for k, v in _given(inputs or {}).items()}
        with torch.no_grad():  # tensors, or lists / tuples of them (forward_intermediates)
            out = getattr(m, method)(torch.as_tensor(np.array(x)), **more, **kwargs)
        return jax.tree.map(lambda t: t.numpy(), out)

    def clone(self, model: Any) -> Any:
        return copy.deepcopy(model)

    def checkpoint_tree(self, model: Any) -> Any:
        return model.state_dict()

    def generate(self, model: Any, ids: np.ndarray, mask: np.ndarray, settings: Any,
                 style: str = "eager") -> Any:
        """The reference's own decode loop (`zoo.runtime.generation.torch`), eager."""
        from zoo.runtime.generation.torch import generate

        limit = getattr(_config_of(model), "max_length", None)
        return generate(model, ids, mask, settings,
                        settings.cache_length(ids.shape[1], limit))


def _child(owner: Any, name: str) -> Any:
    """The sub-module `name` (`h.0`: an item of the list `h`) of a bound Linen module, or
    None where it is not an attribute (a compact module's)."""
    attr, *index = name.split(".")
    child = getattr(owner, attr, None) if owner is not None else None
    for i in index:
        child = child[int(i)] if isinstance(child, list | tuple) else None
    return child


def _config_of(model: Any) -> Any:
    """The zoo config of a native model (`(model, state)` and `(module, variables)` pairs
    included), or None."""
    if isinstance(model, tuple):
        model = model[0]
    return getattr(model, "config", None)
