"""MobileNetV3's configuration: timm's `_gen_mobilenet_v3` (the large and small arch_defs),
its named models, and torchvision's (BatchNorm eps 1e-3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from zoo.models.mbconv.config import Activation, MBConvNetConfig
from zoo.models.mbconv.spec import SqueezeExcite

LARGE: tuple[tuple[str, ...], ...] = (
    ("ds_r1_k3_s1_e1_c16_nre",), ("ir_r1_k3_s2_e4_c24_nre", "ir_r1_k3_s1_e3_c24_nre"),
    ("ir_r3_k5_s2_e3_c40_se0.25_nre",),
    ("ir_r1_k3_s2_e6_c80", "ir_r1_k3_s1_e2.5_c80", "ir_r2_k3_s1_e2.3_c80"),
    ("ir_r2_k3_s1_e6_c112_se0.25",), ("ir_r3_k5_s2_e6_c160_se0.25",), ("cn_r1_k1_s1_c960",))
SMALL: tuple[tuple[str, ...], ...] = (
    ("ds_r1_k3_s2_e1_c16_se0.25_nre",), ("ir_r1_k3_s2_e4.5_c24_nre", "ir_r1_k3_s1_e3.67_c24_nre"),
    ("ir_r1_k5_s2_e4_c40_se0.25", "ir_r2_k5_s1_e6_c40_se0.25"), ("ir_r2_k5_s1_e3_c48_se0.25",),
    ("ir_r3_k5_s2_e6_c96_se0.25",), ("cn_r1_k1_s1_c576",))
# torchvision's BatchNorm2d(eps=0.001, momentum=0.01)
TORCHVISION: dict[str, Any] = {"bn_eps": 1e-3, "bn_momentum": 0.99}


@dataclass(frozen=True)
class MobileNetV3Config(MBConvNetConfig):
    """timm's `MobileNetV3`: conv_stem bn1 (act), `blocks.i.j` (squeeze-and-excitation with a
    ReLU between its convs, a hard-sigmoid gate and `round_chs(0.25 * expanded)` channels; the
    last stage a 1x1 conv bn act), then the efficient head: global average pool, conv_head (a
    1x1 conv with bias to `num_features`), act, dropout, classifier. Defaults are
    mobilenetv3_large_100; `mobilenet_v3_large` / `mobilenet_v3_small` are torchvision's (the
    same function but for BatchNorm eps 1e-3 and momentum 0.01; their keys convert with the
    torchvision layouts, `converters.adapters.torchvision_mbconv`)."""

    arch: ClassVar[str] = "mobilenetv3"
    REFERENCES: ClassVar[dict[str, str]] = {
        "timm's MobileNetV3": "tests/test_mbconv.py",
        "torchvision's MobileNetV3 layout": "tests/test_mbconv.py",
        "timm's keys, shapes and parameter counts": "tests/test_named_models.py",
    }
    SE: ClassVar[SqueezeExcite] = SqueezeExcite(gate="hard_sigmoid", act="relu", from_exp=True,
                                                divisible=True)
    EFFICIENT_HEAD: ClassVar[bool] = True
    # The small model's first stages: a strided depthwise-separable block with SE (the stem is
    # tapped), an inverted residual without and one with SE and a skip, the 1x1 conv stage.
    TINY: ClassVar[dict[str, Any]] = {
        "arch_def": (("ds_r1_k3_s2_e1_c8_se0.25_nre",), ("ir_r1_k3_s2_e2_c8_nre",
                                                         "ir_r1_k5_s1_e2_c8_se0.25"),
                     ("cn_r1_k1_s1_c16",)),
        "stem_size": 8, "num_features": 16, "input_size": (9, 8), "num_classes": 5}
    NAMED: ClassVar[dict[str, dict[str, Any]]] = {
        "mobilenetv3_large_100": {},
        "mobilenetv3_small_100": {"arch_def": SMALL, "num_features": 1024},
        "mobilenet_v3_large": dict(TORCHVISION),
        "mobilenet_v3_small": {"arch_def": SMALL, "num_features": 1024, **TORCHVISION},
    }
    arch_def: tuple[tuple[str, ...], ...] = LARGE
    stem_size: int = 16
    act: Activation = "hard_swish"
