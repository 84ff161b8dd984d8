"""The GPU-ready benchmark on CPU: the matrix command, --precision, the allocator setting, and
one-way imports inside zoo.bench."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import networkx as nx

import zoo
from zoo.bench import cli
from zoo.bench.matrix import plan

ROOT = Path(__file__).resolve().parents[1]


def test_matrix_quick_covers_every_architecture_and_renders(tmp_path):
    """`matrix --quick`: every registered architecture (no list to edit), float32 and bfloat16,
    the conv-transpose methods, Decoder3D train and the dispatch suite are planned; run for
    the subjects of some (`--subjects`: a language model, Decoder3D and convt, so that each
    kind of entry runs), the records carry the precision and the allocator setting and the
    report renders them."""
    models = [e.argv for e in plan(quick=True, repeat=2) if e.group == "models"]
    for arch in zoo.ARCHS:
        for dtype in ("float32", "bfloat16"):
            assert any(a[0] == arch and dtype in a for a in models), (arch, dtype)
    out = tmp_path / "results"
    ran = ("gpt2", "decoder3d", "convt")
    assert cli.main(["matrix", "--out", str(out), "--quick", "--subjects", ",".join(ran)]) == 0
    records = {p.name: json.loads(p.read_text()) for p in out.glob("*/*.json")}
    names = {(r["config"]["arch"], r["config"]["dtype"], tuple(r["config"]["modes"]))
             for r in records.values() if r["kind"] == "model"}
    assert {r["config"]["arch"] for r in records.values() if r["kind"] == "model"} <= set(ran)
    for arch in ("gpt2", "decoder3d"):
        assert {(arch, "float32", ("forward", "train")), (arch, "bfloat16", ("forward",))} <= names
    assert "convt-tiny-float32-forward-methods.json" in records
    assert ("decoder3d", "float32", ("train",)) in names and "dispatch.json" in records
    for name, record in records.items():
        assert record["command"].startswith("python -m zoo.bench "), name
        assert record["allocator"]["env"]["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        assert record["precision_settings"]["jax_default_matmul_precision"] in (None, "highest")
        if record["kind"] == "model":
            assert record["config"]["precision"] == "default"
            assert record["fairness"]["at_precision"]["format"] in ("float32", "bfloat16")
            assert all(r["flops_source"] for r in record["results"])
    readme = tmp_path / "README.md"
    assert cli.main(["report", "--results", str(out), "--readme", str(readme),
                     "--plots", str(tmp_path / "plots")]) == 0
    assert "precision default (float32)" in readme.read_text()


def test_full_matrix_plan():
    """The GPU matrix: published shapes with every method and torch.compile, every call style
    of every architecture in both dtypes, within a printed estimate under the 9-minute call."""
    entries = plan(quick=False, repeat=20)
    commands = [e.command for e in entries]
    assert any("--preset convt-256 --mode forward --method all" in c for c in commands)
    assert any("--preset convt-wgrad --mode train --dtype bfloat16 --method all" in c
               for c in commands)
    assert any("--preset decoder3d-train --mode train --method all" in c for c in commands)
    models = [e for e in entries if e.group == "models"]
    assert len(models) == 2 * len(zoo.ARCHS)
    assert all("--call all" in e.command and "--torch-compile" in e.command for e in models)
    assert all(e.estimate_s("full") > 0 for e in entries)


def test_allocator_is_set_before_jax_starts():
    """Importing the benchmark (every module of `zoo.bench`, their imports at the top) starts
    no JAX backend, so the allocator setting made by the commands (PyTorch in the process: no
    preallocation) and their XLA flags reach JAX; once the backend has started, the record
    says it came too late. Run in a fresh interpreter."""
    code = """
import importlib, json, os, pkgutil
os.environ.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
os.environ.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
import zoo.bench
for m in pkgutil.walk_packages(zoo.bench.__path__, "zoo.bench."):
    if m.name != "zoo.bench.__main__":
        importlib.import_module(m.name)
from zoo.bench import accel
before = accel.jax_backend_started()
first = accel.configure_allocator(torch_in_process=True)
import jax
jax.devices()
late = accel.configure_allocator(torch_in_process=True)
print(json.dumps([before, first, late, os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"]]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    before, first, late, env = json.loads(done.stdout.strip().splitlines()[-1])
    assert before is False and env == "false"
    assert first == {"env": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, "set_by": "zoo.bench",
                     "reason": "PyTorch runs in the same process", "applied": True}
    assert late["applied"] is False and late["set_by"] == "user"  # now already in os.environ


def test_precision_option_is_checked_recorded_and_captioned(tmp_path):
    path = tmp_path / "r.json"
    assert cli.main(["mlp", "--preset", "tiny", "--impl", "eqx", "--mode", "forward",
                     "--precision", "highest", "--repeat", "1", "--warmup", "0",
                     "--json", str(path), "--no-progress"]) == 0
    record = json.loads(path.read_text())
    assert record["config"]["precision"] == "highest"
    assert record["precision_settings"]["jax_default_matmul_precision"] == "highest"
    assert record["fairness"]["precision"] == "highest"
    from zoo.bench.tables import model_table

    assert "precision highest" in model_table(record, "forward").title


def _bench_import_graph() -> nx.DiGraph:
    """zoo.bench modules and the zoo.bench modules they import (function-level included)."""
    graph = nx.DiGraph()
    for path in (ROOT / "zoo" / "bench").glob("*.py"):
        name = f"zoo.bench.{path.stem}"
        graph.add_node(name)
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module == "zoo.bench":
                targets = [f"zoo.bench.{a.name}" for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("zoo.bench."):
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("zoo.bench.")]
            graph.add_edges_from((name, t) for t in targets if t != name)
    return graph


def test_no_import_cycle_inside_the_benchmark():
    graph = _bench_import_graph()
    graph.remove_node("zoo.bench.__init__")  # the package facade re-exports
    assert list(nx.simple_cycles(graph)) == []
    # The library does not reach back into the command-line modules.
    for lib in ("runner", "fairness", "dispatch", "report", "tables", "records", "flops"):
        reach = nx.descendants(graph, f"zoo.bench.{lib}")
        assert "zoo.bench.cli" not in reach and "zoo.bench.matrix" not in reach, lib
