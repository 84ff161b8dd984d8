"""EfficientNet's configuration: timm's `_gen_efficientnet` (B0's arch_def scaled by width and
depth multipliers), its named models and the TensorFlow ports (`tf_`: SAME padding, BatchNorm
eps 1e-3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from zoo.models.mbconv.config import MBConvNetConfig
from zoo.models.mbconv.spec import SqueezeExcite

B0: tuple[tuple[str, ...], ...] = (
    ("ds_r1_k3_s1_e1_c16_se0.25",), ("ir_r2_k3_s2_e6_c24_se0.25",),
    ("ir_r2_k5_s2_e6_c40_se0.25",), ("ir_r3_k3_s2_e6_c80_se0.25",),
    ("ir_r3_k5_s1_e6_c112_se0.25",), ("ir_r4_k5_s2_e6_c192_se0.25",),
    ("ir_r1_k3_s1_e6_c320_se0.25",))
# timm's (channel_multiplier, depth_multiplier) of B0 .. B4
SCALES: dict[str, tuple[float, float]] = {"b0": (1.0, 1.0), "b1": (1.0, 1.1), "b2": (1.1, 1.2),
                                          "b3": (1.2, 1.4), "b4": (1.4, 1.8)}
TF_PORT: dict[str, Any] = {"padding": "same", "bn_eps": 1e-3}  # timm's tf_efficientnet_*


@dataclass(frozen=True)
class EfficientNetConfig(MBConvNetConfig):
    """timm's `EfficientNet`: conv_stem bn1 (act), `blocks.i.j` (depthwise-separable and
    inverted-residual blocks with squeeze-and-excitation: SiLU between the squeeze's convs, a
    sigmoid gate, its width `round(se_ratio * block input)`), conv_head bn2 (act), global average
    pool, dropout, classifier. The head conv has `round_chs(num_features)` channels. Defaults
    are efficientnet_b0."""

    arch: ClassVar[str] = "efficientnet"
    REFERENCES: ClassVar[dict[str, str]] = {
        "timm's EfficientNet": "tests/test_mbconv.py",
        "timm's keys, shapes and parameter counts": "tests/test_named_models.py",
    }
    SE: ClassVar[SqueezeExcite] = SqueezeExcite(gate="sigmoid", act=None, from_exp=False,
                                                divisible=False)
    # Two stages (a depthwise-separable block with SE, then two 5x5 inverted residuals at
    # stride 2, the second with a skip), 8 channels wide, at a non-square size.
    TINY: ClassVar[dict[str, Any]] = {
        "arch_def": (("ds_r1_k3_s1_e1_c8_se0.25",), ("ir_r2_k5_s2_e2_c8_se0.25",)),
        "stem_size": 8, "num_features": 16, "input_size": (9, 8), "num_classes": 5}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = {
        **{f"efficientnet_{b}": {"channel_multiplier": c, "depth_multiplier": d}
           for b, (c, d) in SCALES.items()},
        **{f"tf_efficientnet_{b}": {"channel_multiplier": c, "depth_multiplier": d, **TF_PORT}
           for b, (c, d) in SCALES.items()},
    }
    arch_def: tuple[tuple[str, ...], ...] = B0

    @property
    def head_chs(self) -> int:
        """Channels of conv_head (timm's `num_features`, scaled)."""
        return self.round_chs(self.num_features)
