"""Argument errors on every command line are one ``error:`` line (exit 2); the usage is printed
by ``--help`` only."""

from __future__ import annotations

import pytest

from converters.__main__ import main
from zoo.bench import cli as bench_cli


def one_line(err: str) -> None:
    assert err.startswith("error: ") and err.count("\n") == 1 and "usage:" not in err, err
    assert "--help" in err


@pytest.mark.parametrize("argv", [["--to", "flax"], ["--to", "eqx", "--cast", "float8"], []],
                         ids=["unknown-format", "unknown-dtype", "missing-to"])
def test_converter_argument_errors_are_one_line(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["convert", str(tmp_path / "m.eqx"), str(tmp_path / "o.eqx"), *argv])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == ""
    one_line(err)
    assert ("--to" if "--cast" not in argv else "--cast") in err


def test_benchmark_argument_errors_are_one_line(capsys):
    for argv in (["mlp", "--mode", "fastest"], ["mlp", "--impl", "jax"]):  # argparse, then ours
        with pytest.raises(SystemExit) as e:
            bench_cli.main(argv)
        assert e.value.code == 2
        one_line(capsys.readouterr().err)


@pytest.mark.parametrize(("entry", "args"), [
    (main, []), (main, ["convert"]), (main, ["inspect"]),
    (bench_cli.main, []), (bench_cli.main, ["dispatch"]), (bench_cli.main, ["report"]),
    (bench_cli.main, ["matrix"]), (bench_cli.main, ["breakdown"]),
    (bench_cli.main, ["convert"]), (bench_cli.main, ["gpu"])],
    ids=["converters", "converters convert", "converters inspect", "bench", "bench dispatch",
         "bench report", "bench matrix", "bench breakdown", "bench convert", "bench gpu"])
def test_every_help_fits_80_columns(entry, args, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as e:
        entry([*args, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "usage:" in out
    assert max(len(line) for line in out.splitlines()) <= 80, out


@pytest.mark.full_only  # fresh interpreters or files: the quick subset's budget
def test_xla_flag_presets_fit_80_columns(capsys):
    from zoo.bench.xla_flags import PRESETS

    assert bench_cli.main(["xla-flags"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert all(f"  {name}\n" in out for name in PRESETS) and "accepted" in out
