"""Shared fixtures: the model cases every registry-wide test runs over."""

from __future__ import annotations

import functools
import gc
import importlib.util
import itertools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

# On a GPU, JAX would take 75% of its memory in every test process (xdist workers, PyTorch).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# No test reaches the network or the user's Hugging Face cache: huggingface_hub (and timm's and
# transformers' loaders through it) reads these when first imported, which is after this point;
# tests that need a cache lay one out and point the library at it (tests/hub_cache.py).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_HUB_CACHE"] = tempfile.mkdtemp(prefix="zoo-tests-empty-hf-cache-")
if "huggingface_hub" in sys.modules:  # imported by a plugin already: its constants too
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    huggingface_hub.constants.HF_HUB_CACHE = os.environ["HF_HUB_CACHE"]
# The suite checks functions, not XLA's optimiser: programs compile with most optimisations off,
# which takes about 40% less compile time on CPU, and with XLA:CPU's elemental emitter rather
# than its MLIR fusion emitters, which took 2-4x the compile time on the suite's tiny programs
# (tests/test_fast.py: 192 -> 90 CPU-seconds, equal results). The commands and examples the
# tests run in fresh interpreters inherit both (XLA reads XLA_FLAGS when its backend starts,
# after this point). The benchmarks compile as users do outside the suite; ZOO_TEST_OPTIMIZED=1
# runs the suite on fully optimised programs from the default emitters, and a test of XLA's
# optimiser itself sets its own flags (tests/test_xla_cpu_repros.py).
if os.environ.get("ZOO_TEST_OPTIMIZED") != "1":
    os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "true"
    if "--xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", ""):  # else: theirs
        os.environ["XLA_FLAGS"] = " ".join(f for f in (
            os.environ.get("XLA_FLAGS", ""), "--xla_cpu_use_fusion_emitters=false") if f)
# One persistent compilation cache for the run: the xdist workers and the commands the tests
# run in fresh interpreters compile many of the same programs (the same tiny models in several
# modules), and JAX's cache (keyed by the program, the compile options and the versions)
# compiles each once. The process that makes it (the controller) removes it at the end; a
# cache the caller points to is theirs, used and kept.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="zoo-tests-xla-cache-")
    os.environ["ZOO_TESTS_OWN_XLA_CACHE"] = str(os.getpid())
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"

import jax
import pytest

import tests.toy_architecture  # noqa: F401  (an architecture registered only for the tests)
import zoo
from tests.kind_cover import covering_archs
from zoo.runtime import precision
from zoo.testing import pinned_fact

jax.config.update("jax_numpy_rank_promotion", "raise")

# `pytester`: tests of the suite's own options (tests/test_kind_cover.py).
pytest_plugins = ["pytester"]

HAVE_TORCH = importlib.util.find_spec("torch") is not None
if HAVE_TORCH:
    import torch  # noqa: F401  (imported first, so that the precision policy reaches it)
NEEDS_TORCH = pytest.mark.skipif(not HAVE_TORCH, reason="needs the torch extra")


def torch_marked(cases: Iterable[Any]) -> list[Any]:
    """Parameter values (or tuples of them): each naming "torch" marked to skip without the
    torch extra, so that a missing extra shows as skips, not as parameters that vanish."""
    return [pytest.param(*(c if isinstance(c, tuple) else (c,)), marks=NEEDS_TORCH)
            if "torch" in (c if isinstance(c, tuple) else (c,)) else c for c in cases]

# Exactness is claimed at full float32 on every backend (TF32 on GPUs otherwise).
precision.set_global(precision.EXACT)

UNOPTIMIZED = os.environ.get("ZOO_TEST_OPTIMIZED") != "1"
ELEMENTAL_EMITTER = "--xla_cpu_use_fusion_emitters=false"  # in XLA_FLAGS when UNOPTIMIZED
jax.config.update("jax_disable_most_optimizations", UNOPTIMIZED)


