"""timm's EfficientNet builder as data: the block strings of an `arch_def`, the width and depth
multipliers with timm's rounding, and the blocks they give (`BlockSpec`), library-neutral.

Shared by the architectures built from timm's `_efficientnet_builder` (EfficientNet,
MobileNetV3); each library's blocks read these specs and nothing else.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from zoo.configs import ConfigError

# timm's activation codes in a block string (`n` option) and the zoo's names.
ACTIVATION_CODES: dict[str, str] = {"re": "relu", "r6": "relu6", "hs": "hard_swish",
                                    "sw": "silu"}
BLOCK_TYPES = ("ds", "dsa", "ir", "cn")
MAX_STRIDE = 32  # timm's output_stride: beyond it timm dilates (not built here)


def make_divisible(v: float, divisor: int = 8, min_value: int | None = None,
                   round_limit: float = 0.9) -> int:
    """timm's `make_divisible`: `v` to the nearest multiple of `divisor` (at least
    `min_value`, default `divisor`), one `divisor` up when that loses more than 10%."""
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < round_limit * v:
        new_v += divisor
    return new_v


def round_channels(channels: float, multiplier: float = 1.0, divisor: int = 8) -> int:
    """timm's `round_channels` (its `round_chs_fn`): `channels * multiplier`, made divisible."""
    if not multiplier:
        return int(channels)
    return make_divisible(channels * multiplier, divisor)


@dataclass(frozen=True)
class SqueezeExcite:
    """How a family builds its squeeze-and-excitation (timm's `SqueezeExcite` arguments):
    the gate, the activation between the two 1x1 convs (None: the block's own), whether the
    reduction ratio applies to the expanded channels (`from_exp`; otherwise to the block's
    input, `se_ratio / exp_ratio` of the expanded ones) and whether the reduced width is
    rounded by `round_channels` (`divisible`) or Python's `round`."""

    gate: str = "sigmoid"
    act: str | None = None
    from_exp: bool = False
    divisible: bool = False


@dataclass(frozen=True)
class BlockSpec:
    """One block as timm builds it.

    - `type`: "ds" (depthwise-separable: conv_dw bn1 [se] conv_pw bn2), "ir" (inverted
      residual / MBConv: conv_pw bn1 conv_dw bn2 [se] conv_pwl bn3) or "cn" (conv bn1).
    - `mid_chs`: the depthwise conv's channels (ds: `in_chs`; ir: the expansion; cn: `out_chs`).
    - `kernel`: the depthwise conv's kernel (cn: its conv's); `exp_kernel`, `pw_kernel`: the
      kernels of the expansion and of the projection (1 in every named model).
    - `act`: the block's activation; `pw_act`: ds only, an activation after bn2 ("dsa").
    - `se_chs`: the squeeze-and-excitation's reduced channels, 0 without one.
    - `skip`: a residual connection; `drop_path`: its stochastic depth rate.
    """

    type: str
    in_chs: int
    out_chs: int
    mid_chs: int
    kernel: int
    stride: int
    act: str
    se_chs: int = 0
    skip: bool = False
    pw_act: bool = False
    exp_kernel: int = 1
    pw_kernel: int = 1
    drop_path: float = 0.0

    def layers(self) -> tuple[tuple[ConvLayer, ...], tuple[ConvLayer, ...]]:
        """The block's conv + BatchNorm layers in timm's names, those before its
        squeeze-and-excitation (`se`) and those after (the order of timm's modules)."""
        i, o, m = self.in_chs, self.out_chs, self.mid_chs
        if self.type == "ds":
            return ((ConvLayer("conv_dw", "bn1", i, i, self.kernel, self.stride, i),),
                    (ConvLayer("conv_pw", "bn2", i, o, self.pw_kernel, act=self.pw_act),))
        if self.type == "ir":
            return ((ConvLayer("conv_pw", "bn1", i, m, self.exp_kernel),
                     ConvLayer("conv_dw", "bn2", m, m, self.kernel, self.stride, m)),
                    (ConvLayer("conv_pwl", "bn3", m, o, self.pw_kernel, act=False),))
        return (ConvLayer("conv", "bn1", i, o, self.kernel, self.stride),), ()


@dataclass(frozen=True)
class ConvLayer:
    """A conv (no bias) and its BatchNorm in a block: their names, the conv's channels in and
    out, kernel, stride and groups, and whether the block's activation follows."""

    conv: str
    bn: str
    in_chs: int
    out_chs: int
    kernel: int
    stride: int = 1
    groups: int = 1
    act: bool = True


