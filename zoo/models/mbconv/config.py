"""The config base of timm's `_efficientnet_builder` families (EfficientNet, MobileNetV3): the
`arch_def` in timm's block strings, the multipliers, BatchNorm, padding and rates."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from zoo.configs import Axis, Config, ConfigError, Padding, positive
from zoo.models.intermediates import take_indices
from zoo.models.mbconv.spec import (
    BlockSpec,
    SqueezeExcite,
    build_stages,
    padding,
    round_channels,
    stage_ends,
)
from zoo.weights.adaptation import Adapter, AdaptInputConv, ResetClassifier

Activation = Literal["relu", "relu6", "silu", "hard_swish"]


@dataclass(frozen=True)
class MBConvNetConfig(Config):
    """What EfficientNet and MobileNetV3 share (timm's `EfficientNetBuilder` arguments).

    - `arch_def`: timm's architecture definition, one tuple of block strings per stage
      (`"ir_r2_k3_s2_e6_c24_se0.25"`: an inverted residual repeated twice, 3x3 depthwise conv,
      stride 2, expansion 6, 24 channels, squeeze-and-excitation 0.25; `spec.decode_block`).
    - `channel_multiplier`, `depth_multiplier`, `channel_divisor`: timm's width and depth
      scaling (`round_channels`, per-stage repeats rounded up).
    - `stem_size`: the stem conv's channels (scaled unless `fix_stem`); `num_features`: the
      head conv's channels.
    - `act`: the default activation (a block string's `n` option overrides it).
    - BatchNorm momentum in the Flax convention (`bn_momentum` = 1 - PyTorch's 0.1) and eps.
    - `padding`: "torch" (timm's symmetric `get_padding`) or "same" (TensorFlow's SAME, timm's
      `pad_type='same'`, as the `tf_` ports: the weights are the same, the outputs differ).
    - `drop_rate`: dropout before the classifier; `drop_path_rate`: stochastic depth of the
      last block (block i of n drops its residual branch with rate `drop_path_rate * i / n`).
    """

    SE: ClassVar[SqueezeExcite] = SqueezeExcite()
    # timm's MobileNetV3 head: pool, then conv_head (with bias) and act, no norm; otherwise
    # EfficientNet's: conv_head bn2 act on the feature map, then pool.
    EFFICIENT_HEAD: ClassVar[bool] = False
    ADAPTERS: ClassVar[tuple[Adapter, ...]] = (ResetClassifier("classifier"),
                                               AdaptInputConv("conv_stem.weight"))
    LOSS: ClassVar[str] = "cross_entropy"
    # timm's symmetric padding or TensorFlow's SAME (the tf_ ports): a Flax source into
    # "torch" padding is warned (zoo.configs.Padding).
    PADDING: ClassVar[Padding] = Padding("padding", same="same")
    arch_def: tuple[tuple[str, ...], ...] = ()
    channel_multiplier: float = 1.0
    depth_multiplier: float = 1.0
    channel_divisor: int = 8
    stem_size: int = 32
    fix_stem: bool = False
    num_features: int = 1280
    act: Activation = "silu"
    in_channels: int = 3
    input_size: tuple[int, int] = (224, 224)
    num_classes: int = 1000
    bn_momentum: float = 0.9  # Flax convention: weight of the old running value.
    bn_eps: float = 1e-5
    padding: Literal["torch", "same"] = "torch"
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0

    def validate(self) -> None:
        name = self.arch
        positive(f"{name} sizes", (self.channel_divisor, self.stem_size, self.num_features,
                                   self.in_channels, *self.input_size, self.num_classes))
        if self.channel_multiplier <= 0 or self.depth_multiplier <= 0:
            raise ConfigError(f"{name}: channel_multiplier and depth_multiplier must be "
                              f"positive, found {self.channel_multiplier} and "
                              f"{self.depth_multiplier}")
        if not 0.0 <= self.bn_momentum < 1.0:
            raise ConfigError(f"{name}.bn_momentum must be in [0, 1), found {self.bn_momentum}")
        if self.bn_eps <= 0:
            raise ConfigError(f"{name}.bn_eps must be positive, found {self.bn_eps}")
        for field in ("drop_rate", "drop_path_rate"):
            if not 0.0 <= getattr(self, field) < 1.0:
                raise ConfigError(f"{name}.{field} must be in [0, 1), found "
                                  f"{getattr(self, field)}")
        try:
            self.stages()
        except ConfigError as e:
            raise ConfigError(f"{name}.arch_def: {e}") from None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_channels, *self.input_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.num_classes,)

    @property
    def input_axes(self) -> tuple[Axis, ...]:
        """The channels; any height and width (the model pools globally, and timm's runs
        every size from 1x1 on)."""
        return (Axis("C", size=self.in_channels), Axis("H"), Axis("W"))

    def round_chs(self, channels: float) -> int:
        """timm's `round_chs_fn`: `channels` times the width multiplier, made divisible."""
        return round_channels(channels, self.channel_multiplier, self.channel_divisor)

    @property
    def stem_chs(self) -> int:
        return self.stem_size if self.fix_stem else self.round_chs(self.stem_size)

    def stages(self) -> tuple[tuple[BlockSpec, ...], ...]:
        """The blocks of `blocks.0 .. blocks.N` (`spec.build_stages`)."""
        return _stages(self)

    @property
    def stage_ends(self) -> tuple[int, ...]:
        """timm's feature taps (`forward_intermediates`): 0 the stem, i stage i - 1's output."""
        return stage_ends(self.stages())

    def taps(self, indices: int | Sequence[int] | None, stop_early: bool = False,
             intermediates_only: bool = False) -> tuple[list[int], int]:
        """`forward_intermediates`' taps as `(positions in stage_ends, the last)` from timm's
        `indices` (`take_indices`); an efficient head takes `stop_early` only with
        `intermediates_only` (as timm's MobileNetV3)."""
        ends = self.stage_ends
        take, last = take_indices(len(ends), indices)
        if self.EFFICIENT_HEAD and stop_early and not intermediates_only:
            raise ValueError("forward_intermediates: stop_early needs intermediates_only=True "
                             "(as timm's MobileNetV3)")
        return [ends[i] for i in take], ends[last]

    @property
    def num_stages(self) -> int:
        return len(self.stages())

    @property
    def block_chs(self) -> int:
        """Channels of the last stage's output."""
        return self.stages()[-1][-1].out_chs

    @property
    def head_chs(self) -> int:
        """Channels of conv_head."""
        return self.num_features

    @property
    def features(self) -> int:
        """Channels entering the classifier (conv_head's)."""
        return self.head_chs

    def conv_padding(self, kernel: int, stride: int) -> int | str:
        """A conv's padding: timm's symmetric one on both sides, or "SAME"."""
        return "SAME" if self.padding == "same" else padding(kernel, stride)


@functools.cache
def _stages(config: MBConvNetConfig) -> tuple[tuple[BlockSpec, ...], ...]:
    return build_stages(config.arch_def, stem_chs=config.stem_chs, act=config.act,
                        channel_multiplier=config.channel_multiplier,
                        depth_multiplier=config.depth_multiplier,
                        divisor=config.channel_divisor, se=config.SE,
                        drop_path_rate=config.drop_path_rate)
