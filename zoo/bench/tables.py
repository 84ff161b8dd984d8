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
from zoo.bench.mesh import label as mesh_label
from zoo.bench.records import dispatch_results, host_load, is_loaded


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
    """A rich table without side borders (two spaces between columns), so that the default
    columns fit an 80-column terminal; cells never wrap."""
    from rich import box
    from rich.table import Table as RichTable

    out = RichTable(title=table.title, title_justify="left", box=box.SIMPLE_HEAD,
                    show_edge=False, pad_edge=False, padding=(0, 1),
                    collapse_padding=True)
    for col in table.columns:
        out.add_column(col.name, justify="left" if col.left else "right", no_wrap=True)
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
    cfg, mesh = record["config"], record.get("mesh")
    return (f"{cfg['arch']} {mode}: batch {cfg['batch']}, {cfg['dtype']}, "
            f"{precision_label(record)}"
            f"{', preset ' + cfg['preset'] if cfg.get('preset') else ''}, "
            + (f"mesh {mesh_label(mesh['shape'])} {mesh['strategy']}, " if mesh else "")
            + f"{record['device']['name']}")


# --------------------------------------------------------------------------- device meshes
def _mesh_mib(r: dict[str, Any]) -> str:
    """Parameters + optimizer state (+ model state) on the fullest device, MiB."""
    held = ((r.get("mesh") or {}).get("bytes") or {}).get("total")
    return "-" if not held else f"{held['max'] / 2**20:.3g}"


def _collectives(r: dict[str, Any]) -> str:
    found = (r.get("mesh") or {}).get("collectives")
    return "-" if found is None else str(found["count"])


def _collective_mib(r: dict[str, Any]) -> str:
    found = (r.get("mesh") or {}).get("collectives")
    return "-" if found is None else f"{found['bytes'] / 2**20:.3g}"


def _collective_share(r: dict[str, Any]) -> str:
    timed = (r.get("mesh") or {}).get("collective_time")
    return "-" if timed is None else f"{timed['share']:.0%}"


MESH_COLUMNS: list[tuple[str, bool, Any]] = [
    ("MiB/dev", False, _mesh_mib), ("colls", False, _collectives),
    ("coll %", False, _collective_share)]


def mesh_note(record: dict[str, Any]) -> str:
    """The footer of a run on a mesh: what its columns measure, how, and what was left out."""
    mesh = record["mesh"]
    one = max((r["mesh"]["bytes"]["total"]["unsharded"] for r in record["results"]
               if r["mode"] == "train" and r.get("mesh")), default=None)
    text = (f"mesh {mesh_label(mesh['shape'])}, {mesh['strategy']}, {mesh['devices']} "
            f"{mesh['platform']} devices. MiB/dev: parameters + optimizer state (forward: "
            "parameters) and model state on the fullest device, from the arrays' shardings"
            + (f" (one device: {one / 2**20:.3g} MiB for training)" if one else "")
            + "; colls: collective ops in the compiled HLO; coll %: their share of the HLO "
            "op time in a jax.profiler trace.")
    if mesh.get("not_sharded"):
        text += f" Not sharded, left out: {', '.join(mesh['not_sharded'])}."
    if mesh["platform"] == "cpu":
        cores = record["device"].get("host_cores")
        text += (f" Host devices sharing {cores or 'the'} CPU cores: the times show the "
                 "sharding's overhead, not scaling.")
    return text


def _scaled(value: float | None, factor: float) -> str:
    if value is None:
        return "-"
    v = value * factor
    return f"{v:.0f}" if v >= 1000 else f"{v:.1f}" if v >= 100 else f"{v:.3g}"


def call_label(r: dict[str, Any]) -> str:
    """The call style, with its steps per call when more than one ("fused K=100")."""
    k = r.get("steps_per_call") or 1
    return r["call"] + (f" K={k}" if k > 1 else "")


def _spread(r: dict[str, Any], factor: float) -> str:
    t = r["time"]
    return f"{_scaled(t.get('p10_s'), factor)}–{_scaled(t.get('p90_s'), factor)}"


def _compile_total(r: dict[str, Any]) -> str:
    """Lower + compile seconds as one number; (first call) where the style has no AOT path."""
    c = r["compile"]
    if c.get("lower_s") is not None and c.get("compile_s") is not None:
        return f"{c['lower_s'] + c['compile_s']:.2f}"
    return f"({c['first_call_s']:.2f})" if c.get("first_call_s") is not None else "-"


