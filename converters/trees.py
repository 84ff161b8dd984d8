"""Walk each library's model tree: find the layers, read their arrays, write new ones.

A `Tree` per implementation knows how to find the parameterised layers of a native model (by
layer type, at any depth, named by their path), how to read a layer's native arrays and how to
build a new model with replaced arrays. It knows nothing about architectures: `converters.core`
combines it with the per-layer-type rules in `converters.rules`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from converters.rules import Layer
from zoo.configs import Config
from zoo.layers.batch_norm import BatchNorm as EqxBatchNorm

Arrays = dict[str, Any]


def _path_name(path: tuple[Any, ...]) -> str:
    parts = []
    for key in path:
        for attr in ("name", "key", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts)


def _submodule(model: Any, name: str) -> Any:
    """Follow a dotted path (attributes and list indices) from `model`."""
    m = model
    for part in name.split("."):
        m = m[int(part)] if isinstance(m, list | tuple) else getattr(m, part)
    return m


class Tree:
    """Interface: one subclass per implementation."""

    impl: ClassVar[str]
    family: ClassVar[str]

    def config(self, model: Any) -> Config:
        raise NotImplementedError

    def layers(self, model: Any) -> list[Layer]:
        raise NotImplementedError

    def read(self, model: Any, layer: Layer) -> Arrays:
        raise NotImplementedError

    def write(self, skeleton: Any, arrays: dict[str, Arrays], layers: list[Layer]) -> Any:
        """A new model: `skeleton` with every layer's arrays replaced (skeleton untouched)."""
        raise NotImplementedError


# --------------------------------------------------------------------------- Equinox
def _eqx_kind(m: Any) -> str | None:
    if isinstance(m, eqx.nn.Linear):
        return "linear"
    if isinstance(m, eqx.nn.ConvTranspose):
        return "conv_transpose"
    if isinstance(m, eqx.nn.Conv):
        return "conv"
    if isinstance(m, EqxBatchNorm):
        return "batch_norm"
    return None


class EqxTree(Tree):
    """Equinox: `model` or `(model, state)`; BatchNorm statistics live in the `eqx.nn.State`."""

    impl = "eqx"
    family = "eqx"

    @staticmethod
    def split(obj: Any) -> tuple[eqx.Module, eqx.nn.State | None]:
        return obj if isinstance(obj, tuple) else (obj, None)

    def config(self, obj: Any) -> Config:
        return self.split(obj)[0].config

    def layers(self, obj: Any) -> list[Layer]:
        model, _ = self.split(obj)
        flat, _ = jax.tree_util.tree_flatten_with_path(
            model, is_leaf=lambda m: _eqx_kind(m) is not None
        )
        flatten = model.config.flatten_shapes()
        out = []
        for path, m in flat:
            kind = _eqx_kind(m)
            if kind is None:
                continue
            name = _path_name(path)
            out.append(Layer(
                name, kind, spatial_dims=getattr(m, "num_spatial_dims", 0),
                flatten_shape=flatten.get(name), has_bias=getattr(m, "use_bias", True),
            ))
        return out

    def read(self, obj: Any, layer: Layer) -> Arrays:
        model, state = self.split(obj)
        m = _submodule(model, layer.name)
        if layer.kind == "batch_norm":
            if state is None:
                raise ValueError(
                    f"Equinox model has BatchNorm {layer.name!r}: pass (model, state)"
                )
            mean, var = state.get(m.state_index)
            return {"weight": m.weight, "bias": m.bias, "mean": mean, "var": var}
        arrays = {"weight": m.weight}
        if layer.has_bias:
            arrays["bias"] = m.bias
        return arrays

    def write(self, skeleton: Any, arrays: dict[str, Arrays], layers: list[Layer]) -> Any:
        model, state = self.split(skeleton)
        flat, treedef = jax.tree_util.tree_flatten_with_path(
            model, is_leaf=lambda m: _eqx_kind(m) is not None
        )
        leaves = []
        for path, m in flat:
            a = arrays.get(_path_name(path)) if _eqx_kind(m) is not None else None
            if a is not None:
                names = [k for k in ("weight", "bias") if k in a]
                m = eqx.tree_at(lambda lay, ns=names: [getattr(lay, k) for k in ns], m,
                                [a[k] for k in names])
                if "mean" in a:  # statistics become the StateIndex's initial value (any dtype)
                    m = eqx.tree_at(lambda lay: lay.state_index.init, m, (a["mean"], a["var"]),
                                    is_leaf=lambda x: x is None)
            leaves.append(m)
        new_model = jax.tree_util.tree_unflatten(treedef, leaves)
        if state is None:
            return new_model
        # As eqx.nn.make_with_state does: collect the state, then drop it from the model.
        return eqx.nn.delete_init_state(new_model), eqx.nn.State(new_model)


# --------------------------------------------------------------------------- Flax Linen
def _flax_kind(m: Any) -> str | None:
    if isinstance(m, nn.Dense | nnx.Linear):
        return "linear"
    if isinstance(m, nn.ConvTranspose | nnx.ConvTranspose):
        return "conv_transpose"
    if isinstance(m, nn.Conv | nnx.Conv):
        return "conv"
    if isinstance(m, nn.BatchNorm | nnx.BatchNorm):
        return "batch_norm"
    return None


def _flax_layer(name: str, m: Any, config: Config) -> Layer:
    kind = _flax_kind(m)
    if kind in ("conv", "conv_transpose") and not isinstance(m.kernel_size, tuple | list):
        raise ValueError(f"Flax layer {name!r} has an int kernel_size (a 1-D kernel): pass a tuple")
    dims = len(m.kernel_size) if kind in ("conv", "conv_transpose") else 0
    return Layer(name, kind, spatial_dims=dims, flatten_shape=config.flatten_shapes().get(name),
                 has_bias=getattr(m, "use_bias", True))


