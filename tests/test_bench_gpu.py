"""`python -m zoo.bench gpu`, checked on the CPU: its dry run end to end, the plan it runs on a
GPU (every command parses, the precisions it records, the seeds fit their shares), the test
part's pytest arguments and time cap, the budget (a fake clock: skipped, never overrun), the
worker's stop and restart, and the copy to $OUT."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import zoo
from zoo import precision as policy
from zoo.bench import gpu
from zoo.bench.matrix import Entry, Schedule, Slot, run_slots
from zoo.bench.options import bench_parser, config_from_args
from zoo.bench.styles import idiomatic_style
from zoo.layers.conv_transpose import METHODS

ROOT = Path(__file__).resolve().parents[1]


class Lines:
    """A console that keeps what is printed."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str = "", **_: object) -> None:
        self.lines.append(str(text))


@pytest.mark.full_only
def test_dry_run_runs_every_part_and_records_what_it_measured(tmp_path):
    """The dry run as a user starts it (a fresh interpreter, no precision setting inherited):
    every entry of the dry plan leaves a record with its command, part, device, versions and
    precision; the tests ran; the README, plots and log are written and copied to $OUT."""
    out, copy = tmp_path / "results", tmp_path / "OUT"
    env = {k: v for k, v in os.environ.items() if k != policy.ENV_VAR}
    env.update(OUT=str(copy), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "zoo.bench", "gpu", "--dry-run", "--out",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    device = out / "cpu"
    records = {p.name: json.loads(p.read_text()) for p in device.glob("*.json")}
    plan = [e.command for p in gpu.PARTS for e in p.entries(dry=True)]
    bench = [r for r in records.values() if r["kind"] in ("model", "dispatch")]
    assert sorted(r["command"] for r in bench) == sorted(plan)
    for r in bench:
        assert r["gpu_run"]["dry_run"] and r["gpu_run"]["part"] in {p.name for p in gpu.PARTS}
        assert r["device"]["name"] and r["versions"]["jax"] and r["versions"]["torch"]
        assert r["wall_s"] > 0 and "precision_settings" in r
        if r["kind"] != "model":
            continue
        prec = "highest" if "--precision highest" in r["command"] else "default"
        assert r["config"]["precision"] == prec
        assert r["precision_settings"]["jax_default_matmul_precision"] == (
            "highest" if prec == "highest" else None)
        if prec == "highest":
            assert set(r["precision_settings"]["torch"].values()) == {"ieee"}
        fmt = r["fairness"]["at_precision"]["format"]
        assert fmt == ("bfloat16" if "--dtype bfloat16" in r["command"] else "float32")
    tests = records["gpu-tests.json"]["summary"]
    assert tests["passed"] >= 4 and tests["failed"] == tests["errors"] == tests["cut"] == 0
    assert records["gpu-environment.json"]["missing"] == {}
    log = (device / "gpu-run.log").read_text()
    assert "left" in log and "missing: none" in log and "done in" in log
    assert max(len(line) for line in log.splitlines()) <= 80
    assert (device / "README.md").is_file() and list((device / "plots").glob("*.png"))
    copied = {p.relative_to(copy / "cpu") for p in (copy / "cpu").rglob("*") if p.is_file()}
    assert copied == {p.relative_to(device) for p in device.rglob("*") if p.is_file()}


def _parse(argv: tuple[str, ...]):
    return config_from_args(bench_parser().parse_args(list(argv)))


def test_the_gpu_plan_parses_and_covers_the_seeds_and_every_precision():
    """Every command of the full-size plan (and its fallback) is a valid benchmark command;
    the conv-transpose runs every method in every library and PyTorch, forward and training;
    the CNN compares NNX with Linen in their fastest and idiomatic styles; each preset runs in
    TF32, full float32 and bfloat16 on a GPU, with torch.compile preferred."""
    entries = {p.name: p.entries(dry=False) for p in gpu.PARTS}
    for part, es in entries.items():
        for e in es:
            if e.argv[0] == "dispatch":
                continue
            for argv in filter(None, (e.argv, e.fallback)):
                _parse(argv)
            assert e.group == part
    convt = [_parse(e.argv) for e in entries["convt"]]
    seed = [c for c in convt if c.preset == "convt-256"]
    assert {m for c in seed for m in c.modes} == {"forward", "train"}
    assert all(set(c.methods) == set(METHODS) and set(c.impls) == set(zoo.IMPLS) for c in seed)
    assert all("compile" in c.calls["torch"] for c in seed)
    cnn = _parse(entries["cnn"][0].argv)
    assert cnn.impls == ("linen", "nnx") and cnn.modes == ("forward", "train")
    assert all(set(cnn.calls[i]) == {"fast", idiomatic_style(i)} for i in cnn.impls)
    dispatch = entries["dispatch"][0].argv
    assert "--workload" not in dispatch  # every workload, static10k included
    formats: dict[str, set[str]] = {}
    for e in entries["presets"]:
        c = _parse(e.argv)
        assert c.modes == ("forward", "train") and set(c.impls) == set(zoo.IMPLS)
        assert "compile" in c.calls["torch"] and "--torch-compile" not in e.fallback
        formats.setdefault(c.preset, set()).add(
            policy.compute_format(c.dtype, c.precision, backend="gpu"))
    assert formats == {p: {"tf32", "float32", "bfloat16"} for _, p, _ in gpu.MODEL_PRESETS}


def test_the_seeds_fit_their_shares_of_the_budget():
    """By the estimates, each seed part's entries fit its share of the 8 minutes (in their
    cheapest form), so the guesses never skip a seed's question."""
    windows = gpu.part_windows(gpu.PARTS, 0.0, gpu.BUDGET_MIN * 60)
    for part in gpu.PARTS:
        if part.name not in ("convt", "cnn", "dispatch"):
            continue
        schedule = Schedule([], "full")
        need = sum(schedule.cheapest(e) for e in part.entries(dry=False))
        start, end = windows[part.name]
        assert need <= end - start, (part.name, need, end - start)


def test_the_test_part_runs_the_gpu_tests_capped_without_cpu_only():
    part = next(p for p in gpu.PARTS if p.kind == "tests")
    argv = gpu.pytest_command(part, False, 61.4, "/r/t.xml", 8)
    assert argv[:3] == [sys.executable, "-m", "pytest"]
    assert argv[argv.index("-m", 3) + 1] == "not cpu_only"
    assert argv[argv.index("--time-cap") + 1] == "61" and "--junitxml=/r/t.xml" in argv
    assert argv[argv.index("-n") + 1] == "8" and "--continue-on-collection-errors" in argv
    files = argv[argv.index("-n") + 2:]
    assert files == list(gpu.GPU_TESTS) and all((ROOT / f).is_file() for f in files)
    assert "tests/test_equivalence.py" in files and "tests/test_converters.py" in files
    dry = gpu.pytest_command(part, True, 10, "/r/t.xml", None)
    assert "-n" not in dry and dry[-len(gpu.DRY_TESTS):] == list(gpu.DRY_TESTS)
    assert "--time-cap" not in gpu.pytest_command(part, False, None, None, None)
    assert gpu.shown(dry).startswith("python -m pytest ") and "'not cpu_only'" in gpu.shown(dry)


def test_the_time_cap_skips_tests_not_started(monkeypatch):
    from tests import conftest

    monkeypatch.setitem(conftest._DEADLINE, "at", time.time() - 1)
    with pytest.raises(pytest.skip.Exception, match=gpu.TIME_CAP):
        conftest.pytest_runtest_setup(None)
    monkeypatch.setitem(conftest._DEADLINE, "at", time.time() + 60)
    conftest.pytest_runtest_setup(None)
    node = type("Node", (), {"workerinput": {}})()
    conftest.pytest_configure_node(node)
    assert node.workerinput["zoo_deadline"] == conftest._DEADLINE["at"]


def test_junit_summary_counts_the_cut_tests(tmp_path):
    path = tmp_path / "j.xml"
    path.write_text(
        '<testsuites><testsuite><testcase classname="t" name="a"/>'
        '<testcase classname="t" name="b"><failure message="assert 1 == 2&#10;more"/>'
        '</testcase><testcase classname="t" name="c"><skipped message="time cap reached"/>'
        '</testcase><testcase classname="t" name="d"><skipped message="no torch"/></testcase>'
        '<testcase classname="t" name="e"><error message="boom"/></testcase>'
        "</testsuite></testsuites>")
    s = gpu.junit_summary(str(path))
    assert {k: s[k] for k in ("tests", "passed", "failed", "errors", "skipped", "cut")} == {
        "tests": 5, "passed": 1, "failed": 1, "errors": 1, "skipped": 2, "cut": 1}
    assert s["failures"] == ["t::b: assert 1 == 2", "t::e: boom"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_skips_rather_than_overruns():
    """A fake clock and entries that take what they are estimated to take: an entry runs only
    if it ends by its part's deadline; a fallback (here: without torch.compile) runs when the
    full form would leave no time for the rest of the part; nothing ends after the deadline; a
    skipped entry is printed with its command."""
    clock = Clock()

    def entry(name: str, fallback: bool = False) -> Entry:
        argv = (name, "--torch-compile") if fallback else (name,)
        return Entry("part", argv, fallback=(name,) if fallback else None)

    took = {"python -m zoo.bench a --torch-compile": 50.0, "python -m zoo.bench a": 20.0,
            "python -m zoo.bench b": 30.0, "python -m zoo.bench c": 40.0,
            "python -m zoo.bench d": 5.0, "python -m zoo.bench e": 1.0}
    deadline = clock.now + 60
    slots = [Slot(entry("a", True), "p", deadline), Slot(entry("b"), "p", deadline),
             Slot(entry("c"), "p", deadline), Slot(entry("d"), "p", deadline),
             Slot(entry("e"), "q", deadline + 100)]
    ran: list[tuple[str, float, float]] = []

    def run_one(e: Entry) -> None:
        begin = clock.now
        clock.now += took[e.command]
        ran.append((e.command, begin, clock.now))

    console = Lines()
    out = run_slots(slots, run_one, console, size="full", clock=clock, end=deadline + 100,
                    measured=took)
    # a's full form (50 s) would leave no time for b and d: a runs without torch.compile.
    assert [c for c, _, _ in ran] == ["python -m zoo.bench a", "python -m zoo.bench b",
                                      "python -m zoo.bench d", "python -m zoo.bench e"]
    assert all(end <= deadline for c, _, end in ran if not c.endswith(" e"))
    assert [(e.command, why.split(",")[0]) for e, why in out.skipped] == [
        ("python -m zoo.bench a --torch-compile", "no time for --torch-compile"),
        ("python -m zoo.bench c", "estimated 40 s")]
    assert any("skipped" in line and "zoo.bench c" in line for line in console.lines)
    assert any("left" in line for line in console.lines)
    # With time to spare the full form runs.
    clock.now, ran[:] = 0.0, []
    run_slots([Slot(entry("a", True), "p", 1000.0)], run_one, Lines(), size="full",
              clock=clock, measured=took)
    assert ran[0][0] == "python -m zoo.bench a --torch-compile"


def test_an_entry_that_fails_is_a_problem_and_the_run_goes_on():
    def run_one(e: Entry) -> None:
        if e.argv[0] == "a":
            raise RuntimeError("out of memory\nmore")

    events: list[tuple] = []
    out = run_slots([Slot(Entry("g", ("a",)), "p", None), Slot(Entry("g", ("b",)), "p", None)],
                    run_one, Lines(), size="quick", keep_going=True,
                    on_event=lambda *a: events.append(a[:2]))
    assert out.problems == ["python -m zoo.bench a: RuntimeError: out of memory"]
    assert [e.command for e in out.ran] == ["python -m zoo.bench a", "python -m zoo.bench b"]
    assert events == [(0, "start"), (0, "end"), (1, "start"), (1, "end")]


def test_a_crashed_worker_restarts_after_its_entry_and_a_hung_one_is_stopped(tmp_path,
                                                                             monkeypatch):
    """The orchestrator restarts a crashed worker after the entry it crashed in, stops one
    that runs past the benchmarks' end, and prints the command of every entry not run."""
    calls: list[list[str]] = []
    slots = gpu.bench_slots(gpu.PARTS, True, time.time(), 480)

    def fake_child(argv, env, cwd, timeout_s, out):
        calls.append(argv)
        first = int(argv[argv.index("--first") + 1])
        progress = argv[argv.index("--progress") + 1]
        with open(progress, "a") as f:
            for i, event in ((first, "start"), (first, "end"), (first + 1, "start")):
                f.write(json.dumps({"slot": i, "event": event, "command": f"c{i}"}) + "\n")
        return (-11, False) if len(calls) == 1 else (None, True)

    monkeypatch.setattr(gpu, "run_child", fake_child)
    console = Lines()
    console.file = None
    run = gpu.Run(True, 480.0, str(tmp_path), gpu.PARTS, time.time(), console, ROOT, {},
                  str(tmp_path))
    bench = [p for p in gpu.PARTS if p.kind == "bench"]
    gpu._bench_parts(run, bench, frozenset(), time.time() + 300)
    assert [int(a[a.index("--first") + 1]) for a in calls] == [0, 2]
    assert run.problems == ["crashed (exit -11): c1",
                            "benchmarks stopped at their end while running c3"]
    not_run = [line for line in console.lines if line.startswith("[yellow]not run")]
    assert len(not_run) == len(slots) - 4 and slots[-1].entry.command in not_run[-1]


def test_a_child_past_its_time_is_stopped_with_its_group():
    lines: list[str] = []

    class Out:
        def write(self, text: str) -> None:
            lines.append(text)

    code = "import subprocess, sys, time; print('up', flush=True); time.sleep(60)"
    start = time.time()
    rc, stopped = gpu.run_child([sys.executable, "-c", code], dict(os.environ), ROOT, 1.0, Out())
    assert stopped and rc != 0 and time.time() - start < 30 and lines == ["up\n"]


def test_copy_to_out(tmp_path):
    device = tmp_path / "results" / "nvidia-h100"
    (device / "plots").mkdir(parents=True)
    (device / "a.json").write_text("{}")
    (device / "plots" / "p.png").write_bytes(b"png")
    assert gpu.copy_out(str(device), None) is None
    dest = gpu.copy_out(str(device), str(tmp_path / "OUT"))
    assert dest == str(tmp_path / "OUT" / "nvidia-h100")
    assert (tmp_path / "OUT" / "nvidia-h100" / "plots" / "p.png").read_bytes() == b"png"


def test_arguments_are_refused_in_one_line(capsys):
    from zoo.bench import cli

    for argv in (["gpu", "--only", "nope"], ["gpu", "--budget-min", "0"], ["gpu"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "--dry-run" in err  # no GPU here: the refusal says what to run instead