def decode_block(text: str) -> tuple[dict[str, Any], int]:
    """timm's `_decode_block_str` for the block types ds, dsa, ir and cn: (arguments,
    repeats). Options: r repeats, k kernel, s stride, e expansion, c channels, se ratio, n
    activation (re, r6, hs, sw), a / p expansion / projection kernels, noskip / skip. Anything
    else is refused in one line (timm's MixNet, CondConv, space-to-depth, group-size options)."""
    if not isinstance(text, str) or not text:
        raise ConfigError(f"a block string must be a non-empty string, found {text!r}")
    kind, *ops = text.split("_")
    if kind not in BLOCK_TYPES:
        raise ConfigError(f"block {text!r}: type {kind!r} is not one of {', '.join(BLOCK_TYPES)}"
                          " (timm's others are not built by the zoo)")
    options: dict[str, str] = {}
    skip: bool | None = None
    act: str | None = None
    for op in ops:
        if op == "noskip":
            skip = False
        elif op == "skip":
            skip = True
        elif op.startswith("n") and op[1:] in ACTIVATION_CODES:
            act = ACTIVATION_CODES[op[1:]]
        else:
            parts = re.split(r"(\d.*)", op)
            if len(parts) < 2 or parts[0] not in ("r", "k", "s", "e", "c", "se", "a", "p"):
                raise ConfigError(f"block {text!r}: option {op!r} is not one the zoo builds "
                                  "(r, k, s, e, c, se, n, a, p, noskip, skip)")
            options[parts[0]] = parts[1]
    try:
        def number(key: str, default: str | None = None, cast: Any = int) -> Any:
            value = options.get(key, default)
            if value is None:
                raise ConfigError(f"block {text!r}: option {key!r} is missing")
            return cast(value)

        args = {"type": kind, "out_chs": number("c"), "stride": number("s"), "act": act,
                "kernel": number("k", "1" if kind == "cn" else None),
                "exp_ratio": number("e", "1", float), "se_ratio": number("se", "0", float),
                "exp_kernel": number("a", "1"), "pw_kernel": number("p", "1")}
        repeats = number("r")
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(f"block {text!r}: {e}") from None
    if kind == "cn":
        args["skip"] = skip is True
    else:
        args["skip"] = not (kind == "dsa" or skip is False)
    if repeats < 1 or args["stride"] not in (1, 2) or min(args["kernel"], args["out_chs"]) < 1:
        raise ConfigError(f"block {text!r}: repeats, kernel and channels must be positive, the "
                          "stride 1 or 2")
    return args, repeats


def scale_stage_depth(repeats: list[int], multiplier: float) -> list[int]:
    """timm's `_scale_stage_depth` ("ceil"): the stage's total repeats times `multiplier`,
    rounded up, given back to its block strings in reverse order."""
    num_repeat = sum(repeats)
    num_repeat_scaled = math.ceil(num_repeat * multiplier)
    scaled = []
    for r in repeats[::-1]:
        rs = max(1, round(r / num_repeat * num_repeat_scaled))
        scaled.append(rs)
        num_repeat -= r
        num_repeat_scaled -= rs
    return scaled[::-1]


def build_stages(arch_def: tuple[tuple[str, ...], ...], *, stem_chs: int, act: str,
                 channel_multiplier: float, depth_multiplier: float, divisor: int,
                 se: SqueezeExcite, drop_path_rate: float = 0.0
                 ) -> tuple[tuple[BlockSpec, ...], ...]:
    """The blocks of every stage, as timm's `decode_arch_def` and `EfficientNetBuilder` make
    them from `arch_def` (one tuple of block strings per stage)."""
    if not arch_def or any(not stage for stage in arch_def):
        raise ConfigError("the arch_def needs at least one stage of at least one block string")
    decoded = []
    for stage in arch_def:
        args, repeats = zip(*map(decode_block, stage), strict=True)
        decoded.append([dict(a) for a, n in zip(args, scale_stage_depth(list(repeats),
                                                                       depth_multiplier),
                                                strict=True) for _ in range(n)])
    total = sum(map(len, decoded))
    in_chs, index, reduction, stages = stem_chs, 0, 2, []
    for stage in decoded:
        blocks = []
        for j, ba in enumerate(stage):
            stride = ba["stride"] if j == 0 else 1
            reduction *= stride
            if reduction > MAX_STRIDE:
                raise ConfigError(f"the arch_def reduces the input {reduction}x; timm dilates "
                                  f"beyond {MAX_STRIDE}x, which the zoo does not build")
            out = round_channels(ba["out_chs"], channel_multiplier, divisor)
            kind, exp = ba["type"], ba["exp_ratio"]
            mid = make_divisible(in_chs * exp) if kind == "ir" else (
                out if kind == "cn" else in_chs)
            se_chs = 0
            if ba["se_ratio"] and kind != "cn":
                ratio = ba["se_ratio"] if se.from_exp else ba["se_ratio"] / (
                    exp if kind == "ir" else 1.0)
                se_chs = (round_channels(mid * ratio) if se.divisible else round(mid * ratio))
            has_skip = ba["skip"] and stride == 1 and in_chs == out
            blocks.append(BlockSpec(
                type="ds" if kind == "dsa" else kind, in_chs=in_chs, out_chs=out, mid_chs=mid,
                kernel=ba["kernel"], stride=stride, act=ba["act"] or act, se_chs=se_chs,
                skip=has_skip, pw_act=kind == "dsa", exp_kernel=ba["exp_kernel"],
                pw_kernel=ba["pw_kernel"], drop_path=drop_path_rate * index / total))
            in_chs, index = out, index + 1
        stages.append(tuple(blocks))
    return tuple(stages)


def stage_ends(stages: tuple[tuple[BlockSpec, ...], ...]) -> tuple[int, ...]:
    """timm's `stage_ends` (its `feature_info` stages): the positions of the feature taps, 0
    the stem (when the first block strides), i the output of stage i - 1; a stage is tapped
    when the next one strides, and the last one always."""
    out = [0] if stages[0][0].stride > 1 else []
    for i in range(len(stages)):
        if i + 1 == len(stages) or stages[i + 1][0].stride > 1:
            out.append(i + 1)
    return tuple(out)


def padding(kernel: int, stride: int) -> int:
    """timm's symmetric padding (`get_padding`) of a conv: ((stride - 1) + (kernel - 1)) // 2."""
    return ((stride - 1) + (kernel - 1)) // 2
