"""MobileNetV3 with timm's parameter names: conv_stem, bn1, blocks.i.j (conv_dw / conv_pw /
conv_pwl, bn1..bn3, se.conv_reduce / se.conv_expand; the last stage conv, bn1), conv_head,
classifier; hard-swish, hard-sigmoid gated squeeze-and-excitation, the efficient head."""

from zoo.models.mbconv import MODELS
from zoo.models.mobilenetv3.config import MobileNetV3Config
from zoo.registry import register

register(MobileNetV3Config, **MODELS)
