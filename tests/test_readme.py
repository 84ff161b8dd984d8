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
from zoo.testing import tolerance

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    blocks = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    assert len(blocks) >= 2, "the README starts with the main-job and the test commands"
    test_command = blocks[1].split("&&")[-1].strip()
    assert test_command in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("impl", zoo.JAX_IMPLS)
@pytest.mark.parametrize(("case", "config"), CASES, ids=CASE_IDS)
def test_readme_jit_pattern_works_for_every_model(case, config, impl):
    """The tour's pattern, `static, params, state = api.split(model)` then
    `jax.jit(api.apply, static_argnums=0)`: every registered model (and variant) has a hashable
    static part, and the jitted call gives the model's eval output."""
    model = zoo.create(config, impl, seed=0)
    api = zoo.interface(impl)
    static, params, state = api.split(model)
    hash(static)  # a static argument must be hashable (an Equinox list field is not)
    assert static == api.split(model)[0]  # and equal across splits: one compilation
    x = api.to_native(zoo.example_input(config, batch=2))
    y, _ = jax.jit(api.apply, static_argnums=0, static_argnames="train")(
        static, params, state, x, train=False)
    np.testing.assert_allclose(np.asarray(y), np.asarray(api.forward(model, x)),
                               **tolerance(np.float32))
