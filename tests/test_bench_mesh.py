"""`python -m zoo.bench ARCH --mesh N --strategy S`: the sharded step timed per JAX library on 8
host devices (tests/bench_mesh_worker.py, a fresh interpreter that makes them itself), its
record (mesh, bytes per device from the shardings, collectives), the fairness check under the
mesh, and the refusals, each in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import pytest

import zoo
from zoo.bench import cli, mesh
from zoo.bench.records import record_name

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLS = [i for i in zoo.IMPLS if i in {i for _, i in zoo.list_implementations()}]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("mesh")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = ROOT
    done = subprocess.run([sys.executable, "-m", "tests.bench_mesh_worker", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_command_makes_its_host_devices(report):
    assert report["devices"] == 8
    assert f"{mesh.DEVICE_COUNT_FLAG}=8" in report["xla_flags"]


def test_fsdp_record_mesh_bytes_and_collectives(report):
    run = report["mlp-fsdp"]
    assert run["code"] == 0, run["stderr"]
    record = run["record"]
    assert record["mesh"]["shape"] == [8] and record["mesh"]["axes"] == ["data"]
    assert record["mesh"]["strategy"] == "fsdp" and record["mesh"]["devices"] == 8
    assert record["mesh"]["not_sharded"] == []
    assert record_name(record).endswith("-mesh8-fsdp.json")
    assert {r["impl"] for r in record["results"]} == {"eqx", "nnx"}
    for r in record["results"]:
        assert r["call"] == "fast" and r["time"]["n"] == 2 and r["time"]["median_s"] > 0
        held = r["mesh"]["bytes"]
        # fsdp splits the arrays: the fullest device holds well under the whole.
        assert 0 < held["total"]["max"] < held["total"]["unsharded"] / 2, held
        assert held["params"]["device0"] <= held["params"]["max"]
        coll = r["mesh"]["collectives"]
        assert coll["count"] > 0 and coll["bytes"] > 0
        assert coll["count"] == sum(op["count"] for op in coll["ops"].values())
        assert set(coll["ops"]) <= set(mesh.COLLECTIVES)
        timed = r["mesh"]["collective_time"]
        assert 0 < timed["share"] <= 1 and timed["collective_s"] <= timed["ops_s"]
        if r["mode"] == "train":
            assert "all-gather" in coll["ops"]  # parameters gathered for the step


def test_fairness_applies_under_the_mesh(report):
    """Same weights, every library on the mesh: first losses and outputs agree; FLOPs are
    compared on the program before partitioning (each device's share differs by layout)."""
    for name in ("mlp-fsdp", "cnn-fsdp"):
        fair = report[name]["record"]["fairness"]
        assert fair["passed"] and "compiled" not in fair["flops_sources"]
        mode = report[name]["record"]["config"]["modes"][-1]
        others = [e for n, e in fair[mode]["outputs"].items() if n != fair["reference"]]
        assert others and all(e["ok"] and e["rel_err"] <= e["tolerance"] for e in others)
        flops = [e["flops"] for e in fair[mode]["flops"].values()]
        assert max(flops) <= 1.01 * min(flops)


def test_fsdp_holds_fewer_bytes_per_device_than_dp(report):
    """From the arrays' shardings, not from timings: dp replicates (one device's bytes on
    each), fsdp splits."""
    record = report["mlp-dp"]["record"]
    # PyTorch is not sharded: left out, and the record says so.
    assert {r["impl"] for r in record["results"]} == {"nnx"}
    assert record["mesh"]["not_sharded"] == [i for i in IMPLS if i not in zoo.JAX_IMPLS]
    dp = next(r for r in record["results"] if r["impl"] == "nnx")
    fsdp = next(r for r in report["mlp-fsdp"]["record"]["results"]
                if r["impl"] == "nnx" and r["mode"] == "train")
    dp_b, fsdp_b = dp["mesh"]["bytes"]["total"], fsdp["mesh"]["bytes"]["total"]
    assert dp_b["max"] == dp_b["unsharded"] == fsdp_b["unsharded"]
    assert fsdp_b["max"] < dp_b["max"]
    assert dp["mesh"]["bytes"]["opt_state"]["max"] > fsdp["mesh"]["bytes"]["opt_state"]["max"]


def test_loops_are_counted_over_every_device(report):
    """The decoder's im2col convolutions run in `lax.scan` loops: on a mesh each device runs a
    share of their trips, and the FLOP check (before partitioning) counts every share."""
    run = report["loops-fsdp"]
    assert run["code"] == 0, run["stderr"]  # one device's share alone fell under the floor: 3
    record = run["record"]
    counted = {impl: c["flops"] for impl, c in record["fairness"]["train"]["flops"].items()}
    assert set(counted) == {"eqx", "nnx"}
    assert min(counted.values()) >= record["roofline"]["train"]["flops"], (counted, record[
        "roofline"]["train"])


def test_a_second_architecture(report):
    run = report["cnn-fsdp"]
    assert run["code"] == 0, run["stderr"]
    (r0, r1) = run["record"]["results"]
    assert {r0["impl"], r1["impl"]} == {"eqx", "linen"}
    for r in (r0, r1):
        assert r["mesh"]["collectives"]["count"] > 0
        assert r["mesh"]["bytes"]["total"]["max"] < r["mesh"]["bytes"]["total"]["unsharded"]
        assert r["mesh"]["bytes"]["state"]["unsharded"] > 0  # BatchNorm statistics


@pytest.mark.parametrize("name,needle", [
    ("tp-no-dims", "--strategy tp: no array of decoder3d has a heads or mlp or vocab axis"),
    ("tp-one-axis", "strategy 'tp' needs mesh axes ('data', 'model')"),
    ("mesh-3", "--mesh: the batch (8) does not split over the 3 devices"),
])
def test_refusals_are_one_line(report, name, needle):
    run = report[name]
    assert run["code"] == 2 and run["record"] is None
    errors = [ln for ln in run["stderr"].splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], run["stderr"]
    assert "Traceback" not in run["stderr"]


def test_too_few_devices_once_jax_has_started(capsys, tmp_path):
    """In this process JAX runs on one device: the command says how to run it, in one line."""
    jax.devices()
    path = tmp_path / "r.json"
    with pytest.raises(SystemExit) as e:
        cli.main(["mlp", "--preset", "tiny", "--mesh", "8", "--json", str(path),
                  "--no-progress"])
    assert e.value.code == 2 and not path.exists()
    err = capsys.readouterr().err
    assert f"--mesh 8 needs 8 devices, the cpu backend has {jax.device_count()}" in err
    assert f"XLA_FLAGS={mesh.DEVICE_COUNT_FLAG}=8" in err and "Traceback" not in err


@pytest.mark.parametrize("argv,needle", [
    (["--mesh", "8x"], "--mesh: expected N or DATAxMODEL"),
    (["--mesh", "8", "--impl", "torch"], "PyTorch is not sharded"),
    (["--mesh", "8", "--call", "all"], "--call all is not sharded"),
    (["--mesh", "8", "--strategy", "zero3"], "invalid choice: 'zero3'"),
    (["--strategy", "dp"], "--strategy dp needs --mesh"),
])
def test_bad_mesh_arguments_exit_2(argv, needle, capsys):
    if "torch" in argv and "torch" not in zoo.IMPLS:
        pytest.skip("needs torch")
    with pytest.raises(SystemExit) as e:
        cli.main(["mlp", "--preset", "tiny", *argv])
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_hlo_collectives_count_ops_and_bytes():
    hlo = """
ENTRY %main {
  %p = f32[4,8]{1,0} parameter(0)
  %all-gather.1 = f32[32,8]{1,0} all-gather(%p), channel_id=1, dimensions={0}
  %ars = (f32[16]{0}, bf16[8]{0}) all-reduce-start(%x), to_apply=%add
  %ard = (f32[16]{0}, bf16[8]{0}) all-reduce-done(%ars)
  ROOT %cp = s32[2]{0} collective-permute(%y), source_target_pairs={{0,1}}
}"""
    found = mesh.hlo_collectives(hlo)
    assert found["ops"] == {"all-gather": {"count": 1, "bytes": 32 * 8 * 4},
                            "all-reduce": {"count": 1, "bytes": 16 * 4},
                            "collective-permute": {"count": 1, "bytes": 8}}
    assert found["count"] == 3
    assert mesh.instructions(hlo)["ars"] == "all-reduce-start"
    assert mesh.parse_mesh("4x2") == (4, 2) and mesh.parse_mesh("8") == (8,)
