"""torchvision's EfficientNet (`efficientnet_b0` ... `efficientnet_b4`) and MobileNetV3
(`mobilenet_v3_large`, `mobilenet_v3_small`): their state_dict layouts, the zoo's efficientnet
and mobilenetv3 (timm's names) with the same functions.

torchvision numbers its `features` as it builds them: `features.0` the stem (conv, BatchNorm),
then the blocks, then the last 1x1 conv (conv, BatchNorm). A block is `block.k` in build order:
the expansion (absent when it would keep the width: timm's depthwise-separable block), the
depthwise conv, the squeeze-and-excitation (`fc1`, `fc2`: timm's `conv_reduce`, `conv_expand`)
where there is one, the projection; each conv with its BatchNorm as `.0`, `.1`.

- EfficientNet groups its blocks by stage (`features.{s + 1}.{i}`, timm's `blocks.{s}.{i}`),
  the same seven stages in B0 to B4: one layout for every width and depth (squeeze widths
  `input // 4` and the head's `4 x` last width are timm's at B0 to B4). Its head conv is
  `features.8`, its classifier `classifier.1` (after a dropout).
- MobileNetV3 numbers its blocks flat (`features.1 ... features.N`), so the large and the small
  model each have their own layout (generated from the zoo's named configs' blocks). Its
  classifier is `Linear, Hardswish, Dropout, Linear`: the first Linear is timm's `conv_head`,
  a 1x1 conv with a bias on the pooled features (reshaped `(O, I)` <-> `(O, I, 1, 1)`), the
  last one `classifier`.

The functions are the zoo's named configs: torchvision's EfficientNet-B0 ... B4 are
`efficientnet_b0` ... `efficientnet_b4` (BatchNorm eps 1e-5, PyTorch's padding); its
MobileNetV3s pad as PyTorch with BatchNorm eps 1e-3 (momentum 0.01): the named configs
`mobilenet_v3_large` / `mobilenet_v3_small` (timm's `mobilenetv3_*_100` but for the eps).
"""

from __future__ import annotations

import numpy as np

from converters.adapters.adapter import Adapter, Rename, Transform
from zoo.models.efficientnet.config import EfficientNetConfig
from zoo.models.mbconv.spec import BlockSpec
from zoo.models.mobilenetv3.config import MobileNetV3Config

# A Linear's `(O, I)` weight is a 1x1 conv's `(O, I, 1, 1)`.
LINEAR_AS_CONV = Transform("(O, I) -> (O, I, 1, 1)", lambda a: np.asarray(a)[:, :, None, None],
                           lambda a: np.asarray(a).reshape(np.shape(a)[:2]))


def _conv_bn(foreign: str, conv: str, bn: str) -> tuple[Rename, ...]:
    return (Rename(f"{foreign}.0.{{p}}", f"{conv}.{{p}}"),
            Rename(f"{foreign}.1.{{p}}", f"{bn}.{{p}}"))


def _block(foreign: str, zoo: str, spec: BlockSpec) -> tuple[Rename, ...]:
    """One block's renames: torchvision's `{foreign}.block.k` for the zoo's block `zoo`."""
    if spec.type == "cn":
        return _conv_bn(foreign, f"{zoo}.conv", f"{zoo}.bn1")
    parts = []
    if spec.type == "ir":  # the expansion, then the depthwise conv
        parts += [("conv", "conv_pw", "bn1"), ("conv", "conv_dw", "bn2")]
    else:
        parts += [("conv", "conv_dw", "bn1")]
    if spec.se_chs:
        parts.append(("se", "se.conv_reduce", "se.conv_expand"))
    parts.append(("conv", "conv_pwl", "bn3") if spec.type == "ir" else ("conv", "conv_pw", "bn2"))
    out: list[Rename] = []
    for k, (kind, a, b) in enumerate(parts):
        if kind == "se":
            out += [Rename(f"{foreign}.block.{k}.fc1.{{p}}", f"{zoo}.{a}.{{p}}"),
                    Rename(f"{foreign}.block.{k}.fc2.{{p}}", f"{zoo}.{b}.{{p}}")]
        else:
            out += _conv_bn(f"{foreign}.block.{k}", f"{zoo}.{a}", f"{zoo}.{b}")
    return tuple(out)


_STEM = _conv_bn("features.0", "conv_stem", "bn1")
# every stage's blocks as the first one of B0's (B1 to B4 have the same kinds per stage)
_B0_STAGES = tuple(stage[0] for stage in EfficientNetConfig.named("efficientnet_b0").stages())
TORCHVISION_EFFICIENTNET = Adapter(
    name="torchvision-efficientnet", description="torchvision EfficientNet",
    arch="efficientnet",
    renames=(*_STEM,
             *(r for s, spec in enumerate(_B0_STAGES)
               for r in _block(f"features.{s + 1}.{{i}}", f"blocks.{s}.{{i}}", spec)),
             *_conv_bn("features.8", "conv_head", "bn2"),
             Rename("classifier.1.{p}", "classifier.{p}")),
    groups=(("features.0.0.", "stem (features.0.0)"),
            ("classifier.1.", "classifier (classifier.1)")))


def _mobilenet_v3(size: str) -> Adapter:
    """torchvision's `mobilenet_v3_{size}`: its flat blocks renamed after the zoo's named
    config's stages."""
    config = MobileNetV3Config.named(f"mobilenet_v3_{size}")
    blocks = [(f"blocks.{s}.{j}", spec) for s, stage in enumerate(config.stages())
              for j, spec in enumerate(stage)]
    renames = [r for n, (zoo, spec) in enumerate(blocks)
               for r in _block(f"features.{n + 1}", zoo, spec)]
    return Adapter(
        name=f"torchvision-mobilenet-v3-{size}",
        description=f"torchvision MobileNetV3 ({size})", arch="mobilenetv3",
        renames=(*_STEM, *renames,
                 Rename("classifier.0.weight", "conv_head.weight", LINEAR_AS_CONV),
                 Rename("classifier.0.bias", "conv_head.bias"),
                 Rename("classifier.3.{p}", "classifier.{p}")),
        groups=(("features.0.0.", "stem (features.0.0)"),
                ("classifier.3.", "classifier (classifier.3)")))


TORCHVISION_MOBILENET_V3_LARGE = _mobilenet_v3("large")
TORCHVISION_MOBILENET_V3_SMALL = _mobilenet_v3("small")
