"""torchvision's ConvNeXt (`torchvision.models.convnext_tiny` ... `convnext_large`): its
state_dict layout, the zoo's convnext (timm's names) with the same function.

torchvision numbers its `features` as it builds them: `features.0` the stem (conv, LayerNorm2d),
then per stage its blocks (`features.1`, `.3`, `.5`, `.7`) and before each but the first its
downsampling (`features.2`, `.4`, `.6`: LayerNorm2d, conv). A block (`CNBlock`) holds
`layer_scale` `(C, 1, 1)` (the zoo's `gamma`, `(C,)`) and `block.0` depthwise conv, `block.2`
LayerNorm, `block.3` / `block.5` Linear (`mlp.fc1` / `mlp.fc2`); the head is `classifier.0`
(LayerNorm2d, `head.norm`) and `classifier.2` (Linear, `head.fc`). torchvision has no ConvNeXt
V2 and no 1x1-convolution MLP: zoo keys of those have no place here and are refused by name.
"""

from __future__ import annotations

from converters.adapters.adapter import Adapter, Rename, reshape

_BLOCK = {"block.0": "conv_dw", "block.2": "norm", "block.3": "mlp.fc1", "block.5": "mlp.fc2"}


def _stage(s: int) -> tuple[Rename, ...]:
    """Stage `s`'s renames: its downsampling (`features.{2s}`) and blocks (`features.{2s+1}`)."""
    blocks = f"features.{2 * s + 1}.{{i}}"
    zoo = f"stages.{s}.blocks.{{i}}"
    down = tuple(Rename(f"features.{2 * s}.{j}.{{p}}", f"stages.{s}.downsample.{j}.{{p}}")
                 for j in (0, 1)) if s else ()
    return (*down, Rename(f"{blocks}.layer_scale", f"{zoo}.gamma", reshape((-1,), (-1, 1, 1))),
            *(Rename(f"{blocks}.{tv}.{{p}}", f"{zoo}.{ours}.{{p}}") for tv, ours in _BLOCK.items()))


TORCHVISION_CONVNEXT = Adapter(
    name="torchvision-convnext", description="torchvision ConvNeXt", arch="convnext",
    renames=(Rename("features.0.0.{p}", "stem.0.{p}"), Rename("features.0.1.{p}", "stem.1.{p}"),
             *(r for s in range(4) for r in _stage(s)),
             Rename("classifier.0.{p}", "head.norm.{p}"),
             Rename("classifier.2.{p}", "head.fc.{p}")),
    groups=(("features.0.0.", "stem (features.0.0)"),
            ("classifier.2.", "classifier (classifier.2)")))
