"""Shared fixtures: the model cases every registry-wide test runs over."""

from __future__ import annotations

import importlib.util
import itertools
import os

# On a GPU, JAX would take 75% of its memory in every test process (xdist workers, PyTorch).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax
import pytest

import tests.toy_architecture  # noqa: F401  (an architecture registered only for the tests)
import zoo
from zoo import precision

jax.config.update("jax_numpy_rank_promotion", "raise")

HAVE_TORCH = importlib.util.find_spec("torch") is not None
if HAVE_TORCH:
    import torch  # noqa: F401  (imported first, so that the precision policy reaches it)

# Exactness is claimed at full float32 on every backend (TF32 on GPUs otherwise).
precision.set_global(precision.EXACT)

# The suite checks functions, not XLA's optimiser: programs compile with most optimisations off,
# which takes about 40% less compile time on CPU (the benchmarks compile as users do).
# ZOO_TEST_OPTIMIZED=1 runs the suite on fully optimised programs.
jax.config.update("jax_disable_most_optimizations", os.environ.get("ZOO_TEST_OPTIMIZED") != "1")


# The quick subset (`pytest --quick`, README): one architecture per kind of layer through the
# library-wide tests, every converter path and the command lines' refusals; the whole suite is
# what CI runs.
# Both have dense layers (the CNN's head, the ViT's MLP blocks): the MLP adds no kind of its own.
QUICK_ARCHS = frozenset({"cnn", "vit"})  # convolutions + BatchNorm + dense, attention + dense
# Property tests (hypothesis) draw this share of their examples in the quick subset.
QUICK_EXAMPLES_SHARE = 0.25
# A test marked `whole_model` runs a whole model through every format, optimizer or library: the
# path is the same for every architecture, so the subset runs it for this one only.
QUICK_WHOLE_MODEL_ARCH = "cnn"
# Whole programs end to end, multi-device and multi-process runs, sweeps over every method,
# damaged byte or kill point, the conv-transpose architectures (their layer rule stays in the
# subset), and the reference-model features of the ResNet and the ViT (named torchvision/timm
# models, timm options, adaptation, the features API).
FULL_ONLY = ("test_examples.py", "test_bench_matrix.py", "test_bench_convert.py",
             "test_bench_mesh.py", "test_sharding.py", "test_cuda_export.py",
             "test_multiprocess.py", "test_conv_transpose_methods.py", "test_checkpoint_fuzz.py",
             "test_depth.py", "test_unet3d.py", "test_resnet.py", "test_resnet_same_padding.py",
             "test_named_models.py", "test_model_api.py", "test_adapt.py", "test_vit.py",
             "test_intermediates.py", "test_vit_towers.py", "test_swin.py",
             "test_hf_towers.py", "test_big_vision_npz.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true",
                     help="the quick subset: the architectures " + ", ".join(sorted(QUICK_ARCHS))
                          + " (one per kind of layer), every converter path, the refusals")


_QUICK = {"on": False}


def pytest_configure(config: pytest.Config) -> None:
    _QUICK["on"] = bool(config.getoption("--quick"))


def examples(n: int) -> int:
    """How many hypothesis examples a property draws: `n` in the full suite, a share (at least
    2) in the quick subset. Read when a test module is imported, i.e. after the options."""
    return max(2, round(n * QUICK_EXAMPLES_SHARE)) if _QUICK["on"] else n


def _architecture_of(value: object) -> str | None:
    """The architecture a test parameter names (an arch, a case id, a model name, a config)."""
    if isinstance(value, zoo.Config):
        return value.arch
    if not isinstance(value, str):
        return None
    if value in CASE_IDS:
        return next(cfg.arch for name, cfg in CASES if name == value)
    try:
        return zoo.names.resolve(value)[0]
    except (ValueError, KeyError):
        return None


def _outside_quick(item: pytest.Item) -> bool:
    if item.path.name in FULL_ONLY or item.get_closest_marker("full_only"):
        return True
    params = getattr(item, "callspec", None)
    values = params.params.values() if params is not None else ()
    variant = any(isinstance(v, str) and v in CASE_IDS and v not in zoo.ARCHS for v in values)
    archs = {a for a in map(_architecture_of, values) if a is not None}
    if item.get_closest_marker("whole_model"):
        return variant or bool(archs - {QUICK_WHOLE_MODEL_ARCH})
    return variant or bool(archs - QUICK_ARCHS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--quick` keeps the quick subset; `@pytest.mark.cpu_only(reason=...)`: a test of XLA:CPU
    behaviour, skipped elsewhere."""
    if config.getoption("--quick"):
        dropped = [item for item in items if _outside_quick(item)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if not _outside_quick(item)]
    backend = jax.default_backend()
    for item in items:
        mark = item.get_closest_marker("cpu_only")
        if mark is None:
            continue
        reason = mark.kwargs.get("reason") or (mark.args[0] if mark.args else None)
        if not reason:
            raise pytest.UsageError(f"{item.nodeid}: cpu_only needs a reason")
        if backend != "cpu":
            item.add_marker(pytest.mark.skip(reason=f"CPU only: {reason}"))

# Every registered architecture's tiny config, plus the variants it declares (`VARIANTS`) to
# exercise its optional paths.
CASES: list[tuple[str, zoo.Config]] = [(arch, zoo.tiny_config(arch)) for arch in zoo.ARCHS]
CASES += [(f"{arch}-{name}", zoo.tiny_config(arch, **overrides)) for arch in zoo.ARCHS
          for name, overrides in zoo.architecture(arch).config.VARIANTS.items()]
CASE_IDS = [name for name, _ in CASES]
PAIRS = list(itertools.permutations(zoo.JAX_IMPLS, 2))
PAIR_IDS = [f"{a}->{b}" for a, b in PAIRS]
