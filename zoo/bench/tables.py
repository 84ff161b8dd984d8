"""One renderer for every benchmark table: a table is data (title, column spec, rows), drawn
for the terminal (`to_rich`) or as Markdown (`to_markdown`, the report) from the same spec."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zoo.bench.display import (
    compile_seconds,
    fmt_num,
    fmt_ratio,
    fmt_share,
    fmt_time,
    memory_mib,
    method_columns,
    time_unit,
)


@dataclass(frozen=True)
class Column:
    """`left`: a text column (numbers are right-aligned); `marks`: the column that shows which
    rows are strong (terminal: a trailing " *"; Markdown: bold)."""

    name: str
    left: bool = False
    marks: bool = False


@dataclass
class Table:
    """`rows` of cells (strings); `strong[i]`: row i is marked (the default call style)."""

    title: str
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)
    strong: list[bool] = field(default_factory=list)

    def add(self, cells: list[str], strong: bool = False) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(cells)
        self.strong.append(strong)


def to_rich(table: Table) -> Any:
    from rich.table import Table as RichTable

    out = RichTable(title=table.title, title_justify="left")
    for col in table.columns:
        out.add_column(col.name, justify="left" if col.left else "right")
    for cells, strong in zip(table.rows, table.strong, strict=True):
        out.add_row(*(c + " *" if strong and col.marks else c
                      for c, col in zip(cells, table.columns, strict=True)))
    return out


def to_markdown(table: Table) -> list[str]:
    """Markdown lines (no title: the report writes it as a heading); strong rows in bold."""
    lines = ["| " + " | ".join(c.name for c in table.columns) + " |",
             "|" + "".join("---|" if c.left else "---:|" for c in table.columns)]
    for cells, strong in zip(table.rows, table.strong, strict=True):
        cells = [f"**{c}**" if strong and col.marks else c
                 for c, col in zip(cells, table.columns, strict=True)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# --------------------------------------------------------------------------- model records
def precision_label(record: dict[str, Any]) -> str:
    """"precision default (tf32)": what the timed programs ran at (older records: default)."""
    cfg, fair = record["config"], record.get("fairness") or {}
    at = fair.get("at_precision") or {}
    fmt = at.get("format")
    return f"precision {cfg.get('precision', 'default')}" + (f" ({fmt})" if fmt else "")


def model_title(record: dict[str, Any], mode: str) -> str:
    cfg = record["config"]
    return (f"{cfg['arch']} {mode}: batch {cfg['batch']}, {cfg['dtype']}, "
            f"{precision_label(record)}"
            f"{', preset ' + cfg['preset'] if cfg.get('preset') else ''}, "
            f"{record['device']['name']}")


def _scaled(value: float | None, factor: float) -> str:
    if value is None:
        return "-"
    v = value * factor
    return f"{v:.1f}" if v >= 100 else f"{v:.3g}"


def call_label(r: dict[str, Any]) -> str:
    """The call style, with its steps per call when more than one ("fused K=100")."""
    k = r.get("steps_per_call") or 1
    return r["call"] + (f" K={k}" if k > 1 else "")


def model_table(record: dict[str, Any], mode: str) -> Table:
    """One mode of a model record: every (impl, [method,] call) row, fastest first."""
    rows = sorted((r for r in record["results"] if r["mode"] == mode),
                  key=lambda r: r["time"].get("median_s") or float("inf"))
    unit, factor = time_unit([r["time"].get("p90_s") for r in rows])
    methods, roof = method_columns(record), bool(record.get("roofline"))
    title = model_title(record, mode)
    roof_mode = (record.get("roofline") or {}).get(mode) or {}
    if roof_mode.get("time_s"):
        title += (f"; roofline {fmt_time(roof_mode['time_s'])} ({fmt_num(roof_mode['flops'])}"
                  f"FLOP useful, {fmt_num(roof_mode['bytes'], 'B')} min)")
    # With several methods the table is wide: min, dispatch and samples/s stay in the JSON.
    spec: list[tuple[str, bool, Any]] = [  # (name, text column, cell)
        ("impl", True, lambda r: r["impl"]),
        *([("method", True, lambda r: r.get("method") or "-")] if methods else []),
        ("call", True, call_label),
        (f"median {unit}", False, lambda r: _scaled(r["time"].get("median_s"), factor)),
        ("p10", False, lambda r: _scaled(r["time"].get("p10_s"), factor)),
        ("p90", False, lambda r: _scaled(r["time"].get("p90_s"), factor)),
        *([] if methods else [
            ("min", False, lambda r: _scaled(r["time"].get("min_s"), factor)),
            ("dispatch", False, lambda r: _scaled(r["dispatch"].get("median_s"), factor))]),
        ("compile s", False, compile_seconds),
        *([] if methods else [("samples/s", False,
                               lambda r: fmt_num(r.get("throughput_per_s")))]),
        ("TFLOP/s", False, lambda r: "-" if r.get("tflops_per_s") is None
         else f"{r['tflops_per_s']:.3g}"),
        ("% peak", False, lambda r: fmt_share(r.get("peak_flops_share"))),
        ("GB/s", False, lambda r: "-" if r.get("gb_per_s") is None else f"{r['gb_per_s']:.3g}"),
        ("MiB", False, memory_mib),
        ("× fastest", False, lambda r: fmt_ratio(r.get("ratio_to_fastest"))),
        *([("× lhs_dil", False, lambda r: fmt_ratio(r.get("ratio_to_lhs_dilation"))),
           ("× torch", False, lambda r: fmt_ratio(r.get("ratio_to_torch")))] if methods else []),
        *([("× roofline", False, lambda r: fmt_ratio(r.get("ratio_to_roofline")))]
          if roof else []),
    ]
    table = Table(title, [Column(name, left, marks=name == "call") for name, left, _ in spec])
    for r in rows:
        table.add([cell(r) for _, _, cell in spec], strong=bool(r.get("default")))
    return table


# --------------------------------------------------------------------------- dispatch records
def dispatch_index(record: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]], dict]:
    """Workloads, `(impl, call)` styles in recorded order, and results by (impl, call, workload).
    """
    workloads = list(record["config"]["workloads"])
    keys: list[tuple[str, str]] = []
    for r in record["results"]:
        if (r["impl"], r["call"]) not in keys:
            keys.append((r["impl"], r["call"]))
    by = {(r["impl"], r["call"], r["workload"]): r for r in record["results"]}
    return workloads, keys, by


def dispatch_table(record: dict[str, Any]) -> Table:
    """µs per call, × floor and × own per workload, one row per (impl, call style)."""
    workloads, keys, by = dispatch_index(record)
    cols = [Column("impl", True), Column("call", True)]
    for w in workloads:
        cols += [Column(f"{w} µs"), Column("× floor"), Column("× own")]
    table = Table(f"dispatch: µs per step (median; one step per call, fused K: call / K), ratio "
                  f"to the floor and to the library's own program called raw, "
                  f"{record['device']['name']}", cols)
    for impl, call in keys:
        cells = []
        for w in workloads:
            r = by.get((impl, call, w))
            cells += (["-", "-", "-"] if r is None else
                      [f"{r['time']['median_s'] * 1e6:.1f}", f"{r['ratio_to_floor']:.2f}",
                       "" if impl in ("floor", "torch", "bound") else f"{r['ratio_to_own']:.2f}"])
        idiom = " (idiomatic)" if by.get((impl, call, workloads[0]), {}).get("idiomatic") else ""
        table.add([impl, call + idiom, *cells])
    return table


def print_model_record(record: dict[str, Any], console: Any) -> None:
    for mode in record["config"]["modes"]:
        console.print(to_rich(model_table(record, mode)))
    for f in record.get("failed_styles", []):
        console.print(f"[yellow]skipped {f['impl']} {f['call']} ({f['mode']}): {f['error']}[/]")
    for f in record.get("skipped_styles", []):
        console.print(f"[dim]not installed: {f['impl']} {f['call']}: {f['reason']}[/]")
    if record["config"].get("xla_flags"):
        console.print(f"XLA_FLAGS: {record['config']['xla_flags']}")
    f = record["fairness"]
    at = f.get("at_precision") or {}
    at_text = (f", then at precision {at['precision']} ({at['format']}) within "
               f"{at['output_tolerance']:g}" if at.get("output_tolerance") else "")
    console.print(
        f"[green]fairness check passed[/]: parameters {sorted(set(f['parameters'].values()))}, "
        f"outputs within {f['output_tolerance']:g} of {f['reference']} at full float32"
        f"{at_text}, FLOPs within {f['flops_tolerance']:.0%}.  * = the library's default "
        "(fastest) call style; "
        "compile = lower + compile seconds, (first call) where the style has no AOT path; "
        "dispatch = host time until the call returned.")
    if method_columns(record):
        picks = record["config"].get("auto_picks")
        console.print(
            "× lhs_dil = median / the same impl and call style with method lhs_dilation; × torch "
            "= median / the faster PyTorch style; × roofline = median / max(min bytes / peak "
            "GB/s, useful FLOPs / peak FLOP/s). FLOPs compared within 1% per method only."
            + (f" auto picked {picks} on this backend." if picks else ""))
