"""One 3-D conv-transpose layer in every library, from one set of canonical weights.

The published conv-transpose reports time a single layer, which no zoo architecture is (Decoder3D
has four), so the `convt` presets build this layer instead: `zoo.layers.eqx.ConvTranspose`,
`zoo.layers.linen.ConvTranspose`, `zoo.layers.nnx.ConvTranspose` (all with a `method` switch) and
`torch.nn.ConvTranspose3d`, with weights converted from one canonical (PyTorch-layout) state by
`canonical.KINDS["conv_transpose"]`. It is a benchmark subject like the zoo's architectures:
`python -m zoo.bench convt --preset convt-256-cpu` (its presets are registered at the end).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import canonical
from zoo.bench.spec import BenchSpec, MatrixRun, register
from zoo.configs import Overrides
from zoo.layers.conv_transpose import output_shape, torch_padding
from zoo.layers.conv_transpose_spec import ConvTransposeSpec
from zoo.libraries import library
from zoo.registry import Architecture


@dataclass(frozen=True)
class ConvTSpec:
    """A ConvTranspose3d with PyTorch semantics (ints apply to every spatial dim)."""

    in_channels: int = 16
    out_channels: int = 1
    spatial: tuple[int, int, int] = (16, 16, 16)
    kernel_size: int = 3
    stride: int = 2
    padding: int = 1
    output_padding: int = 1
    dilation: int = 1
    method: str = "auto"
    arch = "convt"
    LOSS = "mse"

    @classmethod
    def tiny(cls) -> ConvTSpec:
        """A small layer (what the model contract checks the classes with)."""
        return cls(in_channels=2, out_channels=2, spatial=(3, 3, 3))

    def __post_init__(self) -> None:
        object.__setattr__(self, "spatial", tuple(self.spatial))
        if len(self.spatial) != 3:
            raise ValueError(f"convt.spatial needs 3 entries (D, H, W), got {self.spatial}")
        self.output_spatial  # noqa: B018  (validates the hyper-parameters)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.spatial)

    def _per_dim(self) -> tuple[tuple[int, ...], ...]:
        return tuple((v,) * 3 for v in (self.kernel_size, self.stride, self.padding,
                                        self.output_padding, self.dilation))

    @property
    def output_spatial(self) -> tuple[int, ...]:
        return output_shape(self.spatial, *self._per_dim())

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.out_channels, *self.output_spatial)

    @property
    def flax_padding(self) -> tuple[tuple[int, int], ...]:
        return torch_padding(*self._per_dim())

    def conv_transposes(self) -> list[ConvTransposeSpec]:
        return [ConvTransposeSpec(self.in_channels, self.out_channels, self.kernel_size,
                                  self.stride, self.padding, self.output_padding, self.dilation,
                                  self.spatial, "convt")]

    def to_dict(self) -> dict[str, Any]:
        return {"arch": self.arch, **dataclasses.asdict(self)}


def canonical_state(spec: ConvTSpec, seed: int = 0, dtype: Any = "float32") -> dict[str, Any]:
    """PyTorch-layout `convt.weight` (I, O, k, k, k) and `convt.bias` (O,): U(+-1/sqrt(fan_in))
    with PyTorch's conv-transpose fan-in O * k^3, drawn in float32 from `seed`, then cast."""
    k = spec.kernel_size
    bound = 1.0 / math.sqrt(spec.out_channels * k ** 3)
    rng = np.random.default_rng([seed, zlib.crc32(b"convt")])
    w = rng.uniform(-bound, bound, (spec.in_channels, spec.out_channels, k, k, k))
    b = rng.uniform(-bound, bound, (spec.out_channels,))
    dt = jnp.dtype(dtype)
    return {"convt.weight": w.astype(np.float32).astype(dt),
            "convt.bias": b.astype(np.float32).astype(dt)}


class EqxConvT(eqx.Module):
    """The layer as an Equinox model (per-sample, channels-first)."""

    convt: Any
    config: ConvTSpec = eqx.field(static=True)

    def __init__(self, config: ConvTSpec, *, key: jax.Array, dtype: Any = None) -> None:
        from zoo.layers.eqx import ConvTranspose

        s = config
        self.config = config
        self.convt = ConvTranspose(3, s.in_channels, s.out_channels, (s.kernel_size,) * 3,
                                   stride=s.stride, padding=s.padding,
                                   output_padding=s.output_padding, dilation=s.dilation,
                                   method=s.method, dtype=dtype, key=key)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.convt(x)


class LinenConvT(nn.Module):
    """The layer as a Linen model (batched, channels-last)."""

    config: ConvTSpec
    param_dtype: str = "float32"

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        from zoo.layers.linen import ConvTranspose

        s = self.config
        return ConvTranspose(
            s.out_channels, (s.kernel_size,) * 3, strides=(s.stride,) * 3,
            padding=s.flax_padding, kernel_dilation=(s.dilation,) * 3, method=s.method,
            param_dtype=jnp.dtype(self.param_dtype), name="convt",
        )(x)


