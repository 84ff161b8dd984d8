"""Multi-head self-attention: one composite layer kind for the four libraries' layouts.

The canonical layout is timm's ViT `Attention` (and PyTorch's `nn.MultiheadAttention`):

| canonical | shape | meaning |
|---|---|---|
| `qkv.weight` | `(3F, E)` | query, key, value projections stacked in that order |
| `qkv.bias` | `(3F,)` | optional |
| `proj.weight` | `(E_out, F)` | output projection |
| `proj.bias` | `(E_out,)` | optional |

`F = heads * D`; within each of q, k, v, row `h*D + d` is head `h`, channel `d` (timm reshapes
the qkv output to `(3, heads, D)`), and so is column `h*D + d` of `proj.weight`.

- PyTorch `nn.MultiheadAttention`: `in_proj_weight`/`in_proj_bias` are `qkv` as they are,
  `out_proj` is `proj` (its heads split rows the same head-major way).
- Equinox `MultiheadAttention`: `query_proj`, `key_proj`, `value_proj` Linears are the three row
  blocks of `qkv`, `output_proj` is `proj` (it splits heads with `reshape(seq, heads, -1)`).
- Flax `MultiHeadDotProductAttention` / `nnx.MultiHeadAttention`: `query`/`key`/`value` kernels
  `(E, heads, D)` are a row block transposed and split by head, biases `(heads, D)`; the `out`
  kernel `(heads, D, E_out)` is `proj.weight` transposed. The canonical arrays do not show the
  number of heads: the layer carries it as a fact (`Layer.fact("num_heads")`).

Initialisation: each projection as a PyTorch `nn.Linear` (timm's `Attention` defaults).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from canonical.kinds import Arrays, Layer, LayerKind, register_kind
from canonical.layouts import layout
from canonical.rules import uniform_fan_in

QKV = ("query", "key", "value")
EQX = {"query": "query_proj", "key": "key_proj", "value": "value_proj", "out": "output_proj"}
TORCH = {"qkv.weight": "in_proj_weight", "qkv.bias": "in_proj_bias",
         "proj.weight": "out_proj.weight", "proj.bias": "out_proj.bias"}


def _concat(parts: list[Any]) -> Any:
    """Concatenate along axis 0 with JAX for JAX arrays (tracers included), else NumPy."""
    xp = jnp if any(isinstance(p, jax.Array) for p in parts) else np
    return xp.concatenate(parts)


def _thirds(a: Any) -> tuple[Any, Any, Any]:
    n = a.shape[0] // 3
    return a[:n], a[n:2 * n], a[2 * n:]


def _stacked(n: Arrays, names: dict[str, str], suffix: str) -> Arrays:
    """`qkv.<suffix>` from three native arrays (all or none of them present)."""
    found = [n[f"{names[p]}.{suffix}"] for p in QKV if f"{names[p]}.{suffix}" in n]
    if not found:
        return {}
    if len(found) != 3:
        raise ValueError(f"attention: query, key and value must all have a {suffix} or none")
    return {f"qkv.{suffix}": _concat(found)}


# --------------------------------------------------------------------------- rules
# The projections' native names per layout (PyTorch's are `TORCH`, the canonical ones renamed).
PROJECTIONS = {"eqx": EQX, "flax": {p: p for p in (*QKV, "out")}}


def to_native(family: str, c: Arrays, layer: Layer) -> Arrays:
    f = layout(family)
    if f.canonical:
        return {TORCH[k]: v for k, v in c.items()}
    out: Arrays = {}
    names = PROJECTIONS[family]
    for suffix in ("weight", "bias"):
        if f"qkv.{suffix}" in c:
            for p, a in zip(QKV, _thirds(c[f"qkv.{suffix}"]), strict=True):
                out[f"{names[p]}.{suffix}"] = a
    if "proj.weight" in c:
        out[f"{names['out']}.weight"] = c["proj.weight"]
    if "proj.bias" in c:
        out[f"{names['out']}.bias"] = c["proj.bias"]
    return _flax_kernels(out, layer.fact("num_heads")) if f.channels_last else out


def _flax_kernels(n: Arrays, heads: int) -> Arrays:
    """Equinox-named (out, in) weights -> Flax `(E, heads, D)` kernels, `(heads, D)` biases and
    the `(heads, D, E_out)` out kernel."""
    out = {}
    for name, a in n.items():
        p, suffix = name.split(".")
        if p == "out":
            out["out.kernel" if suffix == "weight" else name] = (
                a.T.reshape(heads, -1, a.shape[0]) if suffix == "weight" else a)
        elif suffix == "weight":
            out[f"{p}.kernel"] = a.T.reshape(a.shape[1], heads, -1)
        else:
            out[name] = a.reshape(heads, -1)
    return out


def to_canonical(family: str, n: Arrays, layer: Layer) -> Arrays:
    f = layout(family)
    if f.canonical:
        return {k: n[v] for k, v in TORCH.items() if v in n}
    if f.channels_last:
        n = _eqx_like(n)
    names = PROJECTIONS[family]
    out = _stacked(n, names, "weight") | _stacked(n, names, "bias")
    for suffix in ("weight", "bias"):
        if f"{names['out']}.{suffix}" in n:
            out[f"proj.{suffix}"] = n[f"{names['out']}.{suffix}"]
    return out


def _eqx_like(n: Arrays) -> Arrays:
    """Flax kernels and biases as (out, in) weights and flat biases (names kept, `kernel`
    renamed `weight`)."""
    out = {}
    for name, a in n.items():
        p, suffix = name.split(".")
        if p == "out" and suffix == "kernel":
            out["out.weight"] = a.reshape(-1, a.shape[-1]).T
        elif suffix == "kernel":
            out[f"{p}.weight"] = a.reshape(a.shape[0], -1).T
        else:
            out[name] = a.reshape(-1)
    return out


def _init(shapes: dict[str, tuple[int, ...]], rng: np.random.Generator) -> Arrays:
    out = {}
    for p in ("qkv", "proj"):
        sub = {k.split(".", 1)[1]: s for k, s in shapes.items() if k.startswith(p + ".")}
        out |= {f"{p}.{k}": v for k, v in uniform_fan_in(sub, rng).items()}
    return out


# --------------------------------------------------------------------------- checks and facts
def _problem(m: Any) -> str | None:
    """What of the attention layer `m` the packed `qkv` layout cannot express, if anything
    (each library's class is recognised by the attributes it has)."""
    if hasattr(m, "query_proj"):  # Equinox
        sizes = {m.query_proj.in_features, m.key_proj.in_features, m.value_proj.in_features}
        outs = {m.query_proj.out_features, m.key_proj.out_features, m.value_proj.out_features}
        if len(sizes) > 1 or len(outs) > 1:
            return "query, key and value sizes differ (qk_size != vo_size or cross-attention)"
        if len({m.use_query_bias, m.use_key_bias, m.use_value_bias}) > 1:
            return "some of query, key and value have a bias and some not"
        return None
    if hasattr(m, "in_proj_weight"):  # PyTorch
        if not m._qkv_same_embed_dim or m.bias_k is not None:
            return "separate q/k/v weights (kdim/vdim) or add_bias_kv"
        return None
    if m.normalize_qk or m.decode:  # Flax
        return "normalize_qk or decode (a cache)"
    if getattr(m, "num_kv_heads", m.num_heads) not in (None, m.num_heads):
        return "grouped-query attention (num_kv_heads != num_heads)"
    return None


def _check(m: Any, impl: str, name: str) -> None:
    """Refuse attention layers the packed `qkv` layout cannot express."""
    problem = _problem(m)
    if problem:
        raise ValueError(f"attention layer {name!r} ({impl}): {problem} is not supported")


def _facts(m: Any, impl: str) -> dict[str, Any]:
    return {"num_heads": int(m.num_heads)}


_EQX_NAMES = tuple(f"{EQX[p]}.{s}" for p in (*QKV, "out") for s in ("weight", "bias"))
_FLAX_NAMES = tuple(f"{p}.{s}" for p in (*QKV, "out") for s in ("kernel", "bias"))
# Logical axes: Equinox projections are linear layers (heads * head_dim merged), Flax's keep
# (heads, head_dim) apart ("kv" for head_dim).
_AXES = {
    "eqx": {**{f"{EQX[p]}.{s}": a for p in QKV
               for s, a in (("weight", ("heads", "embed")), ("bias", ("heads",)))},
            "output_proj.weight": ("embed", "heads"), "output_proj.bias": ("embed",)},
    "flax": {**{f"{p}.{s}": a for p in QKV
                for s, a in (("kernel", ("embed", "heads", "kv")), ("bias", ("heads", "kv")))},
             "out.kernel": ("heads", "kv", "embed"), "out.bias": ("embed",)},
}
ATTENTION = register_kind(LayerKind(
    "attention",
    classes={"eqx": ("equinox.nn.MultiheadAttention",),
             "linen": ("flax.linen.MultiHeadDotProductAttention",),
             "nnx": ("flax.nnx.MultiHeadAttention",),
             "torch": ("torch.nn.MultiheadAttention",)},
    native={"eqx": _EQX_NAMES, "flax": _FLAX_NAMES, "torch": tuple(TORCH.values())},
    init=_init, to_native=to_native, to_canonical=to_canonical, composite=True, check=_check,
    facts=_facts, axes=_AXES))
