"""Shared fixtures: the model cases every registry-wide test runs over."""

from __future__ import annotations

import importlib.util
import itertools

import jax

import tests.toy_architecture  # noqa: F401  (an architecture registered only for the tests)
import zoo

jax.config.update("jax_numpy_rank_promotion", "raise")

HAVE_TORCH = importlib.util.find_spec("torch") is not None

# Every registered architecture's tiny config, plus the variants it declares (`VARIANTS`) to
# exercise its optional paths.
CASES: list[tuple[str, zoo.Config]] = [(arch, zoo.tiny_config(arch)) for arch in zoo.ARCHS]
CASES += [(f"{arch}-{name}", zoo.tiny_config(arch, **overrides)) for arch in zoo.ARCHS
          for name, overrides in zoo.architecture(arch).config.VARIANTS.items()]
CASE_IDS = [name for name, _ in CASES]
PAIRS = list(itertools.permutations(zoo.JAX_IMPLS, 2))
PAIR_IDS = [f"{a}->{b}" for a, b in PAIRS]