def model_table(record: dict[str, Any], mode: str, *, wide: bool = False) -> Table:
    """One mode of a model record: every (impl, [method,] call) row, fastest first.

    The default columns fit an 80-column terminal (time, its spread, compile time, share of
    peak, ratio to the fastest; on a mesh, bytes per device and collectives instead of compile
    time and share of peak); `wide` adds min, dispatch, throughput, TFLOP/s, GB/s, memory
    and roofline (the report's Markdown and `--wide`). Every header carries its unit.
    """
    rows = sorted((r for r in record["results"] if r["mode"] == mode),
                  key=lambda r: r["time"].get("median_s") or float("inf"))
    # The unit of the fastest row: the rows that matter read best; slow ones get big numbers.
    unit, factor = time_unit([min((r["time"].get("median_s") or float("inf") for r in rows),
                                  default=0.0)])
    methods, roof = method_columns(record), bool(record.get("roofline"))
    title = model_title(record, mode)
    roof_mode = (record.get("roofline") or {}).get(mode) or {}
    if wide and roof_mode.get("time_s"):
        title += (f"; roofline {fmt_time(roof_mode['time_s'])} ({fmt_num(roof_mode['flops'])}"
                  f"FLOP useful, {fmt_num(roof_mode['bytes'], 'B')} min)")

    def timed(key: str) -> Any:
        return lambda r: _scaled(r["time"].get(key), factor)

    spec: list[tuple[str, bool, Any]] = [  # (name, text column, cell)
        ("impl", True, lambda r: r["impl"]),
        *([("method", True, lambda r: r.get("method") or "-")] if methods else []),
        ("call", True, call_label),
        (f"median {unit}", False, timed("median_s")),
    ]
    if wide:
        spec += [
            (f"p10 {unit}", False, timed("p10_s")),
            (f"p90 {unit}", False, timed("p90_s")),
            (f"min {unit}", False, timed("min_s")),
            (f"dispatch {unit}", False,
             lambda r: _scaled((r.get("dispatch") or {}).get("median_s"), factor)),
            ("compile s", False, compile_seconds),
            ("samples/s", False, lambda r: fmt_num(r.get("throughput_per_s"))),
            ("TFLOP/s", False, lambda r: "-" if r.get("tflops_per_s") is None
             else f"{r['tflops_per_s']:.3g}"),
            ("% peak", False, lambda r: fmt_share(r.get("peak_flops_share"))),
            ("GB/s", False,
             lambda r: "-" if r.get("gb_per_s") is None else f"{r['gb_per_s']:.3g}"),
            ("MiB", False, memory_mib),
        ]
        if record.get("mesh"):
            spec += [("coll MiB", False, _collective_mib), *MESH_COLUMNS]
    else:
        spec += [(f"p10–p90 {unit}", False, lambda r: _spread(r, factor))]
        if record.get("mesh"):  # compile time: --wide
            spec += MESH_COLUMNS
        elif not methods:
            spec += [("compile s", False, _compile_total),
                     ("% peak", False, lambda r: fmt_share(r.get("peak_flops_share")))]
    spec.append(("× fastest", False, lambda r: fmt_ratio(r.get("ratio_to_fastest"))))
    if methods:
        spec += [*([("× lhs_dil", False, lambda r: fmt_ratio(r.get("ratio_to_lhs_dilation")))]
                   if wide else []),
                 ("× torch", False, lambda r: fmt_ratio(r.get("ratio_to_torch")))]
    if roof and wide:
        spec.append(("× roofline", False, lambda r: fmt_ratio(r.get("ratio_to_roofline"))))
    table = Table(title, [Column(name, left, marks=name == "call") for name, left, _ in spec])
    for r in rows:
        table.add([cell(r) for _, _, cell in spec], strong=bool(r.get("default")))
    return table


# --------------------------------------------------------------------------- dispatch records
def dispatch_index(record: dict[str, Any]) -> tuple[list[str], list[tuple], dict]:
    """Workloads, row keys `(role, impl, call)` in recorded order, and results by `(role, impl,
    call, workload)` (`impl` None for the floor and the bounds; older records upgraded)."""
    workloads = list(record["config"]["workloads"])
    keys: list[tuple] = []
    by = {}
    for r in dispatch_results(record):
        key = (r["role"], r.get("impl"), r["call"])
        if key not in keys:
            keys.append(key)
        by[(*key, r["workload"])] = r
    return workloads, keys, by


