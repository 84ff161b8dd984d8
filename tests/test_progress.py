"""Progress of long work when the output is not a terminal (zoo.progress): plain lines, not a
silent rich bar, for the benchmark and the converter CLI."""

from __future__ import annotations

import io

from rich.console import Console
from rich.progress import Progress

from zoo.progress import LineProgress, progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=80), out


def test_progress_is_rich_on_a_terminal_and_lines_elsewhere():
    terminal = Console(file=io.StringIO(), force_terminal=True)
    assert isinstance(progress(terminal), Progress)
    assert isinstance(progress(_console()[0]), LineProgress)


def test_lines_at_start_every_interval_and_at_the_end():
    console, out = _console()
    clock = Clock()
    bar = LineProgress(console, interval=10, clock=clock)
    task = bar.add_task("train: timing", total=100)
    for _ in range(50):  # 50 steps within 5 s: nothing new printed
        clock.now += 0.1
        bar.advance(task)
    clock.now = 12.0
    bar.advance(task, 10)  # 60/100 after 12 s: a line, with the ETA of the 40 left
    for _ in range(40):
        bar.advance(task)
    bar.advance(task)  # past the total: the end is printed once
    assert out.getvalue().splitlines() == [
        "train: timing: 0/100",
        "train: timing: 60/100 (60%), 0:00:12 elapsed, ETA 0:00:08",
        "train: timing: 100/100 (100%), 0:00:12 elapsed",
    ]


def test_bytes_are_shown_with_their_rate_and_an_open_task_with_its_count():
    console, out = _console()
    clock = Clock()
    bar = LineProgress(console, interval=1, in_bytes=True, clock=clock)
    task = bar.add_task("writing", total=None)
    clock.now = 2.0
    bar.update(task, completed=3 * 2**20, total=4 * 2**30)
    clock.now = 2.5
    bar.update(task, completed=4 * 2**20)  # within the interval: not printed
    assert out.getvalue().splitlines() == [
        "writing", "writing: 3.0 MiB/4.0 GiB (0%), 0:00:02 elapsed, 1.5 MiB/s, ETA 0:45:28"]


def test_the_benchmark_shows_its_phases_when_its_output_is_redirected(capsys):
    from zoo.bench.cli import main

    assert main(["mlp", "--preset", "tiny", "--impl", "nnx", "--mode", "forward",
                 "--repeat", "2", "--rounds", "1", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    for line in ("checking outputs and FLOP counts", "forward: compile + warm-up: 0/1",
                 "forward: timing 1 styles: 2/2 (100%)"):
        assert line in out


def test_the_converter_shows_bytes_when_its_output_is_redirected(tmp_path, capsys):
    import numpy as np
    from safetensors.numpy import save_file

    import canonical
    import zoo
    from converters.__main__ import main
    from zoo.registry import walk_facts

    cfg = zoo.tiny_config("mlp")
    model = zoo.create(cfg, "nnx")
    state = {k: np.asarray(v) for k, v in
             canonical.read(model, "nnx", **walk_facts(cfg, "nnx")).items()}
    src = tmp_path / "m.safetensors"
    save_file(state, str(src), metadata={"zoo_config": cfg.to_json()})
    assert main(["convert", str(src), str(tmp_path / "m.eqx"), "--to", "eqx", "--arch", "mlp",
                 "--config", cfg.to_json(), "--progress"]) == 0
    out = capsys.readouterr().out
    assert "writing: 0/1.5 KiB" in out
    assert "writing: 1.5 KiB/1.5 KiB (100%), 0:00:00 elapsed" in out
