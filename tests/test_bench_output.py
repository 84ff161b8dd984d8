"""What the benchmark prints and renders: tables that fit 80 columns, the measured agreement in
the footer, `report` on missing records, and records marked by the host load they were taken at."""

from __future__ import annotations

import copy
import glob
import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from zoo.bench import cli, report
from zoo.bench.tables import agreement, model_table, print_model_record, to_rich


def _load(path: str) -> dict:
    return json.loads(Path(path).read_text())


RECORDS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "bench", "results",
                                        "*", "*.json")))
MODEL_RECORDS = [p for p in RECORDS if _load(p).get("kind") == "model"]
PLAIN = next(p for p in MODEL_RECORDS  # one device, one method: the default columns
             if len(_load(p)["config"].get("methods") or ()) <= 1 and not _load(p).get("mesh"))


def _render(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("path", MODEL_RECORDS, ids=os.path.basename)
def test_default_tables_fit_80_columns_uncut(path):
    """Every committed record's default table: no line over 80 columns, no cell cut to '…'."""
    record = _load(path)
    for mode in record["config"]["modes"]:
        text = _render(to_rich(model_table(record, mode)))
        assert "…" not in text, text
        assert max(len(line.rstrip()) for line in text.splitlines()) <= 80, text


def test_every_header_has_a_unit_and_wide_adds_the_rest():
    record = _load(PLAIN)
    mode = record["config"]["modes"][0]
    narrow = [c.name for c in model_table(record, mode).columns]
    wide = [c.name for c in model_table(record, mode, wide=True).columns]
    spread = next(n for n in narrow if n.startswith("p10–p90 "))
    assert set(narrow) - {spread} < set(wide)
    unit = next(n for n in wide if n.startswith("median")).split()[-1]
    for name in ("min", "dispatch", "p10", "p90"):
        assert f"{name} {unit}" in wide
    assert "compile s" in narrow and any(n.startswith("p10–p90 ") for n in narrow)


def test_footer_gives_the_measured_difference_and_the_tolerance():
    record = _load(MODEL_RECORDS[0])
    record = copy.deepcopy(record)
    f = record["fairness"]
    mode = record["config"]["modes"][0]
    outputs = f[mode]["outputs"]
    name = next(iter(outputs))
    outputs[name]["rel_err"] = 1.234e-6
    for other in list(outputs)[1:]:
        outputs[other]["rel_err"] = 1e-9
    text = agreement(record)
    assert "1.2e-06" in text and f"tolerance {f['output_tolerance']:g}" in text
    assert f["reference"] in text


def test_missing_styles_are_reported_only_when_asked_for():
    record = _load(MODEL_RECORDS[0])
    record = copy.deepcopy(record)
    record["skipped_styles"] = [{"impl": "nnx", "call": "flaxlib", "reason": "not here"}]

    def printed(asked: frozenset[str]) -> str:
        console = Console(width=80, record=True, file=io.StringIO())
        print_model_record(record, console, asked=asked)
        return console.export_text()

    assert "not installed" not in printed(frozenset({"default"}))
    assert "not installed: nnx flaxlib" in printed(frozenset({"flaxlib"}))
    assert "not installed: nnx flaxlib" in printed(frozenset({"all"}))


@pytest.mark.parametrize("missing", [True, False])
def test_report_without_records_fails_and_writes_nothing(tmp_path, missing, capsys):
    results = tmp_path / "results"
    if not missing:
        results.mkdir()
    readme = tmp_path / "README.md"
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "--results", str(results), "--readme", str(readme),
                  "--plots", str(tmp_path / "plots")])
    assert e.value.code == 2 and not readme.exists()
    err = capsys.readouterr().err
    assert "no benchmark records" in err and str(results) in err and "wrote" not in err


def _stamped(record: dict, load: float, when: str) -> dict:
    out = copy.deepcopy(record)
    out["host_load_avg"] = [load, load, load]
    out["timestamp"] = when
    return out


def test_report_prefers_the_newest_idle_record_and_marks_loaded_ones(tmp_path):
    base = _load(MODEL_RECORDS[0])
    cores = base["device"]["host_cores"]
    results = tmp_path / "results" / base["device"]["slug"]
    results.mkdir(parents=True)
    records = {"old-idle.json": _stamped(base, cores - 0.5, "2026-01-01T00:00:00+00:00"),
               "new-loaded.json": _stamped(base, cores + 3.0, "2026-02-01T00:00:00+00:00")}
    for name, rec in records.items():
        (results / name).write_text(json.dumps(rec))
    readme = tmp_path / "README.md"
    text = report.render(str(tmp_path / "results"), str(readme), str(tmp_path / "plots"))
    shown, superseded = text.split("## Superseded records")
    assert "old-idle.json" in shown and "new-loaded.json" not in shown
    assert "new-loaded.json" in superseded and "**loaded**" in superseded
    assert shown.index("### Summary") == shown.index("### ")
    headings = [ln for ln in shown.splitlines() if ln.startswith("### ")]
    assert len(headings) == len(set(headings))

    # Only loaded records: the newest is shown, marked.
    (results / "old-idle.json").unlink()
    text = report.render(str(tmp_path / "results"), str(readme), str(tmp_path / "plots"))
    assert "new-loaded.json" in text and "(loaded)" in text


def test_plot_flag_writes_one_png_per_run(tmp_path):
    record = _load(MODEL_RECORDS[0])
    path = tmp_path / "sub" / "run.png"
    report.plot_record(record, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_presets_fit_80_columns_with_every_name_whole(capsys, monkeypatch):
    """`presets`: a name cut to '…' cannot be typed back; every name shows whole at 80 columns,
    with its non-default dtype and modes."""
    from zoo.bench.presets import PRESETS

    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["presets"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80 and "…" not in out
    names = {cell.strip() for line in lines if line.count("│") == 5
             for cell in line.split("│")[2:3]}
    assert {p.name for p in PRESETS} <= names
    wgrad = next(p for p in PRESETS if p.dtype != "float32")
    assert "bfloat16" in out and f"{' + '.join(wgrad.modes)} only" in " ".join(out.split())
