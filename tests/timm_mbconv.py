"""timm's own EfficientNet and MobileNetV3 for a zoo config: the model timm's `_gen_efficientnet`
/ `_gen_mobilenet_v3` build, with the config's arch_def, multipliers, stem, head, activation,
BatchNorm, padding and rates (timm's classes, decoder and builder: an independent statement of
the zoo's). A named config gives timm's named model (`test_mbconv.py` pins that); the tiny ones
give timm models as small. Helpers to randomise them and to cut a name to one block per stage."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

import numpy as np

import zoo


def timm_model(config: zoo.Config, **kwargs: Any) -> Any:
    """timm's model of the zoo `config` (an `efficientnet` or `mobilenetv3` config)."""
    from timm.layers import get_act_layer
    from timm.models._efficientnet_blocks import SqueezeExcite
    from timm.models._efficientnet_builder import decode_arch_def, round_channels
    from timm.models.efficientnet import EfficientNet
    from timm.models.mobilenetv3 import MobileNetV3
    from torch import nn

    common = dict(
        block_args=decode_arch_def([list(s) for s in config.arch_def], config.depth_multiplier),
        num_classes=config.num_classes, in_chans=config.in_channels,
        stem_size=config.stem_size, fix_stem=config.fix_stem,
        pad_type="same" if config.padding == "same" else "",
        act_layer=get_act_layer({"silu": "swish"}.get(config.act, config.act)),
        norm_layer=partial(nn.BatchNorm2d, eps=config.bn_eps,
                           momentum=round(1.0 - config.bn_momentum, 12)),
        drop_rate=config.drop_rate, drop_path_rate=config.drop_path_rate)
    if config.arch == "efficientnet":
        rounding = partial(round_channels, multiplier=config.channel_multiplier,
                           divisor=config.channel_divisor)
        return EfficientNet(**common, num_features=rounding(config.num_features),
                            round_chs_fn=rounding, **kwargs)
    assert config.arch == "mobilenetv3", config.arch
    se = partial(SqueezeExcite, gate_layer="hard_sigmoid", force_act_layer=nn.ReLU,
                 rd_round_fn=round_channels)
    return MobileNetV3(**common, num_features=config.num_features, se_layer=se,
                       round_chs_fn=partial(round_channels,
                                            multiplier=config.channel_multiplier,
                                            divisor=config.channel_divisor), **kwargs)


def randomise(model: Any, seed: int = 0) -> Any:
    """Every array of `model` drawn anew (timm starts BatchNorm at 1 / 0 and biases at 0):
    weights N(0, 0.5 / sqrt(fan_in)) so that activations keep their scale through depth,
    BatchNorm weights around 1, biases and means around 0, variances in [0.5, 1.5)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, v in model.state_dict().items():
            if not v.is_floating_point():
                v.zero_()
            elif key.endswith("running_var"):
                v.copy_(0.5 + torch.rand(v.shape, generator=g))
            elif v.ndim == 1:
                base = 1.0 if key.endswith("weight") else 0.0
                v.copy_(base + 0.1 * torch.randn(v.shape, generator=g))
            else:
                fan_in = int(np.prod(v.shape[1:]))
                v.copy_(torch.randn(v.shape, generator=g) / np.sqrt(2 * fan_in))
    return model


def one_block_per_stage(arch_def: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], ...]:
    """Each stage's first block string, repeated once: the first block of every stage that
    timm builds from `arch_def` (channels and squeeze widths do not depend on repeats)."""
    return tuple((re.sub(r"_r\d+", "_r1", stage[0]),) for stage in arch_def)
