"""The code's layering (docs/layout.md): no circle of imports between files, `canonical` at the
bottom, `zoo`'s core below the converters, the benchmark on top, and the one seam where the
converters give the zoo its file readers (`zoo.weights.loading.register_reader`)."""

from __future__ import annotations

import ast
import importlib
import itertools
import re
import sys
from pathlib import Path

import networkx as nx
import pytest

from zoo import moved

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("canonical", "zoo", "converters")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> nx.DiGraph:
    """Modules of PACKAGES (a package is its `__init__`) -> the modules they import, anywhere
    in the file (imports inside functions too); `from pkg import name` names the submodule
    `pkg.name` where there is one."""
    files = {_module(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                           for a in node.names]
            graph.add_edges_from((name, t) for t in targets if t in files and t != name)
    return graph


def test_no_circle_of_imports():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles[:5])


def test_each_layer_imports_only_from_below():
    graph = import_graph()
    below = {
        "canonical": ("canonical",),
        # the zoo's core, its models and runtime: no converter, benchmark or docs module
        "zoo": ("canonical", "zoo"),
        "converters": ("canonical", "zoo", "converters"),
    }
    upper = ("zoo.bench", "zoo.docs", "zoo.predict")
    for source, target in graph.edges:
        if source.startswith(upper):
            continue
        top = source.split(".")[0]
        if top in below:
            assert target.split(".")[0] in below[top], f"{source} imports {target}"
            assert not target.startswith(upper), f"{source} imports {target}"



def _table(heading: str) -> list[list[str]]:
    """The cells of the first table's rows (its header and rule left out) after `heading` in
    docs/layout.md."""
    lines = (ROOT / "docs" / "layout.md").read_text().split(heading, 1)[1].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = itertools.takewhile(lambda line: line.startswith("|"), lines[first:])
    return [[c.strip() for c in row.strip("|").split("|")] for row in list(rows)[2:]]


def floors() -> dict[str, int]:
    """The docs' floors inside the packages: module prefix -> floor."""
    rows = _table("## Floors inside `zoo`")
    return {name: int(floor) for floor, names, _ in rows
            for name in re.findall(r"`([\w.]+)`", names)}


def floor_of(module: str, table: dict[str, int]) -> int:
    """The floor of the longest prefix of `module` in `table`."""
    prefix = max((p for p in table if module == p or module.startswith(p + ".")), key=len)
    return table[prefix]


def test_each_floor_imports_from_below_but_the_named_imports():
    """docs/layout.md's floors: every import runs down or within a floor, except the ones its
    table names, each of which still exists."""
    table = floors()
    assert len(set(table.values())) >= 8 and {"zoo", "canonical", "converters"} <= set(table)
    graph = import_graph()
    unplaced = sorted(m for m in graph if not any(m == p or m.startswith(p + ".")
                                                   for p in table))
    assert unplaced == [], f"modules on no floor of docs/layout.md: {unplaced}"
    up = {(s, t) for s, t in graph.edges if floor_of(t, table) > floor_of(s, table)}
    named = {(a.strip("`"), b.strip("`")) for a, b, _ in _table("that run back up")}
    assert up == named, (f"running back up, not named in docs/layout.md: {sorted(up - named)}; "
                         f"named but gone: {sorted(named - up)}")
    assert len(named) <= 5

def test_the_converters_meet_the_zoo_at_one_seam():
    """The zoo names the converters in one place only, the package it imports when a file is
    to be read (`zoo.weights.loading.READERS_PACKAGE`); the converters register their readers
    there."""
    import zoo.weights.loading

    named = [p.relative_to(ROOT).as_posix() for p in (ROOT / "zoo").rglob("*.py")
             if not p.relative_to(ROOT).as_posix().startswith(("zoo/bench/", "zoo/docs/"))
             and '"converters"' in p.read_text()]
    assert named == ["zoo/weights/loading.py"]
    assert zoo.weights.loading.READERS_PACKAGE == "converters"
    assert "register_reader" in (ROOT / "converters" / "__init__.py").read_text()


def family_files(arch: str) -> list[str]:
    """The files of `arch`'s family (docs/adding_an_architecture.md): its folder and its
    benchmark subject."""
    import zoo

    folder = Path(importlib.import_module(type(zoo.tiny_config(arch)).__module__).__file__).parent
    subject = ROOT / "zoo" / "bench" / "archs" / f"{arch}.py"
    files = [*sorted(folder.glob("*.py")), *([subject] if subject.is_file() else [])]
    return [f.relative_to(ROOT).as_posix() for f in files]


def test_a_family_is_at_most_seven_files():
    import zoo

    page = (ROOT / "docs" / "adding_an_architecture.md").read_text()
    assert "`zoo/bench/archs/<arch>.py`" in page and "at most seven files" in page
    sizes = {arch: family_files(arch) for arch in zoo.ARCHS  # the zoo's, not the tests' toy
             if type(zoo.tiny_config(arch)).__module__.startswith("zoo.models.")}
    assert len(sizes) >= 12 and all(files for files in sizes.values())
    assert {a: f for a, f in sizes.items() if len(f) > 7} == {}


@pytest.mark.parametrize("old", sorted(moved.MOVED))
def test_a_moved_module_path_imports_with_a_warning_naming_the_new_one(old):
    """The paths that moved to `zoo.runtime` and `zoo.weights` still import (their submodules
    too), warn once with the new path, and give the new module's objects."""
    new = moved.MOVED[old]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"^{re.escape(old)} moved to "
                                                rf"{re.escape(new)}; import it from there"):
        module = importlib.import_module(old)
    real = importlib.import_module(new)
    public = [n for n in vars(real) if not n.startswith("_")]
    assert public and all(getattr(module, n) is getattr(real, n) for n in public)
    assert moved.new_name(old + ".anything") == new + ".anything"
    assert moved.new_name("zoo.runtime.fast") is None and moved.new_name("zoo.fastest") is None
