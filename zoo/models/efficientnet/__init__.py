"""EfficientNet with timm's parameter names: conv_stem, bn1, blocks.i.j (depthwise-separable and
inverted-residual blocks: conv_dw / conv_pw / conv_pwl, bn1..bn3, se.conv_reduce /
se.conv_expand), conv_head, bn2, classifier; the TensorFlow ports pad as SAME."""

from zoo.models.efficientnet.config import EfficientNetConfig
from zoo.models.mbconv import MODELS
from zoo.registry import register

register(EfficientNetConfig, **MODELS)
