"""timm's `_efficientnet_builder` and `_efficientnet_blocks`, shared by the architectures built
from them (`efficientnet`, `mobilenetv3`); not an architecture itself.

`spec.py` decodes timm's block strings and scales them (`round_channels`, `make_divisible`,
per-stage depth rounded up) into `BlockSpec`s; `config.py` is the config base of the families;
`eqx.py`, `linen.py`, `nnx.py` and `torch.py` build the blocks (depthwise-separable, inverted
residual / MBConv, conv-bn-act, squeeze-and-excitation made of two 1x1 convs, drop path) with
timm's module names, from the specs alone.
"""
