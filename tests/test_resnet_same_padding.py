"""ResNet `padding="same"`: Flax's SAME in all four libraries (torch pads at run time, as
timm's `Conv2dSame`), pinned against the official Flax ImageNet example's ResNet run itself."""

from __future__ import annotations

import io
import warnings

import jax
import jax.numpy as jnp
import pytest
from rich.console import Console

import converters
import zoo
from converters.matching import transfer
from converters.matching.commands import print_mapping
from converters.matching.verify import forward, max_difference, random_input, tolerance
from tests.flax_imagenet import BottleneckResNetBlock, ResNet, ResNetBlock
from zoo.configs import PaddingWarning
from zoo.models.resnet.config import same_pads

pytest.importorskip("torch")
SMALL = {"stem": "imagenet", "layers": (1, 2), "widths": (4, 8), "stem_width": 4,
         "input_size": (16, 14), "num_classes": 5}


def test_same_pads_are_flax_s():
    assert same_pads(8, 3, 2) == (0, 1)  # where PyTorch's padding=1 pads (1, 1)
    assert same_pads(7, 3, 2) == (1, 1)
    assert same_pads(8, 3, 1) == (1, 1)
    assert same_pads(8, 1, 2) == (0, 0)


@pytest.mark.parametrize("block", ["basic", "bottleneck"])
def test_every_library_computes_the_same_function(block):
    config = zoo.make_config("resnet", **SMALL, block=block, padding="same")
    reference = zoo.create(config, "torch", seed=0)
    state = converters.to_canonical(reference, "torch")
    x = random_input(config.input_shape)
    out = forward(reference, "torch", x)
    for impl in ("eqx", "linen", "nnx"):
        got = forward(converters.from_canonical(state, config, impl), impl, x)
        assert max_difference(out, got) <= tolerance(), impl
    torch_padded = zoo.make_config("resnet", **SMALL, block=block)  # same weights, other pads
    other = forward(converters.from_canonical(state, torch_padded, "torch"), "torch", x)
    assert max_difference(out, other) > 100 * tolerance()


def _flax_example(block_cls, seed: int = 0):
    """The example's model with random variables, every parameter and statistic perturbed
    (its last BatchNorm of a block starts at scale 0)."""
    module = ResNet(stage_sizes=SMALL["layers"], block_cls=block_cls, num_classes=5,
                    num_filters=4)
    variables = module.init(jax.random.key(seed), jnp.zeros((1, 16, 14, 3)), train=False)
    leaves, tree = jax.tree.flatten(variables)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    leaves = [jnp.abs(v) + 0.5 if "var" in str(p) else v + 0.3 * jax.random.normal(k, v.shape)
              for (p, _), v, k in zip(jax.tree_util.tree_flatten_with_path(variables)[0],
                                      leaves, keys, strict=True)]
    return module, jax.tree.unflatten(tree, leaves)


@pytest.mark.parametrize(("block_cls", "block"), [(ResNetBlock, "basic"),
                                                 (BottleneckResNetBlock, "bottleneck")])
def test_flax_imagenet_example_runs_the_same_as_the_zoo_with_same_padding(block_cls, block):
    module, variables = _flax_example(block_cls)
    config = zoo.make_config("resnet", **SMALL, block=block, padding="same")
    res = transfer((module, variables), "linen", zoo.create(config, "torch", seed=1), "torch",
                   input_shape=config.input_shape)
    assert res.max_difference <= res.tolerance  # the Flax model itself was run
    printed = io.StringIO()
    print_mapping(Console(file=printed, width=200), res, show=False)
    assert (f"verified: the linen source model itself and the torch result differ by "
            f"{res.max_difference:.3g}") in printed.getvalue()
    assert {r.source for r in res.rows} >= {"conv_init", "bn_init", "ResNetBlock_1.conv_proj"
                                            if block == "basic" else
                                            "BottleneckResNetBlock_0.norm_proj"}
    # torchvision's padding is another function of the same weights: the check refuses it,
    # after the one warning that a Flax source may pad as SAME
    torch_padded = zoo.make_config("resnet", **SMALL, block=block)
    with (warnings.catch_warnings(record=True) as said,
          pytest.raises(converters.ConversionError, match="verification failed")):
        warnings.simplefilter("always")
        transfer((module, variables), "linen", zoo.create(torch_padded, "torch", seed=1),
                 "torch", input_shape=config.input_shape)
    assert [w.category for w in said] == [PaddingWarning]
