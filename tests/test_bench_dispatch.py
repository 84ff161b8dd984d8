"""`python -m zoo.bench dispatch`: every workload with every `--impl` choice runs and records,
each row in its role; records written before roles still render."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import zoo
from zoo.bench import cli
from zoo.bench.dispatch import TRAIN_WORKLOADS, WORKLOADS
from zoo.bench.options import parse_impls
from zoo.bench.records import dispatch_results
from zoo.bench.tables import dispatch_table

QUICK_IMPL = "eqx"  # --quick runs every workload with this library alone
COMMITTED = Path(__file__).resolve().parents[1] / "bench" / "results" / "cpu" / "dispatch.json"


@pytest.mark.parametrize("impl", [pytest.param(i, marks=() if i == QUICK_IMPL else (
    pytest.mark.full_only,)) for i in zoo.IMPLS])
def test_every_workload_runs_and_records(impl, tmp_path, capsys):
    """One round of every workload with each library alone (`--impl all`, one workload: the
    docs' command, tests/test_docs.py), the MLP at its tiny config: one floor row per workload, a
    bound row for training only, an own row per JAX library; only library rows name an impl."""
    path = tmp_path / "dispatch.json"
    assert cli.main(["dispatch", "--impl", impl, "--tiny", "--rounds", "1", "--budget", "0.0002",
                     "--json", str(path), "--no-progress"]) == 0
    record = json.loads(path.read_text())
    impls = set(parse_impls(impl))
    jax_impls = impls & set(zoo.JAX_IMPLS)
    assert list(record["config"]["workloads"]) == list(WORKLOADS)
    for w in WORKLOADS:
        rows = [r for r in record["results"] if r["workload"] == w]
        roles = [r["role"] for r in rows]
        assert roles.count("floor") == 1
        assert roles.count("bound") == (w in TRAIN_WORKLOADS)
        assert {r["impl"] for r in rows if r["role"] == "own"} == jax_impls
        assert {r["impl"] for r in rows if r["role"] == "style"} == impls
        assert all(("impl" in r) == (r["role"] in ("own", "style")) for r in rows)
        assert all((r["ratio_to_own"] is None) == (r.get("impl") not in jax_impls) for r in rows)
    assert set(record["summary"]) == jax_impls
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 80, out


def test_records_before_roles_still_render():
    """The committed record (pseudo-impls "floor" and "bound") reads as rows with roles: no impl
    for the floor and the bound, no ratio to an own program where the library has none."""
    record = json.loads(COMMITTED.read_text())
    rows = dispatch_results(record)
    assert {r["role"] for r in rows} == {"floor", "bound", "own", "style"}
    assert all("impl" not in r for r in rows if r["role"] in ("floor", "bound"))
    torch = [r for r in rows if r.get("impl") == "torch"]
    assert torch and all(r["ratio_to_own"] is None for r in torch)
    table = dispatch_table(record)
    cells = {(row[0], row[1]) for row in table.rows}
    assert ("floor", "raw jax.jit, pre-flattened") in cells
    assert ("bound", "optimizer alone, fused K=100") in cells