class NnxConvT(nnx.Module):
    """The layer as an NNX model (batched, channels-last)."""

    def __init__(self, config: ConvTSpec, *, rngs: nnx.Rngs,
                 param_dtype: Any = jnp.float32) -> None:
        from zoo.layers.nnx import ConvTranspose

        s = config
        self.config = config
        self.convt = ConvTranspose(
            s.in_channels, s.out_channels, (s.kernel_size,) * 3, (s.stride,) * 3,
            padding=s.flax_padding, kernel_dilation=(s.dilation,) * 3, method=s.method,
            param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.convt(x)


# Its classes, checked against each library's model contract on first use like a registered
# architecture's (not registered: it is a benchmark subject, not a model of the zoo).
LAYER = Architecture(ConvTSpec, dict(eqx=EqxConvT, linen=LinenConvT, nnx=NnxConvT,
                                     torch=".convt_torch:TorchConvT"))  # torch imported on use


def build(spec: ConvTSpec, impl: str, state: dict[str, Any]) -> Any:
    """The layer in library `impl` holding the canonical `state`: the library's skeleton of
    its class, written by the canonical layer rules, as `zoo.create` builds models."""
    lib = library(impl)
    dtype = jnp.dtype(next(iter(state.values())).dtype)
    skeleton = lib.skeleton(LAYER.model_class(impl), spec, dtype)
    return canonical.write(skeleton, state, impl, example=lib.abstract_input(spec),
                           flatten_shape=None)


class ConvTSubjects:
    """The layer as a benchmark subject (`zoo.bench.spec.Subjects`)."""

    def config(self, arch: str, overrides: Overrides, method: str) -> ConvTSpec:
        return ConvTSpec(**{"method": method, **overrides})

    def models(self, config: ConvTSpec, impls: tuple[str, ...], seed: int,
               dtype: str) -> dict[str, Any]:
        state = canonical_state(config, seed, dtype)
        return {impl: build(config, impl, state) for impl in impls}


def _shape(in_channels: int, out_channels: int, spatial: tuple[int, int, int], kernel_size: int,
           stride: int, padding: int, output_padding: int) -> dict[str, Any]:
    return dict(in_channels=in_channels, out_channels=out_channels, spatial=spatial,
                kernel_size=kernel_size, stride=stride, padding=padding,
                output_padding=output_padding)


register(BenchSpec(
    "convt", default_batch=1, subjects=ConvTSubjects(),
    presets=(
        {"name": "tiny", "batch": 2, "config": _shape(4, 4, (4, 4, 4), 3, 2, 1, 1),
         "doc": "CI: one 4->4 conv-transpose, k3 s2 p1 op1, on 4^3, batch 2"},
        {"name": "cpu", "batch": 1, "config": _shape(16, 1, (16, 16, 16), 3, 2, 1, 1),
         "doc": "a CPU-sized convt-wgrad: 16->1, k3 s2 p1 op1 on 16^3, batch 1"},
        {"name": "convt-256", "batch": 4, "config": _shape(4, 4, (256, 256, 256), 3, 1, 1, 0),
         "doc": "published: input (4, 4, 256, 256, 256) NCDHW, 4->4, k3 s1 p1 (1 GiB f32 "
                "tensor)"},
        {"name": "convt-256-cpu", "batch": 1, "config": _shape(4, 4, (64, 64, 64), 3, 1, 1, 0),
         "doc": "CPU-sized convt-256: input (1, 4, 64, 64, 64), 4->4, k3 s1 p1"},
        {"name": "convt-wgrad-cpu", "batch": 1,
         "config": _shape(64, 1, (32, 32, 16), 3, 2, 1, 1),
         "doc": "CPU-sized convt-wgrad: 64->1, k3 s2 p1 op1 on 32x32x16, float32 (bfloat16 "
                "convs on XLA CPU: 5.8 s per training step, too slow to record)"},
        {"name": "convt-wgrad", "batch": 1, "config": _shape(64, 1, (64, 64, 32), 3, 2, 1, 1),
         "dtype": "bfloat16", "modes": ("train",),
         "doc": "published: bf16 weight gradient, 64->1, k3 s2 p1 op1, per-sample input "
                "64x64x64x32 read as (C=64, D=64, H=64, W=32)"},
    ),
    matrix=(
        MatrixRun("convt", "convt-256", ("--mode", "forward", "--method", "all")),
        MatrixRun("convt", "convt-wgrad", ("--mode", "train", "--dtype", "bfloat16"),
                  methods=True),
    ),
))