def dispatch_table(record: dict[str, Any], workloads: list[str] | None = None) -> Table:
    """µs per call, × floor and × own per workload, one row per (impl or role, call style); the
    terminal draws one table per workload (`workloads=[w]`) to fit 80 columns."""
    every, keys, by = dispatch_index(record)
    workloads = every if workloads is None else workloads
    cols = [Column("impl", True), Column("call", True)]
    for w in workloads:
        cols += [Column(f"{w} µs"), Column("× floor"), Column("× own")]
    title = (f"dispatch, {workloads[0]}: " if len(workloads) == 1 else "dispatch: ")
    table = Table(title + f"µs per step (median), ratio to the floor and to the library's own "
                  f"program called raw, {record['device']['name']}", cols)
    for role, impl, call in keys:
        cells = []
        for w in workloads:
            r = by.get((role, impl, call, w))
            cells += (["-", "-", "-"] if r is None else
                      [f"{r['time']['median_s'] * 1e6:.1f}", f"{r['ratio_to_floor']:.2f}",
                       "" if r["ratio_to_own"] is None else f"{r['ratio_to_own']:.2f}"])
        first = next(r for w in every if (r := by.get((role, impl, call, w))) is not None)
        idiom = " (idiomatic)" if first.get("idiomatic") else ""
        table.add([impl or role, call + idiom, *cells])
    return table


def agreement(record: dict[str, Any]) -> str:
    """What the fairness check measured: the largest relative difference of any library's
    output (forward) or first loss (train) from the reference, per mode, and the tolerance."""
    f = record["fairness"]
    parts = []
    for mode in record["config"]["modes"]:
        errs = [e["rel_err"] for e in ((f.get(mode) or {}).get("outputs") or {}).values()
                if e.get("rel_err") is not None]
        if errs:
            what = "outputs" if mode == "forward" else "first losses"
            parts.append(f"{what} {max(errs):.2g}")
    measured = ", ".join(parts) if parts else "no other library to compare"
    at = f.get("at_precision") or {}
    at_text = (f"; at precision {at['precision']} ({at['format']}) within "
               f"{at['output_tolerance']:g}" if at.get("output_tolerance") else "")
    params = sorted(set(f["parameters"].values()))
    first = ("full float32" if f.get("precision", "highest") == "highest"
             else f"at precision {f['precision']} only")
    # Records before issue 46 compared compiled counts; since, the pre-optimisation HLO's.
    before = "" if "compiled" in f.get("flops_sources", ("compiled",)) else (
        " (programs before optimisation)")
    return (f"fairness check passed: {', '.join(f'{n:,}' for n in params)} parameters; "
            f"max relative difference to {f['reference']}: {measured} (tolerance "
            f"{f['output_tolerance']:g}, {first}{at_text}); FLOPs within "
            f"{f['flops_tolerance']:.0%}{before}.")


def print_model_record(record: dict[str, Any], console: Any, *, wide: bool = False,
                       asked: frozenset[str] = frozenset()) -> None:
    """The tables, then what was skipped, the fairness evidence and a legend. `asked`: the call
    styles named on the command line ("all" for every one): only those are reported missing."""
    for mode in record["config"]["modes"]:
        console.print(to_rich(model_table(record, mode, wide=wide)))
    for f in record.get("failed_styles", []):
        console.print(f"[yellow]skipped {f['impl']} {f['call']} ({f['mode']}): {f['error']}[/]")
    for f in record.get("skipped_styles", []):
        if "all" in asked or f["call"] in asked:
            console.print(f"[dim]not installed: {f['impl']} {f['call']}: {f['reason']}[/]")
    if record["config"].get("xla_flags"):
        console.print(f"XLA_FLAGS: {record['config']['xla_flags']}")
    if record.get("malloc", {}).get("applied"):
        console.print("[dim]malloc: freed memory kept for reuse, every library alike "
                      "(--malloc keep)[/]", highlight=False)
    console.print(f"[green]{agreement(record)}[/]", highlight=False)
    if record.get("mesh"):
        console.print(mesh_note(record), highlight=False)
    load, cores = host_load(record)
    if is_loaded(record):
        console.print(f"[yellow]host load average {load:.1f} on {cores} cores during the run: "
                      "other work competed for the CPU; re-run on an idle machine before "
                      "trusting these times.[/]", highlight=False)
    legend = ("* = the library's default (fastest) call style; compile = lower + compile, "
              "(first call) where the style has no AOT path.")
    if wide:
        legend += " dispatch = host time until the call returned."
    if method_columns(record):
        picks = record["config"].get("auto_picks")
        legend += (" × torch = median / the faster PyTorch style"
                   + (", × lhs_dil = / method lhs_dilation, × roofline = / max(min bytes / "
                      "peak GB/s, useful FLOPs / peak FLOP/s)" if wide else "")
                   + ". FLOPs compared within 1% per method only."
                   + (f" auto picked {picks} on this backend." if picks else ""))
    console.print(legend, style="dim", highlight=False)
