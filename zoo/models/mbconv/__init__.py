"""timm's `_efficientnet_builder` and `_efficientnet_blocks`, shared by the architectures built
from them (`efficientnet`, `mobilenetv3`); not an architecture itself.

`spec.py` decodes timm's block strings and scales them (`round_channels`, `make_divisible`,
per-stage depth rounded up) into `BlockSpec`s; `config.py` is the config base of the families;
`eqx.py`, `linen.py`, `nnx.py` and `torch.py` build the blocks (depthwise-separable, inverted
residual / MBConv, conv-bn-act, squeeze-and-excitation made of two 1x1 convs, drop path) with
timm's module names, from the specs alone, and the network, `MBConvNet`, from the config alone:
a family registers its config with `MODELS` and has no model code of its own.
"""

# The network in each library, for `zoo.registry.register(Config, **MODELS)`.
MODELS: dict[str, str] = {lib: f"zoo.models.mbconv.{lib}:MBConvNet"
                          for lib in ("eqx", "linen", "nnx", "torch")}
