"""Shared fixtures: the model cases every registry-wide test runs over."""

from __future__ import annotations

import importlib.util
import itertools

import jax

import zoo

jax.config.update("jax_numpy_rank_promotion", "raise")

HAVE_TORCH = importlib.util.find_spec("torch") is not None

# Every architecture's tiny config, plus variants that exercise optional paths.
CASES: list[tuple[str, zoo.Config]] = [(arch, zoo.make_config(arch).tiny()) for arch in zoo.ARCHS]
CASES += [
    ("cnn-nobn", zoo.CNNConfig.tiny(batch_norm=False)),
    ("gelu", zoo.MLPConfig.tiny(activation="gelu")),
    ("decoder3d-odd", zoo.Decoder3DConfig.tiny(
        kernel_size=(3, 5, 3, 1), stride=(2, 3, 1, 1), padding=(1, 2, 2, 0),
        output_padding=(1, 2, 0, 0), dilation=(1, 2, 2, 1), conv_method="pad")),
]
CASE_IDS = [name for name, _ in CASES]
PAIRS = list(itertools.permutations(zoo.JAX_IMPLS, 2))
PAIR_IDS = [f"{a}->{b}" for a, b in PAIRS]

