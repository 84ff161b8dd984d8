"""timm's EfficientNet blocks in Equinox: per-sample `(C, H, W)`, BatchNorm statistics in
`eqx.nn.State`; the same modules and names as `zoo.models.mbconv.torch`."""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, PRNGKeyArray

from zoo.layers.drop_path import block_keys
from zoo.layers.eqx import BatchNorm, EqxDropPath
from zoo.models.common import activation
from zoo.models.mbconv.config import MBConvNetConfig
from zoo.models.mbconv.spec import BlockSpec

State = eqx.nn.State


def conv(config: MBConvNetConfig, cin: int, cout: int, kernel: int, stride: int,
         key: PRNGKeyArray, dtype: Any, groups: int = 1, bias: bool = False) -> eqx.nn.Conv2d:
    return eqx.nn.Conv2d(cin, cout, (kernel, kernel), stride=stride,
                         padding=config.conv_padding(kernel, stride), use_bias=bias,
                         groups=groups, key=key, dtype=dtype)


def batch_norm(config: MBConvNetConfig, channels: int, dtype: Any) -> BatchNorm:
    return BatchNorm(channels, "batch", config.bn_momentum, config.bn_eps, dtype=dtype)


class SqueezeExcite(eqx.Module):
    """x * gate(conv_expand(act(conv_reduce(mean(x)))))."""

    conv_reduce: eqx.nn.Conv2d
    conv_expand: eqx.nn.Conv2d
    act: str = eqx.field(static=True)
    gate: str = eqx.field(static=True)

    def __init__(self, config: MBConvNetConfig, spec: BlockSpec, *, key: PRNGKeyArray,
                 dtype: Any) -> None:
        k1, k2 = jax.random.split(key)
        self.conv_reduce = eqx.nn.Conv2d(spec.mid_chs, spec.se_chs, (1, 1), key=k1, dtype=dtype)
        self.conv_expand = eqx.nn.Conv2d(spec.se_chs, spec.mid_chs, (1, 1), key=k2, dtype=dtype)
        self.act, self.gate = config.SE.act or spec.act, config.SE.gate

    def __call__(self, x: Array) -> Array:
        s = self.conv_reduce(jnp.mean(x, axis=(1, 2), keepdims=True))
        return x * activation(self.gate)(self.conv_expand(activation(self.act)(s)))


def _se(config: MBConvNetConfig, spec: BlockSpec, key: PRNGKeyArray,
        dtype: Any) -> SqueezeExcite | None:
    return SqueezeExcite(config, spec, key=key, dtype=dtype) if spec.se_chs else None


def _residual(block: Block, y: Array, x: Array, key: PRNGKeyArray | None) -> Array:
    """`y` (no skip), or `drop_path(y) + x`."""
    return block.drop_path(y, key=key) + x if block.spec.skip else y


class DepthwiseSeparable(eqx.Module):
    """conv_dw bn1 act [se] conv_pw bn2 [act] [+ x]."""

    conv_dw: eqx.nn.Conv2d
    bn1: BatchNorm
    se: SqueezeExcite | None
    conv_pw: eqx.nn.Conv2d
    bn2: BatchNorm
    drop_path: EqxDropPath
    spec: BlockSpec = eqx.field(static=True)

    def __init__(self, config: MBConvNetConfig, spec: BlockSpec, *, key: PRNGKeyArray,
                 dtype: Any) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.conv_dw = conv(config, spec.in_chs, spec.in_chs, spec.kernel, spec.stride, k1, dtype,
                            groups=spec.in_chs)
        self.bn1 = batch_norm(config, spec.in_chs, dtype)
        self.se = _se(config, spec, k2, dtype)
        self.conv_pw = conv(config, spec.in_chs, spec.out_chs, spec.pw_kernel, 1, k3, dtype)
        self.bn2 = batch_norm(config, spec.out_chs, dtype)
        self.drop_path = EqxDropPath(spec.drop_path)
        self.spec = spec

    def __call__(self, x: Array, state: State, *,
                 key: PRNGKeyArray | None = None) -> tuple[Array, State]:
        act = activation(self.spec.act)
        y, state = self.bn1(self.conv_dw(x), state)
        y = act(y)
        if self.se is not None:
            y = self.se(y)
        y, state = self.bn2(self.conv_pw(y), state)
        if self.spec.pw_act:
            y = act(y)
        return _residual(self, y, x, key), state