class LinenTree(Tree):
    """Linen: `(module, variables)` with `params` and (if any BatchNorm) `batch_stats`."""

    impl = "linen"
    family = "flax"

    def config(self, obj: Any) -> Config:
        return obj[0].config

    def layers(self, obj: Any) -> list[Layer]:
        module, variables = obj
        found: dict[str, Any] = {}

        def record(next_fun, args, kwargs, context):
            m = context.module
            if context.method_name == "__call__" and _flax_kind(m) is not None:
                found.setdefault(".".join(m.path), m)
            return next_fun(*args, **kwargs)

        config = module.config
        c, *spatial = config.input_shape
        x = jax.ShapeDtypeStruct((1, *spatial, c), jnp.float32)
        with nn.intercept_methods(record):
            jax.eval_shape(lambda v, x: module.apply(v, x, train=False), variables, x)
        return [_flax_layer(name, m, config) for name, m in found.items()]

    @staticmethod
    def _get(tree: dict, name: str) -> dict:
        for part in name.split("."):
            tree = tree[part]
        return tree

    def read(self, obj: Any, layer: Layer) -> Arrays:
        _, variables = obj
        arrays = dict(self._get(variables["params"], layer.name))
        if layer.kind == "batch_norm":
            arrays.update(self._get(variables["batch_stats"], layer.name))
        return arrays

    def write(self, skeleton: Any, arrays: dict[str, Arrays], layers: list[Layer]) -> Any:
        module, _ = skeleton
        variables: dict[str, dict] = {}
        for layer in layers:
            a = arrays[layer.name]
            stats = {k: a[k] for k in ("mean", "var") if k in a}
            params = {k: v for k, v in a.items() if k not in stats}
            for collection, values in (("params", params), ("batch_stats", stats)):
                if values:
                    node = variables.setdefault(collection, {})
                    for part in layer.name.split("."):
                        node = node.setdefault(part, {})
                    node.update(values)
        return module, variables


# --------------------------------------------------------------------------- Flax NNX
class NNXTree(Tree):
    """NNX: the module itself; statistics are `nnx.BatchStat` variables."""

    impl = "nnx"
    family = "flax"

    def config(self, model: Any) -> Config:
        return model.config

    def layers(self, model: Any) -> list[Layer]:
        return [
            _flax_layer(_path_name(path), m, model.config)
            for path, m in nnx.iter_modules(model)
            if _flax_kind(m) is not None
        ]

    def read(self, model: Any, layer: Layer) -> Arrays:
        m = _submodule(model, layer.name)
        names = ("scale", "bias", "mean", "var") if layer.kind == "batch_norm" else (
            ("kernel", "bias") if layer.has_bias else ("kernel",))
        return {k: getattr(m, k)[...] for k in names}

    def write(self, skeleton: Any, arrays: dict[str, Arrays], layers: list[Layer]) -> Any:
        for layer in layers:
            m = _submodule(skeleton, layer.name)
            for k, v in arrays[layer.name].items():
                getattr(m, k).set_value(v)
        return skeleton


# --------------------------------------------------------------------------- PyTorch
class TorchTree(Tree):
    """PyTorch: the `nn.Module`; its `state_dict` already is the canonical layout."""

    impl = "torch"
    family = "torch"

    def config(self, model: Any) -> Config:
        return model.config

    def layers(self, model: Any) -> list[Layer]:
        from torch import nn as tnn

        kinds = ((tnn.Linear, "linear"), (tnn.modules.conv._ConvTransposeNd, "conv_transpose"),
                 (tnn.modules.conv._ConvNd, "conv"), (tnn.modules.batchnorm._BatchNorm,
                                                      "batch_norm"))
        out = []
        for name, m in model.named_modules():
            kind = next((k for cls, k in kinds if isinstance(m, cls)), None)
            if kind is not None:
                dims = len(m.kernel_size) if kind in ("conv", "conv_transpose") else 0
                out.append(Layer(name, kind, spatial_dims=dims, has_bias=m.bias is not None))
        return out

    def read(self, model: Any, layer: Layer) -> Arrays:
        prefix = layer.name + "."
        return {k[len(prefix):]: torch_to_numpy(v) for k, v in model.state_dict().items()
                if k.startswith(prefix)}

    def write(self, skeleton: Any, arrays: dict[str, Arrays], layers: list[Layer]) -> Any:
        state = {f"{name}.{k}": numpy_to_torch(v) for name, a in arrays.items()
                 for k, v in a.items()}
        weights = [v.dtype for k, v in state.items() if v.is_floating_point()
                   and not k.endswith(("running_mean", "running_var"))]
        model = skeleton.to(weights[0]) if weights else skeleton
        model.load_state_dict(state, strict=True)
        for key, value in state.items():  # statistics may stay float32 under bf16 weights
            prefix, _, name = key.rpartition(".")
            if value.dtype != getattr(model.get_submodule(prefix), name).dtype:
                model.get_submodule(prefix).register_buffer(name, value)
        return model


TREES: dict[str, Tree] = {t.impl: t for t in (EqxTree(), LinenTree(), NNXTree(), TorchTree())}


def torch_to_numpy(t: Any) -> np.ndarray:
    """A torch tensor as a numpy array of the same dtype (bfloat16 through ml_dtypes)."""
    import ml_dtypes
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def numpy_to_torch(a: Any) -> Any:
    import ml_dtypes
    import torch

    a = np.asarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True))


def parameter_count(arrays: dict[str, Any]) -> int:
    return sum(math.prod(np.shape(v)) for k, v in arrays.items()
               if not k.endswith("num_batches_tracked"))