# The quick subset (`pytest --quick`, README): one architecture per kind of layer through the
# library-wide tests, every converter path and the command lines' refusals; the whole suite is
# what CI runs.
# All have dense layers (the CNN's head, the ViT's MLP blocks, the Llama's projections): the MLP
# adds no kind of its own. The CNN brings convolutions and BatchNorm, the ViT attention, the
# Llama family token ids, embeddings, RMSNorm, the rotary embedding and grouped-query attention.
QUICK_ARCHS = frozenset({"cnn", "vit", "llama"})
# Property tests (hypothesis) draw this share of their examples in the quick subset.
QUICK_EXAMPLES_SHARE = 0.25
# A test marked `whole_model` runs a whole model through every format, optimizer or library: the
# path is the same for every architecture, so the subset runs it for this one only, and the
# default suite for the kind cover's architectures (tests.kind_cover: every layer kind, loss and
# input) and this one; the others' cases are `exhaustive` (`--exhaustive` runs them).
QUICK_WHOLE_MODEL_ARCH = "cnn"
# Whole programs end to end, multi-device and multi-process runs, sweeps over every method,
# damaged byte or kill point, the conv-transpose architectures (their layer rule stays in the
# subset), the reference-model features of the ResNet, the ViT, ConvNeXt, EfficientNet and
# MobileNetV3 (named torchvision/timm models, timm options, adaptation, the features API), and
# the language models' variants but the Llama family's tiny config (and their named models),
# the allocator's page faults and the documentation site's build.
FULL_ONLY = ("test_examples.py", "test_bench_matrix.py", "test_bench_convert.py",
             "test_bench_mesh.py", "test_sharding.py", "test_cuda_export.py",
             "test_multiprocess.py", "test_conv_transpose_methods.py", "test_checkpoint_fuzz.py",
             "test_depth.py", "test_unet3d.py", "test_resnet.py", "test_resnet_same_padding.py",
             "test_named_models.py", "test_model_api.py", "test_adapt.py", "test_vit.py",
             "test_intermediates.py", "test_convnext.py", "test_named_language_models.py",
             "test_mbconv.py", "test_vit_towers.py", "test_swin.py", "test_hf_towers.py",
             "test_big_vision_npz.py", "test_malloc.py", "test_docs_site.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true",
                     help="the quick subset: the architectures " + ", ".join(sorted(QUICK_ARCHS))
                          + " (one per kind of layer), every converter path, the refusals")
    parser.addoption("--exhaustive", action="store_true",
                     help="also run the cross products the default suite covers by rotation "
                          "(tests marked exhaustive: every case x every library x every mode)")
    parser.addoption("--time-cap", type=float, default=None, metavar="SECONDS",
                     help="skip every test not started within SECONDS of the session's start "
                          "(reason: " + TIME_CAP + "; python -m zoo.bench gpu)")


