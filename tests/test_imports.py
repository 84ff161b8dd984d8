"""The first-party packages import one way: canonical <- zoo <- converters, at module level.

The check reads the source with `ast` (nothing is imported): every `import` / `from ... import`
of a first-party module, at any depth of a module, is an edge between top-level packages.
A conversion imports only the frameworks its formats need (checked in a fresh process).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_models_and_libraries_know_nothing_of_the_benchmark():
    """The benchmark reads the models (its subjects live in zoo.bench.archs); no model,
    layer or library module imports zoo.bench."""
    up = [f"{path.relative_to(ROOT)}:{line} imports {name}"
          for folder in ("models", "layers", "libraries")
          for path in sorted((ROOT / "zoo" / folder).rglob("*.py"))
          for name, line, _ in imports(path) if name.startswith("zoo.bench")]
    assert not up, "\n".join(up)


def test_interface_sits_below_the_libraries():
    """zoo.interface holds the classes the libraries are made of and imports none of them
    (`interface(impl)` / `native_interface(impl)` look a library up: zoo.libraries's)."""
    up = [f"zoo/interface.py:{line} imports {name}"
          for name, line, _ in imports(ROOT / "zoo" / "interface.py")
          if name == "zoo" or name.startswith(("zoo.libraries", "zoo.registry"))]
    assert not up, "\n".join(up)
    done = subprocess.run([sys.executable, "-c", "import zoo.libraries, zoo.interface"],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


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


CONVERSIONS = """
import json, sys
import numpy as np
from safetensors.numpy import save_file
from converters.__main__ import main
from converters.core import canonical_spec
from zoo.names import make_config

config = make_config("vit", width=32, depth=1, num_heads=2, patch_size=8,
                     image_size=[16, 16], num_classes=3)
save_file({k: np.zeros(s.shape, np.float32) for k, s in canonical_spec(config).items()},
          "src.safetensors")
seen = {}
for dst in ("out.safetensors", "out.pt"):
    code = main(["convert", "src.safetensors", dst, "--to", "torch", "--config",
                 config.to_json(), "--no-progress"])
    seen[dst] = [code, sorted(m for m in sys.modules if "." not in m)]
print(json.dumps(seen))
"""


@pytest.mark.full_only  # fresh interpreters or files: the quick subset's budget
def test_conversion_imports_only_what_its_formats_need(tmp_path):
    """Safetensors to safetensors imports neither Flax, orbax, optax nor PyTorch; to `.pt`
    only PyTorch besides. JAX and Equinox remain: the canonical keys and shapes the
    checkpoint is validated against are read from the Equinox skeleton."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CONVERSIONS], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    seen = json.loads(done.stdout.splitlines()[-1])
    never = {"flax", "orbax", "optax", "IPython", "tensorstore"}
    to_st, to_pt = seen["out.safetensors"], seen["out.pt"]
    assert to_st[0] == to_pt[0] == 0
    assert {"jax", "equinox"} <= set(to_st[1])
    assert not (never | {"torch"}) & set(to_st[1]), to_st[1]
    assert "torch" in to_pt[1] and not never & set(to_pt[1]), to_pt[1]
