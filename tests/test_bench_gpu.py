"""`python -m zoo.bench gpu`, checked on the CPU: its dry run end to end, the plan it runs on a
GPU (every command parses, the precisions it records, the seeds fit their shares), the test
part's pytest arguments and time cap, the budget (a fake clock: skipped, never overrun), the
worker's stop and restart, and the copy to $OUT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import zoo
from zoo.bench import gpu
from zoo.bench.matrix import Entry, Slot, run_slots
from zoo.bench.options import bench_parser, config_from_args
from zoo.bench.styles import idiomatic_style
from zoo.layers.conv_transpose import METHODS
from zoo.runtime import precision as policy

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
    the plan is printed and written before anything starts; every planned entry leaves a
    record with its command, part, device, versions and the precision its command names; the
    tests (the H100 log's replays among them) ran and were counted as they finished; the
    README, plots and log are written and copied to $OUT."""
    out, copy = tmp_path / "results", tmp_path / "OUT"
    env = {k: v for k, v in os.environ.items() if k != policy.ENV_VAR}
    env.update(OUT=str(copy), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "zoo.bench", "gpu", "--dry-run", "--out",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    device = out / "cpu"
    records = {p.name: json.loads(p.read_text()) for p in device.glob("*.json")}
    plan = json.loads((device / "gpu-plan.json").read_text())
    planned = [s["entry"] for s in plan["slots"]]
    assert len(planned) == sum(len(p.runs) for p in gpu.PARTS)
    bench = [r for r in records.values() if r.get("kind") in ("model", "dispatch", "generation")]
    assert sorted(r["command"] for r in bench) == sorted(
        "python -m zoo.bench " + " ".join(e["argv"]) for e in planned)
    for r in bench:
        assert r["gpu_run"]["dry_run"] and r["gpu_run"]["part"] in {p.name for p in gpu.PARTS}
        assert r["device"]["name"] and r["versions"]["jax"] and r["versions"]["torch"]
        assert r["wall_s"] > 0 and "precision_settings" in r
        named = r["command"].split("--precision ")[1].split()[0]
        assert (r["config"]["precision"] if r["kind"] == "model" else r["precision"]) == named
        assert r["precision_settings"]["jax_default_matmul_precision"] == (
            None if named == "default" else named)
        if r["kind"] == "model":
            fmt = r["fairness"]["at_precision"]["format"]
            assert fmt == ("bfloat16" if "--dtype bfloat16" in r["command"] else "float32")
            assert r["fairness"]["check"] == ("timed" if "--check timed" in r["command"]
                                              else "strict")
    assert {r["kind"] for r in bench} == {"model", "dispatch", "generation"}
    tests = records["gpu-tests.json"]["summary"]
    assert tests["passed"] >= 10 and tests["failed"] == tests["errors"] == tests["cut"] == 0
    assert any("test_bench_gpu_log" in line for line in (device / "gpu-tests.jsonl").read_text(
        ).splitlines())
    assert records["gpu-environment.json"]["missing"] == {}
    log = (device / "gpu-run.log").read_text()
    assert "left" in log and "missing: none" in log and "done in" in log
    assert log.index("est.") < log.index("the working tree")  # the plan before the parts
    assert max(len(line) for line in log.splitlines()) <= 80
    assert (device / "README.md").is_file() and list((device / "plots").glob("*.png"))
    copied = {p.relative_to(copy / "cpu") for p in (copy / "cpu").rglob("*") if p.is_file()}
    assert copied == {p.relative_to(device) for p in device.rglob("*") if p.is_file()}


def _parse(argv: tuple[str, ...]):
    return config_from_args(bench_parser().parse_args(list(argv)))


def test_the_gpu_plan_parses_names_its_precision_and_covers_the_questions():
    """Every form of every entry of the full-size plan (full, fallback, cuts) is a valid
    command that names its --precision; the conv-transpose runs every method in every library
    and PyTorch, forward and training, at the seed's shape; the CNN compares NNX with Linen in
    their fastest and idiomatic styles; each model preset runs in TF32 and bfloat16 on a GPU;
    GPT-2 decodes (prefill timed too) at batch 1 and 8 in float32 and bfloat16."""
    entries = {p.name: p.entries(dry=False) for p in gpu.PARTS}
    for part, es in entries.items():
        for e in es:
            assert e.group == part
            for form in e.forms():
                assert form.argv[form.argv.index("--precision") + 1] == "default"
                if form.argv[0] != "dispatch":
                    _parse(form.argv)
    convt = [_parse(e.argv) for e in entries["convt"]]
    assert {m for c in convt for m in c.modes} == {"forward", "train"}
    assert all(c.preset == "convt-256" and c.batch == 4 for c in convt)
    assert all(set(c.methods) == set(METHODS) and set(c.impls) == set(zoo.IMPLS) for c in convt)
    assert all("compile" in c.calls["torch"] and c.check == "timed" for c in convt)
    cnn = _parse(entries["cnn"][0].argv)
    assert cnn.impls == ("linen", "nnx") and cnn.modes == ("forward", "train")
    assert all(set(cnn.calls[i]) == {"fast", idiomatic_style(i)} for i in cnn.impls)
    assert "--workload" not in entries["dispatch"][0].argv  # every workload, static10k
    formats: dict[str, set[str]] = {}
    for e in entries["presets"]:
        c = _parse(e.argv)
        assert c.modes == ("forward", "train") and set(c.impls) == set(zoo.IMPLS)
        assert "compile" in c.calls["torch"] and "--torch-compile" not in e.fallback
        assert e.cuts and all(_parse(cut.argv).arch == c.arch for cut in e.cuts)
        formats.setdefault(c.preset, set()).add(
            policy.compute_format(c.dtype, c.precision, backend="gpu"))
    assert formats == {p: {"tf32", "bfloat16"} for _, p, _, _ in gpu.MODEL_PRESETS}
    lm = [bench_parser().parse_args(list(e.argv)) for e in entries["lm"]]
    assert {(a.mode, a.batch, a.dtype, a.precision) for a in lm} == {
        ("decode", b, d, "default") for b in (1, 8) for d in ("float32", "bfloat16")}


def test_the_plan_fits_nine_minutes_with_the_seeds_at_full_shape():
    """By the H100 log's estimates, the plan fits the 9-minute budget with every required
    entry in some form (only the `extra` part may not fit), the conv-transpose at the seed's
    full shape, and prints each part's estimate and each entry's form within 80 columns."""
    planned = gpu.plan(gpu.PARTS, False, gpu.BUDGET_MIN * 60)
    fixed = sum(p.seconds for p in gpu.PARTS if p.kind != "bench")
    assert fixed + sum(q.estimate_s for q in planned if q.form) <= gpu.BUDGET_MIN * 60
    assert all(q.form is not None for q in planned if q.entry.group != "extra")
    for q in planned:
        if q.entry.group == "convt":
            assert _parse(q.form.argv).preset == "convt-256" and "--batch" not in q.form.argv
    console = Lines()
    windows = gpu.part_windows(gpu.PARTS, 0.0, gpu.BUDGET_MIN * 60, planned)
    assert max(end for _, end in windows.values()) == pytest.approx(gpu.BUDGET_MIN * 60)
    gpu.print_plan(gpu.PARTS, planned, windows, 0.0, console)
    assert all(len(line) <= 80 for line in console.lines)
    assert [line.split()[0] for line in console.lines if "est." in line] == [
        p.name for p in gpu.PARTS]
    # Measured times (a rerun's records) replace the estimates: a 10 s conv-transpose leaves
    # room for the presets' full forms.
    measured = {e.command: 10.0 for e in gpu.PARTS[2].entries(False)}
    again = gpu.plan(gpu.PARTS, False, gpu.BUDGET_MIN * 60, measured)
    assert sum(q.estimate_s for q in again if q.entry.group == "convt") == 20.0


def test_the_test_part_runs_one_process_logging_each_outcome():
    part = next(p for p in gpu.PARTS if p.kind == "tests")
    argv = gpu.pytest_command(part, False, 61.4, "/r/t.jsonl", "/r/t.xml")
    assert argv[:3] == [sys.executable, "-m", "pytest"]
    assert argv[argv.index("-m", 3) + 1] == "not cpu_only" and "-n" not in argv
    assert "no:xdist" in argv and "zoo.bench.testlog" in argv and "--quick" in argv
    assert argv[argv.index("--stop-after") + 1] == "61" and "--test-log=/r/t.jsonl" in argv
    files = [a for a in argv if a.startswith("tests/")]
    assert files == list(gpu.GPU_TESTS) and all((ROOT / f).is_file() for f in files)
    dry = gpu.pytest_command(part, True, None, "/r/t.jsonl")
    assert dry[-len(gpu.DRY_TESTS):] == list(gpu.DRY_TESTS) and "--quick" not in dry
    assert all((ROOT / f).is_file() for f in gpu.DRY_TESTS)
    assert "--stop-after" not in dry
    assert gpu.shown(dry).startswith("python -m pytest ") and "'not cpu_only'" in gpu.shown(dry)


def test_the_time_cap_skips_tests_not_started(monkeypatch):
    from tests import conftest

    monkeypatch.setitem(conftest._DEADLINE, "at", time.time() - 1)
    with pytest.raises(pytest.skip.Exception, match=conftest.TIME_CAP):
        conftest.pytest_runtest_setup(None)
    monkeypatch.setitem(conftest._DEADLINE, "at", time.time() + 60)
    conftest.pytest_runtest_setup(None)
    node = type("Node", (), {"workerinput": {}})()
    conftest.pytest_configure_node(node)
    assert node.workerinput["zoo_deadline"] == conftest._DEADLINE["at"]


# Test c outlasts the cap (`--stop-after 1`: it started before, it ends after), or is killed
# while it runs: the process group gets SIGKILL as `run_child` sends it at its limit (that
# limit, on a sleeping child: `test_a_child_past_its_time_is_stopped_with_its_group`).
TESTS = """
import os, signal, time
def test_a(): pass
def test_b(): assert 1 == 2, "one is not two"
def test_c(): {c}
def test_d(): pass
def test_e(): pass
"""


@pytest.mark.full_only
@pytest.mark.parametrize("how", ["cap", "kill"])
def test_the_test_log_keeps_what_finished(tmp_path, how):
    """Each outcome is written as its test ends: a cap stops the session after the running
    test (the rest counted as not run), a kill mid-test loses only that test."""
    from zoo.bench import testlog

    (tmp_path / "test_t.py").write_text(TESTS.format(
        c="time.sleep(2)" if how == "cap" else "os.killpg(os.getpgrp(), signal.SIGKILL)"))
    log = tmp_path / "t.jsonl"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "-p", "zoo.bench.testlog", f"--test-log={log}", str(tmp_path / "test_t.py")]
    if how == "cap":
        argv += ["--stop-after", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    lines: list[str] = []
    out = type("Out", (), {"write": lambda self, t: lines.append(t)})()
    rc, stopped = gpu.run_child(argv, env, tmp_path, 120.0, out)
    s = testlog.summary(str(log))
    assert s["failures"][0].endswith("one is not two")
    if how == "cap":  # c started before the cap and finished; d and e never started
        assert not stopped and rc == 2 and "time cap reached" in "".join(lines)
        assert (s["collected"], s["passed"], s["failed"], s["skipped"], s["cut"]) == (
            5, 2, 1, 0, 2)
    else:  # killed in c: a and b reported
        assert not stopped and rc == -signal.SIGKILL
        assert (s["collected"], s["passed"], s["failed"], s["cut"]) == (5, 1, 1, 3)


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


def test_a_late_entry_is_cut_to_a_smaller_shape_and_says_so():
    """An entry whose full form would overrun runs its first cut that fits, printed with what
    changed; one whose every form overruns is skipped with its estimate, never silently."""
    clock = Clock()
    took = {"python -m zoo.bench m --preset big": 50.0,
            "python -m zoo.bench m --preset mid": 25.0,
            "python -m zoo.bench m --preset small": 10.0}
    entry = Entry("p", ("m", "--preset", "big"),
                  cuts=(Entry("p", ("m", "--preset", "mid")),
                        Entry("p", ("m", "--preset", "small"))))
    ran: list[str] = []

    def run_one(e: Entry) -> None:
        ran.append(e.command)
        clock.now += took[e.command]

    console = Lines()
    end = clock.now + 40
    out = run_slots([Slot(entry, "p", end), Slot(entry, "p", end),
                     Slot(entry, "q", clock.now + 5)],
                    run_one, console, size="full", clock=clock, measured=took)
    # the first leaves room for the second's smallest form (10 s): mid (25 s), then small
    assert ran == ["python -m zoo.bench m --preset mid", "python -m zoo.bench m --preset small"]
    why = [why for _, why in out.skipped]
    assert why == ["cut to --preset mid (the full form: estimated 50 s)",
                   "cut to --preset small (the full form: estimated 50 s)",
                   "estimated 10 s, 0 s left in part q"]
    assert any("cut to --preset mid" in line for line in console.lines)
    assert any(line.startswith("[yellow]skipped (estimated 10 s") for line in console.lines)


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
    planned = gpu.plan(gpu.PARTS, True, 480)
    windows = gpu.part_windows(gpu.PARTS, time.time(), 480, planned)
    slots = gpu.bench_slots(gpu.PARTS, planned, windows)

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
                  str(tmp_path), windows, slots)
    bench = [p for p in gpu.PARTS if p.kind == "bench"]
    gpu._bench_parts(run, bench, time.time() + 300)
    assert [int(a[a.index("--first") + 1]) for a in calls] == [0, 2]
    assert run.problems == ["crashed (exit -11): c1",
                            "benchmarks stopped at their end while running c3"]
    not_run = [line for line in console.lines if line.startswith("[yellow]not run")]
    assert len(not_run) == len(slots) - 4 and slots[-1].entry.command in not_run[-1]


def test_the_plan_travels_to_the_worker(tmp_path):
    """The worker (and a restarted one) runs the slots the orchestrator planned."""
    planned = gpu.plan(gpu.PARTS, False, 540)
    windows = gpu.part_windows(gpu.PARTS, 100.0, 540, planned)
    slots = gpu.bench_slots(gpu.PARTS, planned, windows)
    path = tmp_path / "plan.json"
    gpu.write_plan(str(path), slots, {"c": 1.0}, planned)
    back, measured = gpu.read_plan(str(path))
    assert back == slots and measured == {"c": 1.0}


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
