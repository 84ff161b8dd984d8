"""The rotation cover: every case runs, every combo is reached, the rest waits for
--exhaustive."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import zoo
from tests.kind_cover import by_options, cover, covering_archs, features, latin, rotation


def _suite_conftest(pytester: pytest.Pytester) -> None:
    """The inner run collects with the suite's own options and deselection."""
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n"
                          "from tests.conftest import pytest_addoption, "
                          "pytest_collection_modifyitems  # noqa: F401\n")


@given(st.integers(1, 40), st.integers(1, 12), st.integers(1, 12))
def test_every_case_runs_and_every_combo_is_reached(n_cases, n_combos, per_case):
    chosen = rotation(n_cases, n_combos, per_case)
    assert len(chosen) == n_cases
    assert all(len(c) == min(per_case, n_combos) for c in chosen)
    reached = set().union(*chosen)
    assert len(reached) == min(n_combos, n_cases * min(per_case, n_combos))


def test_cover_marks_the_rest_exhaustive():
    params = cover(["a", "b", "c"], [("x",), ("y",)])
    marked = {p.id for p in params if any(m.name == "exhaustive" for m in p.marks)}
    assert [p.id for p in params] == ["a-x", "a-y", "b-x", "b-y", "c-x", "c-y"]
    assert marked == {"a-y", "b-x", "c-y"}
    assert params[0].values == ("a", "x")


def test_latin_windows_take_every_x_once_and_turn_the_ys():
    xs = [pytest.param("eqx", id="eqx"), pytest.param("linen", id="linen"),
          pytest.param("nnx", id="nnx", marks=pytest.mark.full_only)]
    combos = latin(xs, [("eval",), ("train",)])
    assert sorted(c.values for c in combos) == sorted(
        (x, y) for x in ("eqx", "linen", "nnx") for y in ("eval", "train"))
    windows = [combos[:3], combos[3:]]
    assert all(sorted(c.values[0] for c in w) == ["eqx", "linen", "nnx"] for w in windows)
    assert [c.values for c in windows[0]] == [("eqx", "eval"), ("linen", "train"),
                                              ("nnx", "eval")]
    assert all(any(m.name == "full_only" for m in c.marks) for c in combos
               if c.values[0] == "nnx")


INNER = ("-p", "no:xdist", "-p", "no:benchmark")  # the inner run: in this process, quiet


def test_exhaustive_cases_are_deselected_by_default(pytester: pytest.Pytester):
    _suite_conftest(pytester)
    pytester.makepyfile(test_x="""
import pytest
from tests.kind_cover import cover

@pytest.mark.parametrize(("case", "mode"), cover(["a", "b"], [("x",), ("y",), ("z",)]))
def test_it(case, mode):
    pass
""")
    pytester.makeini("[pytest]\nmarkers =\n    exhaustive: x\n")
    assert pytester.runpytest_inprocess(*INNER).parseoutcomes() == {
        "passed": 2, "deselected": 4}
    assert pytester.runpytest_inprocess(*INNER, "--exhaustive").parseoutcomes() == {
        "passed": 6}


def test_whole_model_cases_beyond_the_kind_cover_are_deselected_by_default(
        pytester: pytest.Pytester):
    """A `whole_model` test runs for the kind cover's architectures and the CNN; another
    architecture's case and a variant's only with --exhaustive; a test naming none runs."""
    _suite_conftest(pytester)
    pytester.makepyfile(test_x="""
import pytest

@pytest.mark.whole_model
@pytest.mark.parametrize("case", ["cnn", "vit", "resnet", "vit-options", "nothing"])
def test_it(case):
    pass
""")
    pytester.makeini("[pytest]\nmarkers =\n    exhaustive: x\n    whole_model: x\n")
    assert pytester.runpytest_inprocess(*INNER).parseoutcomes() == {
        "passed": 3, "deselected": 2}
    assert pytester.runpytest_inprocess(*INNER, "--exhaustive").parseoutcomes() == {
        "passed": 5}


def test_the_kind_cover_holds_every_feature_and_no_architecture_twice():
    archs = tuple(zoo.ARCHS)
    have = {a: features(a) for a in archs}
    chosen = covering_archs(archs)
    assert set().union(*(have[a] for a in chosen)) == set().union(*have.values())
    for arch in chosen:
        assert not have[arch] <= set().union(*(have[a] for a in chosen if a != arch)), arch


def test_named_models_differing_only_in_sizes_wait_for_exhaustive():
    params = by_options(["resnet18", "resnet34", "resnet50", "vit_small_patch16_224",
                         "vit_small_patch14_dinov2"])
    waiting = [p.values[0] for p in params if any(m.name == "exhaustive" for m in p.marks)]
    assert waiting == ["resnet34"]
