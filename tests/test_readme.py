"""The README's jit pattern works for every registered model, and its test command is the one
CI uses (its Python blocks and other commands run in tests/test_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np
import pytest

import zoo
from tests.conftest import CASE_IDS, CASES
from tests.kind_cover import cover

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    """CI installs as the README's test command does, at the versions the pinned facts need
    (requirements/constraints.txt), and runs its pytest command."""
    blocks = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert len(blocks) >= 2, "the README starts with the main-job and the test commands"
    *installs, test_command = (part.strip() for part in blocks[1].split("&&"))
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci
    assert "pip install -c requirements/constraints.txt -e" in installs[-1]
    for install in installs:
        assert install.removeprefix("pip install ") in ci, install


@pytest.mark.parametrize("impl", zoo.JAX_IMPLS)
@pytest.mark.parametrize(("case", "config"), CASES, ids=CASE_IDS)
def test_every_models_static_part_is_hashable_and_equal_across_splits(case, config, impl):
    """What the tour's `jax.jit(api.apply, static_argnums=0)` needs of every registered model
    (and variant) in every library: a hashable static part, equal across splits (so a second
    split's call reuses the first compilation, compiled below in turn)."""
    model = zoo.create(config, impl, seed=0)
    api = zoo.interface(impl)
    static, *_ = api.split(model)
    hash(static)  # a static argument must be hashable (an Equinox list field is not)
    again, *_ = api.split(model)
    assert again == static and hash(again) == hash(static)


@pytest.mark.parametrize(("case", "config", "impl"), cover(
    CASES, zoo.JAX_IMPLS, ids=CASE_IDS))
def test_readme_jit_pattern_works_for_every_model(case, config, impl):
    """The tour's pattern, `static, params, state = api.split(model)` then
    `jax.jit(api.apply, static_argnums=0)`: a second split's call reuses the first compilation
    (every case in one library in turn; --exhaustive: in all).
    (That the compiled call computes the model is tests/test_equivalence.py's: the libraries
    agree compiled and eager, and tests/test_torch_reference.py's: they agree with PyTorch.)"""
    model = zoo.create(config, impl, seed=0)
    api = zoo.interface(impl)
    static, params, state = api.split(model)
    x = api.to_native(zoo.example_input(config, batch=2))
    apply = jax.jit(api.apply, static_argnums=0, static_argnames="train")
    y, _ = apply(static, params, state, x, train=False)
    again, *arrays = api.split(model)
    apply(again, *arrays, x, train=False)
    assert apply._cache_size() == 1, "a second split compiled again"
    assert np.asarray(y).shape[0] == 2 and np.isfinite(np.asarray(y)).all()
