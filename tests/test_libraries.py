"""One object per library: no per-library branch outside zoo/libraries, a fifth library and a
new architecture from the docs' own steps, and the model contract refusing bad classes."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import chex
import equinox as eqx
import jax
import numpy as np
import pytest

import canonical
import converters
import zoo
from tests.conftest import torch_marked
from zoo.bench.styles import FUNCTIONS, benched
from zoo.libraries import ContractError, library, owner, registered
from zoo.registry import restoring
from zoo.testing import assert_close

ROOT = Path(__file__).resolve().parents[1]
HAVE_TORCH = importlib.util.find_spec("torch") is not None
NAMES = r'"(?:eqx|linen|nnx|torch|flax)"'
BRANCHES = (
    re.compile(rf"(?:==|!=)\s*{NAMES}|{NAMES}\s*(?:==|!=)"),  # impl == "eqx"
    # x in ("linen", "nnx")
    re.compile(rf"\bin\s*[(\[{{]\s*{NAMES}(?:\s*,\s*{NAMES})*\s*,?\s*[)\]}}]"),
)
# A dict keyed by library names (a layer kind's `classes=` lists its class in each library).
TABLE = re.compile(r'(\w+\s*=\s*)?\{[^{}]*"linen"\s*:[^{}]*"nnx"\s*:[^{}]*\}', re.S)
# Files allowed a branch until it is moved into a library or format object (none left). Each
# entry must still hold a branch, so the list only shrinks.
PENDING: set[str] = set()


def _library_branches() -> list[str]:
    found = []
    paths = (p for d in ("zoo", "converters", "canonical") for p in (ROOT / d).rglob("*.py"))
    for path in sorted(paths):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("zoo/libraries/", "zoo/models/")):
            continue
        text = path.read_text()
        hits = [m for rx in BRANCHES for m in rx.finditer(text)]
        hits += [m for m in TABLE.finditer(text)
                 if (m.group(1) or "").replace(" ", "") != "classes="]
        found += [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)[:50]}" for m in hits]
    return found


def test_no_per_library_branch_outside_the_library_modules():
    found = _library_branches()
    new = [f for f in found if not f.startswith(tuple(PENDING))]
    assert not new, "per-library branches (ask zoo.library(impl) instead):\n" + "\n".join(new)
    stale = [p for p in PENDING if not any(f.startswith(p) for f in found)]
    assert not stale, f"no branch left in {stale}: remove them from PENDING"


def test_the_grep_finds_a_branch():
    assert BRANCHES[0].search('if impl == "nnx":') and BRANCHES[1].search('x in ("linen", "nnx")')
    assert TABLE.search('T = {"eqx": 1, "linen": 2, "nnx": 3}')
    kind = TABLE.search('LayerKind("k", classes={"eqx": 1, "linen": 2, "nnx": 3})')
    assert kind.group(1) == "classes="  # a layer kind's own table, allowed


def test_tables_are_derived_from_the_registry():
    assert tuple(zoo.IMPLS) == ("eqx", "linen", "nnx", "torch")
    assert tuple(zoo.JAX_IMPLS) == tuple(i for i in zoo.IMPLS if library(i).is_jax)
    for impl in zoo.IMPLS:
        lib = library(impl)
        assert lib.interface.channels_last == lib.channels_last and lib.walker.impl == impl
        assert canonical.walker(impl) is lib.walker


@pytest.mark.parametrize("impl", torch_marked(("eqx", "linen", "nnx", "torch")))
def test_owner_recognises_each_librarys_models(impl):
    model = zoo.create("mlp", impl, seed=0)
    assert owner(model) is library(impl)
    assert owner({"fc.weight": np.zeros(2)}) is None


def test_an_unknown_library_is_named():
    with pytest.raises(ValueError, match="unknown implementation 'jaxx'"):
        library("jaxx")


# --------------------------------------------------------------------------- the docs' steps
def _doc_blocks(name: str) -> list:
    """The doc's python blocks, compiled as written (without this module's __future__)."""
    text = (ROOT / "docs" / name).read_text()
    return [compile(b, name, "exec", dont_inherit=True)
            for b in re.findall(r"```python\n(.*?)```", text, re.S)]


@pytest.mark.skipif(not HAVE_TORCH, reason="the flavour is one of PyTorch")
def test_a_fifth_library_from_the_docs_converts_and_computes_the_same():
    namespace: dict = {}
    definition, usage = _doc_blocks("adding_a_library.md")
    exec(definition, namespace)
    exec(usage, namespace)
    assert "torch_flavour" not in zoo.IMPLS  # the registry is restored after the `with`
    with registered(namespace["TorchFlavour"]()):
        config = zoo.tiny_config("cnn")
        flavour = zoo.create(config, "torch_flavour", seed=3)
        model, state = converters.convert(flavour, "torch_flavour", "eqx")
        back = converters.convert((model, state), "eqx", "torch_flavour")
        x = zoo.example_input(config, batch=2, seed=1)
        want = zoo.native_interface("torch_flavour").forward(flavour, x)
        assert_close(zoo.interface("eqx").forward((model, state), x), want)
        assert_close(zoo.native_interface("torch_flavour").forward(back, x), want)
        assert benched("torch_flavour") == benched("torch")  # benchmarked as what it flavours
    assert "torch_flavour" not in zoo.IMPLS


def test_the_benchmark_knows_how_to_call_every_library_and_the_libraries_know_no_benchmark():
    """Each registered library has its call styles (functions of `zoo.bench.styles`), default
    and idiomatic among them, as they were declared on the Library objects before; and
    `zoo.libraries` names no benchmark or plot."""
    was = {"eqx": (("filter_jit", "partition", "fast", "fused"), "fast", "filter_jit"),
           "linen": (("jit", "fast", "fused"), "fast", "jit"),
           "nnx": (("nnx_jit", "jit_tree", "flaxlib", "cached_partial", "jit_partial", "split",
                    "fast", "fused"), "fast", "nnx_jit"),
           "torch": (("eager", "compile"), "eager", "eager")}
    for impl in zoo.IMPLS:
        b = benched(impl)
        assert (b.styles, b.default, b.idiomatic) == was[impl], impl
        assert set(b.styles) <= set(FUNCTIONS)
    for path in (ROOT / "zoo" / "libraries").glob("*.py"):
        text = path.read_text()
        assert "zoo.bench" not in text and "color" not in text, path.name


def test_an_architecture_from_the_docs_registers_and_converts():
    namespace: dict = {}
    with restoring():
        for block in _doc_blocks("adding_an_architecture.md"):
            exec(block, namespace)
        config = namespace["model"].config
        x = zoo.example_input(config, batch=2)
        outs = [zoo.interface(i).forward(converters.convert(namespace["model"], "nnx", i), x)
                for i in ("eqx", "linen")]
        want = zoo.interface("nnx").forward(namespace["model"], x)
        assert_close(outs[0], want)
        assert_close(outs[1], want)
    assert "line" not in zoo.ARCHS


# --------------------------------------------------------------------------- the contract
class _Config(zoo.Config):
    arch = "contract_probe"


def test_the_contract_refuses_a_constructor_without_the_rng_argument():
    class NoKey(eqx.Module):
        config: object = eqx.field(static=True)

        def __init__(self, config, *, dtype=None):
            self.config = config

    with restoring(), pytest.raises(ContractError, match=r"NoKey breaks the eqx .*`key=`"):
        zoo.register(_Config, eqx=NoKey)


def test_the_contract_refuses_a_missing_config():
    class NoConfig:
        def __init__(self, *, rngs, param_dtype=None): ...

    with restoring(), pytest.raises(ContractError, match=r"NoConfig.*no `config` argument"):
        zoo.register(_Config, nnx=NoConfig)


def test_the_contract_refuses_an_unhashable_equinox_static_part():
    config = zoo.tiny_config("mlp")

    class Listed(eqx.Module):
        layers: list
        config: object = eqx.field(static=True)

        def __init__(self, config, *, key, dtype=None):
            self.layers = [eqx.nn.Lambda(jax.nn.relu)]
            self.config = config

    with pytest.raises(ContractError, match=r"Listed.*static part is not hashable"):
        library("eqx").check_class(Listed, config)


def test_the_contract_refuses_state_without_has_state():
    config = zoo.tiny_config("mlp")

    class Stateful(eqx.Module):
        index: eqx.nn.StateIndex
        config: object = eqx.field(static=True)

        def __init__(self, config, *, key, dtype=None):
            self.index = eqx.nn.StateIndex(jax.numpy.zeros(2))
            self.config = config

    with pytest.raises(ContractError, match=r"Stateful.*`has_state = True`"):
        library("eqx").check_class(Stateful, config)


def test_every_registered_class_meets_its_contract():
    for arch, impl in zoo.list_implementations():
        library(impl).check_class(zoo.model_class(arch, impl), zoo.tiny_config(arch))


def test_nnx_skeleton_traced_without_origin_accounts(monkeypatch):
    """The NNX skeleton is traced without JAX's account of where a tracer came from (Flax
    asks for one per RNG draw, quadratic in the model's size): the same skeleton, and the
    account is back afterwards."""
    import contextlib

    from flax import nnx
    from jax._src.interpreters.partial_eval import DynamicJaxprTracer

    import zoo.libraries.nnx as nnx_library

    told = DynamicJaxprTracer.__dict__["_origin_msg"]
    cfg = zoo.tiny_config("vit")
    cls = zoo.model_class("vit", "nnx")
    fast = nnx.state(library("nnx").skeleton(cls, cfg, "float32"))
    assert DynamicJaxprTracer.__dict__["_origin_msg"] is told
    monkeypatch.setattr(nnx_library, "_tracer_errors_untold", contextlib.nullcontext)
    slow = nnx.state(library("nnx").skeleton(cls, cfg, "float32"))
    chex.assert_trees_all_equal_shapes_and_dtypes(fast, slow)
    assert jax.tree.structure(fast) == jax.tree.structure(slow)
