"""The built-in layer kinds: one conversion rule per layer type (docs/conventions.md).

Families are parameter layouts (`canonical.layouts`): "eqx", "flax" (Linen and NNX) and "torch"
(the canonical layout itself); the rules read their facts. Rules use only `.transpose`,
`.reshape`, `.swapaxes` and slicing, which numpy and JAX arrays both provide, so round trips
are bitwise. Optional arrays (a bias) are converted when present.

Initialisation (PyTorch's defaults): Linear, Conv and ConvTranspose weights and biases are
``U(-b, b)`` with ``b = 1/sqrt(weight.shape[1] * prod(kernel))``, weight drawn first; norms
weight 1, bias 0, BatchNorm statistics mean 0, var 1, counter 0; Embedding ``N(0, 1)``; bare
parameters ``N(0, 0.02)`` (timm's class token and position embedding); GRN weight and bias 0
(timm's: the layer starts as the identity); transformers' `Conv1D` its own ``N(0, 0.02)`` weight
and zero bias; the `(1 + weight)` RMSNorm (Gemma's) weight 0; a mixture's stacked experts
``U(-b, b)`` per expert with ``b = 1/sqrt(in)`` (each expert as a Linear).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from canonical.kinds import Arrays, Layer, LayerKind, register_kind
from canonical.layouts import layout


def flip_spatial(w: Any, first_spatial: int = 2) -> Any:
    """Reverse every axis from `first_spatial` on (the kernel's spatial axes)."""
    n = w.ndim - first_spatial
    return w[(slice(None),) * first_spatial + (slice(None, None, -1),) * n]


def _renamed(arrays: Arrays, names: dict[str, str], **transforms: Any) -> Arrays:
    """`arrays` with keys renamed by `names` (absent keys skipped), values passed through
    `transforms[new_name]` where given."""
    out = {}
    for old, new in names.items():
        if old in arrays:
            f = transforms.get(new)
            out[new] = arrays[old] if f is None else f(arrays[old])
    return out


# --------------------------------------------------------------------------- initialisation
def uniform_fan_in(shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> Arrays:
    bound = 1.0 / math.sqrt(math.prod(shapes["weight"][1:]))
    return {k: rng.uniform(-bound, bound, shapes[k]) for k in ("weight", "bias") if k in shapes}


def affine_identity(shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> Arrays:
    out = {"weight": np.ones(shapes["weight"])} if "weight" in shapes else {}
    return out | ({"bias": np.zeros(shapes["bias"])} if "bias" in shapes else {})


def _batch_norm_init(shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> Arrays:
    c = shapes["running_mean"]
    return affine_identity(shapes, rng) | {
        "running_mean": np.zeros(c), "running_var": np.ones(c),
        "num_batches_tracked": np.zeros((), np.int64)}


# --------------------------------------------------------------------------- linear
# Equinox flattens (C, *spatial) as PyTorch does, so only Flax permutes flattened inputs.
def linear_to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    f = layout(family)
    return _renamed(c, {"weight": f.kernel, "bias": "bias"},
                    **{f.kernel: lambda w: f.dense_kernel(w, layer.flatten_shape)})


def linear_to_canonical(family: str, n: Arrays, layer: Layer) -> Arrays:
    f = layout(family)
    return _renamed(n, {f.kernel: "weight", "bias": "bias"},
                    weight=lambda k: f.dense_kernel_back(k, layer.flatten_shape))


# --------------------------------------------------------------------------- conv
def conv_to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    f = layout(family)
    return _renamed(c, {"weight": f.kernel, "bias": "bias"},
                    **{f.kernel: f.conv_kernel, "bias": lambda b: f.conv_bias(b, c["weight"])})


def conv_to_canonical(family: str, n: Arrays, layer: Layer) -> Arrays:
    f = layout(family)
    return _renamed(n, {f.kernel: "weight", "bias": "bias"},
                    weight=f.conv_kernel_back, bias=f.conv_bias_back)


def conv_transpose_to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    """PyTorch (I, O, *k) -> Equinox (O, I, *k) flipped, Flax (*k, I, O) flipped."""
    f = layout(family)
    w = flip_spatial(c["weight"]).swapaxes(0, 1)
    return {f.kernel: f.conv_kernel(w)} | _renamed(c, {"bias": "bias"},
                                                  bias=lambda b: f.conv_bias(b, w))


def conv_transpose_to_canonical(family: str, n: Arrays, layer: Layer) -> Arrays:
    f = layout(family)
    w = f.conv_kernel_back(n[f.kernel]).swapaxes(0, 1)
    return {"weight": flip_spatial(w)} | _renamed(n, {"bias": "bias"}, bias=f.conv_bias_back)


def _no_int_kernel(module: Any, impl: str, name: str) -> None:
    """Flax reads an int kernel_size as a 1-D kernel (docs/conventions.md): refuse it."""
    if not isinstance(module.kernel_size, tuple | list):  # Equinox and PyTorch store tuples
        raise ValueError(f"Flax layer {name!r} has an int kernel_size (a 1-D kernel): pass a tuple")


# --------------------------------------------------------------------------- norms
def affine_to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    return _renamed(c, {"weight": layout(family).scale, "bias": "bias"})


def affine_to_canonical(family: str, n: Arrays, layer: Layer) -> Arrays:
    return _renamed(n, {layout(family).scale: "weight", "bias": "bias"})


def batch_norm_to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    """Running statistics are copied as stored (see docs/conventions.md on the variance)."""
    return affine_to_native(family, c, layer) | {"mean": c["running_mean"],
                                                 "var": c["running_var"]}


def batch_norm_to_canonical(family: str, n: Arrays, layer: Layer) -> Arrays:
    """The JAX libraries keep no batch counter: `num_batches_tracked` is written as 0."""
    return affine_to_canonical(family, n, layer) | {
        "running_mean": n["mean"], "running_var": n["var"],
        "num_batches_tracked": np.zeros((), np.int64)}


# --------------------------------------------------------------------------- Conv1D
# transformers' `Conv1D` (GPT-2's projections) is a linear layer stored `(in, out)`, computing
# `x @ W + b`: Flax's Dense kernel is that layout as it is; Equinox's Linear holds `(out, in)`.
def conv1d_to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    f = layout(family)
    return _renamed(c, {"weight": f.kernel, "bias": "bias"},
                    **({} if f.channels_last else {f.kernel: lambda w: w.T}))


def conv1d_to_canonical(family: str, n: Arrays, layer: Layer) -> Arrays:
    f = layout(family)
    return _renamed(n, {f.kernel: "weight", "bias": "bias"},
                    **({} if f.channels_last else {"weight": lambda w: w.T}))


# transformers' fused experts (`MixtralExperts`, `Qwen3MoeExperts`): `gate_up_proj` (E, 2I, H)
# (gate rows first, then up) and `down_proj` (E, H, I), Linear weights (out, in) stacked on an
# expert axis. Equinox holds them so; Flax as kernels (E, in, out).
def experts_to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    flip = layout(family).channels_last
    return {k: v.swapaxes(1, 2) if flip else v for k, v in c.items()}


def _experts_init(shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> Arrays:
    return {k: rng.uniform(-1 / math.sqrt(s[-1]), 1 / math.sqrt(s[-1]), s)
            for k, s in shapes.items()}


def _conv1d_init(shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> Arrays:
    """transformers' `Conv1D.__init__`: weight N(0, 0.02), bias 0."""
    out = {"weight": 0.02 * rng.standard_normal(shapes["weight"])}
    return out | ({"bias": np.zeros(shapes["bias"])} if "bias" in shapes else {})


# --------------------------------------------------------------------------- embedding
def embedding_to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    return {layout(family).embedding: c["weight"]}


def embedding_to_canonical(family: str, n: Arrays, layer: Layer) -> Arrays:
    return {"weight": n[layout(family).embedding]}


def zeros(shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> Arrays:
    return {k: np.zeros(s) for k, s in shapes.items()}


def _normal(std: float):
    return lambda shapes, rng: {k: std * rng.standard_normal(s) for k, s in shapes.items()}


# Logical axes (`LayerKind.axes`): what each native array's dimensions mean, per family.
_LINEAR_AXES = {"eqx": {"weight": ("mlp", "embed"), "bias": ("mlp",)},
                "flax": {"kernel": ("embed", "mlp"), "bias": ("mlp",)}}
# Equinox keeps a conv bias as (O, 1, ..., 1); both store transposed kernels as (O, I) / (I, O).
_CONV_AXES = {"eqx": {"weight": ("conv_out", "conv_in", ...), "bias": ("conv_out", ...)},
              "flax": {"kernel": (..., "conv_in", "conv_out"), "bias": ("conv_out",)}}
_CHANNELS = ("channels",)
_BATCH_NORM_AXES = {"eqx": dict.fromkeys(("weight", "bias", "mean", "var"), _CHANNELS),
                    "flax": dict.fromkeys(("scale", "bias", "mean", "var"), _CHANNELS)}
_GROUP_NORM_AXES = {"eqx": dict.fromkeys(("weight", "bias"), _CHANNELS),
                    "flax": dict.fromkeys(("scale", "bias"), _CHANNELS)}
_LAYER_NORM_AXES = {"eqx": dict.fromkeys(("weight", "bias"), ("embed",)),
                    "flax": dict.fromkeys(("scale", "bias"), ("embed",))}
# GRN follows the MLP's first projection (ConvNeXt V2): its channels are the MLP's hidden ones.
_GRN_AXES = {"eqx": dict.fromkeys(("weight", "bias"), ("mlp",)),
             "flax": dict.fromkeys(("scale", "bias"), ("mlp",))}
_EMBEDDING_AXES = {"eqx": {"weight": ("vocab", "embed")}, "flax": {"embedding": ("vocab", "embed")}}
_EXPERTS_AXES = {"eqx": {"gate_up_proj": ("expert", "mlp", "embed"),
                         "down_proj": ("expert", "embed", "mlp")},
                 "flax": {"gate_up_proj": ("expert", "embed", "mlp"),
                          "down_proj": ("expert", "mlp", "embed")}}
_RMS_NORM_AXES = {"eqx": dict.fromkeys(("weight", "bias"), ("embed",)),
                  "flax": {"scale": ("embed",)}}

_TORCH = "torch.nn."
LINEAR = register_kind(LayerKind(
    "linear",
    classes={"eqx": ("equinox.nn.Linear",), "linen": ("flax.linen.Dense",),
             "nnx": ("flax.nnx.Linear",), "torch": (_TORCH + "Linear",)},
    native={"eqx": ("weight", "bias"), "flax": ("kernel", "bias")},
    init=uniform_fan_in, to_native=linear_to_native, to_canonical=linear_to_canonical,
    axes=_LINEAR_AXES))
CONV = register_kind(LayerKind(
    "conv",
    classes={"eqx": ("equinox.nn.Conv",), "linen": ("flax.linen.Conv",),
             "nnx": ("flax.nnx.Conv",), "torch": (_TORCH + "modules.conv._ConvNd",)},
    native={"eqx": ("weight", "bias"), "flax": ("kernel", "bias")},
    init=uniform_fan_in, to_native=conv_to_native, to_canonical=conv_to_canonical,
    check=_no_int_kernel,
    axes=_CONV_AXES))
CONV_TRANSPOSE = register_kind(LayerKind(
    "conv_transpose",
    classes={"eqx": ("equinox.nn.ConvTranspose",), "linen": ("flax.linen.ConvTranspose",),
             "nnx": ("flax.nnx.ConvTranspose",),
             "torch": (_TORCH + "modules.conv._ConvTransposeNd",)},
    native={"eqx": ("weight", "bias"), "flax": ("kernel", "bias")},
    init=uniform_fan_in, to_native=conv_transpose_to_native,
    to_canonical=conv_transpose_to_canonical, check=_no_int_kernel,
    axes=_CONV_AXES))
BATCH_NORM = register_kind(LayerKind(
    "batch_norm",
    # Equinox's own BatchNorm has other semantics (docs/conventions.md): the zoo registers its
    # Flax-semantics layer with `register_class("batch_norm", "eqx", ...)`.
    classes={"linen": ("flax.linen.BatchNorm",), "nnx": ("flax.nnx.BatchNorm",),
             "torch": (_TORCH + "modules.batchnorm._BatchNorm",)},
    native={"eqx": ("weight", "bias", "mean", "var"), "flax": ("scale", "bias", "mean", "var")},
    init=_batch_norm_init, to_native=batch_norm_to_native, to_canonical=batch_norm_to_canonical,
    stats=("mean", "var"), buffers=("running_mean", "running_var", "num_batches_tracked"),
    axes=_BATCH_NORM_AXES))
LAYER_NORM = register_kind(LayerKind(
    "layer_norm",
    classes={"eqx": ("equinox.nn.LayerNorm",), "linen": ("flax.linen.LayerNorm",),
             "nnx": ("flax.nnx.LayerNorm",), "torch": (_TORCH + "LayerNorm",)},
    native={"eqx": ("weight", "bias"), "flax": ("scale", "bias")},
    init=affine_identity, to_native=affine_to_native, to_canonical=affine_to_canonical,
    axes=_LAYER_NORM_AXES))
GROUP_NORM = register_kind(LayerKind(
    "group_norm",
    classes={"eqx": ("equinox.nn.GroupNorm",), "linen": ("flax.linen.GroupNorm",),
             "nnx": ("flax.nnx.GroupNorm",), "torch": (_TORCH + "GroupNorm",)},
    native={"eqx": ("weight", "bias"), "flax": ("scale", "bias")},
    init=affine_identity, to_native=affine_to_native, to_canonical=affine_to_canonical,
    axes=_GROUP_NORM_AXES))
# ConvNeXt V2's Global Response Normalization (timm's `GlobalResponseNorm`): `weight` and
# `bias` of the channels, named `scale` / `bias` in Flax as a norm's. No library ships one: the
# zoo's layers register their classes (`register_class("global_response_norm", impl, cls)`).
GLOBAL_RESPONSE_NORM = register_kind(LayerKind(
    "global_response_norm", classes={},
    native={"eqx": ("weight", "bias"), "flax": ("scale", "bias")},
    init=zeros, to_native=affine_to_native, to_canonical=affine_to_canonical,
    axes=_GRN_AXES))
RMS_NORM = register_kind(LayerKind(
    "rms_norm",
    # The libraries' own RMSNorms (the zoo's, with transformers' float32 statistics and cast,
    # subclass them): a weight (Flax: scale) over the last axis; Equinox's may hold a bias.
    classes={"eqx": ("equinox.nn.RMSNorm",), "linen": ("flax.linen.RMSNorm",),
             "nnx": ("flax.nnx.RMSNorm",), "torch": (_TORCH + "RMSNorm",)},
    native={"eqx": ("weight", "bias"), "flax": ("scale",)},
    init=affine_identity, to_native=affine_to_native, to_canonical=affine_to_canonical,
    axes=_RMS_NORM_AXES))
# transformers' `GemmaRMSNorm`: an RMSNorm times `(1 + weight)`, the weight starting at zero. No
# library has the class: the zoo registers its own (`zoo.layers`) with `register_class`.
OFFSET_RMS_NORM = register_kind(LayerKind(
    "offset_rms_norm", classes={},
    native={"eqx": ("weight",), "flax": ("scale",)},
    init=zeros, to_native=affine_to_native, to_canonical=affine_to_canonical,
    axes=_RMS_NORM_AXES))
# transformers' Conv1D: no library has the class; the zoo registers its own in each library
# (`zoo.layers`: subclasses of Equinox's Linear, Flax's Dense / Linear) with `register_class`.
CONV1D = register_kind(LayerKind(
    "hf_conv1d", classes={},
    native={"eqx": ("weight", "bias"), "flax": ("kernel", "bias")},
    init=_conv1d_init, to_native=conv1d_to_native, to_canonical=conv1d_to_canonical,
    axes=_LINEAR_AXES))
# A mixture's experts: no library has the class; the zoo registers its own (`zoo.layers`).
EXPERTS = register_kind(LayerKind(
    "experts", classes={},
    native={"eqx": ("gate_up_proj", "down_proj"), "flax": ("gate_up_proj", "down_proj")},
    init=_experts_init, to_native=experts_to_native, to_canonical=experts_to_native,
    axes=_EXPERTS_AXES))
EMBEDDING = register_kind(LayerKind(
    "embedding",
    classes={"eqx": ("equinox.nn.Embedding",), "linen": ("flax.linen.Embed",),
             "nnx": ("flax.nnx.Embed",), "torch": (_TORCH + "Embedding",)},
    native={"eqx": ("weight",), "flax": ("embedding",)},
    init=_normal(1.0), to_native=embedding_to_native, to_canonical=embedding_to_canonical,
    axes=_EMBEDDING_AXES))
# A bare array held by a model's own module (class token, position embedding): the same shape
# in every library, named by its path. The walkers assign it; it has no native classes.
PARAMETER = register_kind(LayerKind(
    "parameter", classes={}, native={"eqx": ("",), "flax": ("",)}, init=_normal(0.02)))
