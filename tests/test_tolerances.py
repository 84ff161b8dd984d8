"""No ad-hoc tolerances: a comparison in the suite takes the precision policy's tolerance
(`zoo.testing.assert_close`, `zoo.testing.tolerance`) or says why it may not (issue 52).

The lint reads every test file's syntax tree and flags a numeric literal reaching a tolerance:
an `rtol=`/`atol=` keyword (or the positional tolerance arguments of NumPy's, JAX's and PyTorch's
`allclose`/`isclose`/`assert_allclose`), `rel=`/`abs=` of `pytest.approx`, a dict literal with
an `"rtol"`/`"atol"` key, or a module-level name bound to such a literal. A `# tolerance:
<reason>` comment on the call's (or binding's) lines or in the comment block right above them
states why the number is right there: an element-wise function without reductions, a value
printed rounded, a check that two results must differ.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
REASON = re.compile(r"#\s*tolerance:\s*\S")
TOLERANCE_KEYWORDS = frozenset({"rtol", "atol"})
APPROX_KEYWORDS = frozenset({"rel", "abs"})
# Calls whose positional arguments after the two compared values are (rtol, atol).
POSITIONAL_TOLERANCES = frozenset({"assert_allclose", "allclose", "isclose"})


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _literal(node: ast.AST, bound: dict[str, ast.expr], seen: frozenset[str] = frozenset()
             ) -> bool:
    """Whether `node` computes a tolerance from a nonzero numeric literal (through module-level
    names too). Zero is no tolerance ("no absolute part"), so it is not flagged alone."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool) \
            and node.value != 0
    if isinstance(node, ast.Name) and node.id in bound and node.id not in seen:
        return _literal(bound[node.id], bound, seen | {node.id})
    return any(_literal(child, bound, seen) for child in ast.iter_child_nodes(node))


def _tolerance_values(node: ast.AST) -> list[ast.expr]:
    """The expressions that `node` passes or binds as a tolerance."""
    if isinstance(node, ast.Call):
        name = _name(node.func)
        keywords = APPROX_KEYWORDS if name == "approx" else TOLERANCE_KEYWORDS
        positional = node.args[1:3] if name == "approx" else \
            node.args[2:4] if name in POSITIONAL_TOLERANCES else []
        return [k.value for k in node.keywords if k.arg in keywords] + positional
    if isinstance(node, ast.Dict):
        return [v for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and k.value in TOLERANCE_KEYWORDS]
    return []


def literal_tolerances(source: str) -> list[int]:
    """Line numbers in `source` where a literal tolerance has no `# tolerance:` reason."""
    tree = ast.parse(source)
    lines = source.splitlines()
    bound = {t.id: stmt.value for stmt in tree.body if isinstance(stmt, ast.Assign)
             for t in stmt.targets if isinstance(t, ast.Name)}

    def reasoned(node: ast.AST, value: ast.expr) -> bool:
        """A reason on a line of the call or dict, or in the comment block right above it."""
        start = node.lineno - 1
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        return any(REASON.search(line) for line in lines[start:value.end_lineno])

    # A name whose binding states its reason is as good as a literal with its reason.
    bound = {name: value for name, value in bound.items() if not reasoned(value, value)}
    return sorted({value.lineno for node in ast.walk(tree) for value in _tolerance_values(node)
                   if _literal(value, bound) and not reasoned(node, value)})


FLAGGED = {
    "keyword": "np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)\n",
    "positional": "assert np.allclose(a, b, 1e-5)\n",
    "approx": "assert x == pytest.approx(y, abs=1e-3)\n",
    "approx positional": "assert x == pytest.approx(y, 1e-3)\n",
    "torch": "torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)\n",
    "scaled policy": "chex.assert_trees_all_close(a, b, atol=10 * TOL['atol'])\n",
    "dict": "TOL = {'rtol': 1e-4, 'atol': 1e-5}\nnp.testing.assert_allclose(a, b, **TOL)\n",
    "through a name": "RTOL = 1e-4\n\n\ndef f():\n    np.isclose(a, b, rtol=RTOL)\n",
    "comment elsewhere": "# tolerance: far away\n\nnp.allclose(a, b, atol=1e-3)\n",
    "another call's reason": "# tolerance: x\nnp.isclose(a, b, atol=1)\nnp.isclose(a, b, atol=1)\n",
    "empty reason": "np.allclose(a, b, atol=1e-3)  # tolerance:\n",
}
PASSING = {
    "policy": "np.testing.assert_allclose(a, b, **tolerance('float32'))\nassert_close(a, b)\n",
    "policy names": "chex.assert_trees_all_close(a, b, atol=TOL['atol'])\n",
    "reason on the line": "assert not np.allclose(a, b, atol=1e-3)  # tolerance: must differ\n",
    "reason above": "# tolerance: printed to 2 decimals\nnp.allclose(a, b,\n  atol=0.006)\n",
    "reason in a block above": "# tolerance: a reason\n# on two lines\nnp.isclose(a, b, atol=1)\n",
    "reason at the binding": "RTOL = 1e-4  # tolerance: 12 blocks\nnp.isclose(a, b, rtol=RTOL)\n",
    "zero": "np.testing.assert_allclose(a, b, rtol=0, atol=0)\n",
    "approx without tolerance": "assert x == pytest.approx(0.25)\n",
    "not a comparison": "f(a, b, 1e-5)\n",
}


@pytest.mark.parametrize("source", FLAGGED.values(), ids=FLAGGED.keys())
def test_the_lint_flags_a_literal_tolerance(source: str) -> None:
    assert literal_tolerances(source), source


@pytest.mark.parametrize("source", PASSING.values(), ids=PASSING.keys())
def test_the_lint_passes_the_policy_and_stated_reasons(source: str) -> None:
    assert literal_tolerances(source) == [], source


def test_no_test_compares_with_an_unexplained_literal_tolerance() -> None:
    found = [f"{path.relative_to(TESTS.parent)}:{line}" for path in sorted(TESTS.glob("*.py"))
             for line in literal_tolerances(path.read_text())]
    assert not found, ("literal tolerances without a '# tolerance: <reason>' comment; use "
                       "zoo.testing.assert_close (the policy, scaled by the largest value) or "
                       "state the reason:\n  " + "\n  ".join(found))
