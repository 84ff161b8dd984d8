"""The first-party packages import one way: canonical <- zoo <- converters, at module level.

The check reads the source with `ast` (nothing is imported): every `import` / `from ... import`
of a first-party module, at any depth of a module, is an edge between top-level packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("canonical", "zoo", "converters")
ALLOWED = {("zoo", "canonical"), ("converters", "canonical"), ("converters", "zoo")}


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) of every first-party import in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                 and not node.level else [])
        out += [(n, node.lineno, id(node) in top) for n in names
                if n.split(".")[0] in PACKAGES]
    return out


def package_edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for name, line, _ in imports(path):
                target = name.split(".")[0]
                if target != package:
                    edges.setdefault((package, target), []).append(
                        f"{path.relative_to(ROOT)}:{line}")
    return edges


def test_packages_import_one_way():
    edges = package_edges()
    wrong = {edge: where for edge, where in edges.items() if edge not in ALLOWED}
    assert not wrong, f"imports against canonical <- zoo <- converters: {wrong}"


def test_no_function_level_imports_between_packages():
    hidden = [f"{path.relative_to(ROOT)}:{line} imports {name}"
              for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
              for name, line, top in imports(path)
              if not top and name.split(".")[0] != package]
    assert not hidden, "\n".join(hidden)


def test_no_private_names_imported_across_modules():
    """A `_name` is its module's own: what other modules need is public (or a method)."""
    private = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.ImportFrom) and node.module and not node.level
                        and node.module.split(".")[0] in PACKAGES):
                    private += [f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name} from "
                                f"{node.module}" for a in node.names
                                if a.name.startswith("_") and not a.name.startswith("__")]
    assert not private, "\n".join(private)