_QUICK = {"on": False}
_CACHE_OWNER: dict[str, pytest.Config] = {}
# The time cap: tests that have not started by this time (time.time()) are skipped. xdist's
# workers get the controller's deadline (`pytest_configure_node`), not one of their own.
TIME_CAP = "time cap reached"
_DEADLINE: dict[str, float | None] = {"at": None}


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("ZOO_TESTS_OWN_XLA_CACHE") == str(os.getpid()):  # the first session
        os.environ["ZOO_TESTS_OWN_XLA_CACHE"] = "claimed"
        _CACHE_OWNER["config"] = config
    _QUICK["on"] = bool(config.getoption("--quick"))
    # pytest-xdist (`-n 2`): each module to one worker (unless --dist says otherwise), so that
    # a module's caches and fixtures are computed once rather than once per worker.
    asked = any(a.startswith("--dist") for a in config.invocation_params.args)
    if getattr(config.option, "dist", "no") == "load" and not asked:
        config.option.dist = "loadscope"
    worker = getattr(config, "workerinput", None)
    cap = config.getoption("--time-cap")
    if worker is not None and "zoo_deadline" in worker:
        _DEADLINE["at"] = worker["zoo_deadline"]
    elif cap is not None:
        _DEADLINE["at"] = time.time() + cap


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session that made the compilation cache removes it (not a run inside a test)."""
    if config is _CACHE_OWNER.get("config"):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: object) -> None:
    """pytest-xdist: each worker inherits the controller's deadline."""
    node.workerinput["zoo_deadline"] = _DEADLINE["at"]  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _DEADLINE["at"] is not None and time.time() > _DEADLINE["at"]:
        pytest.skip(TIME_CAP)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test marked `pinned(*packages)` checks a fact of those packages' versions in
    requirements/: its failure names the pinned and the installed versions."""
    marker = item.get_closest_marker("pinned")
    if marker is None:
        return (yield)
    with pinned_fact(*marker.args):
        return (yield)


def examples(n: int) -> int:
    """How many hypothesis examples a property draws: `n` in the full suite, a share (at least
    2) in the quick subset. Read when a test module is imported, i.e. after the options."""
    return max(2, round(n * QUICK_EXAMPLES_SHARE)) if _QUICK["on"] else n


def _architecture_of(value: object) -> str | None:
    """The architecture a test parameter names (an arch, a case id, a model name, a config)."""
    if isinstance(value, zoo.Config):
        return value.arch
    return _architecture_named(value) if isinstance(value, str) else None


@functools.cache
def _architecture_named(value: str) -> str | None:
    if value in CASE_IDS:
        return next(cfg.arch for name, cfg in CASES if name == value)
    try:
        return zoo.names.resolve(value)[0]
    except (ValueError, KeyError):
        return None


def _cases_of(item: pytest.Item) -> tuple[bool, set[str]]:
    """Whether `item`'s parameters name a variant case, and the architectures they name."""
    params = getattr(item, "callspec", None)
    values = params.params.values() if params is not None else ()
    variant = any(isinstance(v, str) and v in CASE_IDS and v not in zoo.ARCHS for v in values)
    return variant, {a for a in map(_architecture_of, values) if a is not None}


def _outside_quick(item: pytest.Item) -> bool:
    if item.path.name in FULL_ONLY or item.get_closest_marker("full_only"):
        return True
    variant, archs = _cases_of(item)
    if item.get_closest_marker("whole_model"):
        return variant or bool(archs - {QUICK_WHOLE_MODEL_ARCH})
    return variant or bool(archs - QUICK_ARCHS)


def _whole_model_beyond_cover(item: pytest.Item) -> bool:
    """A `whole_model` case of a variant, or of architectures all outside the kind cover and
    QUICK_WHOLE_MODEL_ARCH."""
    if not item.get_closest_marker("whole_model"):
        return False
    variant, archs = _cases_of(item)
    return variant or (bool(archs) and not archs & {*covering_archs(tuple(zoo.ARCHS)),
                                                    QUICK_WHOLE_MODEL_ARCH})


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the imports and the collection made lives to the end of the run: frozen out of
    Python's collector, whose full collections would otherwise walk those millions of objects
    (jax, torch, transformers, the collected items) again and again during the tests (~10% of
    a test process's CPU time, measured on tests/test_equivalence.py). The garbage of
    collection goes first; what the tests make is collected as usual."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--quick` keeps the quick subset; without `--exhaustive`, the cases a rotation leaves out
    of a cross product (`tests.kind_cover.cover`) and the `whole_model` cases beyond the kind
    cover are deselected; `@pytest.mark.cpu_only(reason=...)`: a test of XLA:CPU behaviour,
    skipped elsewhere."""
    for item in items:
        if _whole_model_beyond_cover(item):
            item.add_marker(pytest.mark.exhaustive)
    if not config.getoption("--exhaustive"):
        rest = [item for item in items if item.get_closest_marker("exhaustive")]
        if rest:
            config.hook.pytest_deselected(items=rest)
            items[:] = [item for item in items if not item.get_closest_marker("exhaustive")]
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