class InvertedResidual(eqx.Module):
    """conv_pw bn1 act, conv_dw bn2 act, [se], conv_pwl bn3 [+ x]."""

    conv_pw: eqx.nn.Conv2d
    bn1: BatchNorm
    conv_dw: eqx.nn.Conv2d
    bn2: BatchNorm
    se: SqueezeExcite | None
    conv_pwl: eqx.nn.Conv2d
    bn3: BatchNorm
    drop_path: EqxDropPath
    spec: BlockSpec = eqx.field(static=True)

    def __init__(self, config: MBConvNetConfig, spec: BlockSpec, *, key: PRNGKeyArray,
                 dtype: Any) -> None:
        k1, k2, k3, k4 = jax.random.split(key, 4)
        self.conv_pw = conv(config, spec.in_chs, spec.mid_chs, spec.exp_kernel, 1, k1, dtype)
        self.bn1 = batch_norm(config, spec.mid_chs, dtype)
        self.conv_dw = conv(config, spec.mid_chs, spec.mid_chs, spec.kernel, spec.stride, k2,
                            dtype, groups=spec.mid_chs)
        self.bn2 = batch_norm(config, spec.mid_chs, dtype)
        self.se = _se(config, spec, k3, dtype)
        self.conv_pwl = conv(config, spec.mid_chs, spec.out_chs, spec.pw_kernel, 1, k4, dtype)
        self.bn3 = batch_norm(config, spec.out_chs, dtype)
        self.drop_path = EqxDropPath(spec.drop_path)
        self.spec = spec

    def __call__(self, x: Array, state: State, *,
                 key: PRNGKeyArray | None = None) -> tuple[Array, State]:
        act = activation(self.spec.act)
        y, state = self.bn1(self.conv_pw(x), state)
        y, state = self.bn2(self.conv_dw(act(y)), state)
        y = act(y)
        if self.se is not None:
            y = self.se(y)
        y, state = self.bn3(self.conv_pwl(y), state)
        return _residual(self, y, x, key), state


class ConvBnAct(eqx.Module):
    """conv bn1 act [+ x]."""

    conv: eqx.nn.Conv2d
    bn1: BatchNorm
    drop_path: EqxDropPath
    spec: BlockSpec = eqx.field(static=True)

    def __init__(self, config: MBConvNetConfig, spec: BlockSpec, *, key: PRNGKeyArray,
                 dtype: Any) -> None:
        self.conv = conv(config, spec.in_chs, spec.out_chs, spec.kernel, spec.stride, key, dtype)
        self.bn1 = batch_norm(config, spec.out_chs, dtype)
        self.drop_path = EqxDropPath(spec.drop_path)
        self.spec = spec

    def __call__(self, x: Array, state: State, *,
                 key: PRNGKeyArray | None = None) -> tuple[Array, State]:
        y, state = self.bn1(self.conv(x), state)
        return _residual(self, activation(self.spec.act)(y), x, key), state


Block = DepthwiseSeparable | InvertedResidual | ConvBnAct
BLOCKS: dict[str, type[Block]] = {"ds": DepthwiseSeparable, "ir": InvertedResidual,
                                  "cn": ConvBnAct}


def blocks(config: MBConvNetConfig, key: PRNGKeyArray, dtype: Any
           ) -> tuple[tuple[Block, ...], ...]:
    """`blocks.i.j`: one tuple per stage."""
    stages = config.stages()
    keys = iter(jax.random.split(key, sum(map(len, stages))))
    return tuple(tuple(BLOCKS[s.type](config, s, key=next(keys), dtype=dtype) for s in stage)
                 for stage in stages)


def run_stage(stages: tuple[tuple[Block, ...], ...], i: int, x: Array, state: State,
              key: PRNGKeyArray | None) -> tuple[Array, State]:
    """Stage `i`'s blocks in turn; block b of the model (counted over every stage) draws its
    drop path with `block_keys(key, b)` (`zoo.layers.drop_path`)."""
    b = sum(map(len, stages[:i]))
    for j, block in enumerate(stages[i]):
        x, state = block(x, state, key=None if key is None else block_keys(key, b + j))
    return x, state
