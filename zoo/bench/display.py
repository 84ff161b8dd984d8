"""Rich tables for the terminal (one per mode) and number formatting shared with the report."""

from __future__ import annotations

from typing import Any


def fmt_time(seconds: float | None) -> str:
    """Seconds in the most readable unit: 12.3 µs, 4.56 ms, 1.23 s."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_num(value: float | None, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}".strip()
    return f"{value:.{digits}g} {unit}".strip()


def fmt_share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}" if value >= 0.001 else f"{value:.2%}"


def memory_mib(res: dict[str, Any]) -> str:
    """Device peak bytes where the backend reports them, else the compiled program's footprint
    (arguments + outputs + temporaries - donated), in MiB; "-" for PyTorch on CPU."""
    mem = res.get("memory") or {}
    if mem.get("device_peak_bytes"):
        return f"{mem['device_peak_bytes'] / 2**20:.1f} (peak)"
    compiled = mem.get("compiled") or {}
    return "-" if not compiled else f"{compiled['total_bytes'] / 2**20:.1f}"


def compile_seconds(res: dict[str, Any]) -> str:
    c = res["compile"]
    if c.get("lower_s") is not None and c.get("compile_s") is not None:
        return f"{c['lower_s']:.2f} + {c['compile_s']:.2f}"
    if c.get("first_call_s") is not None:
        return f"({c['first_call_s']:.2f})"
    return "-"


def time_unit(seconds: list[float]) -> tuple[str, float]:
    """One unit for a whole table column set: (name, factor) from the largest value."""
    top = max((v for v in seconds if v is not None), default=0.0)
    if top < 1e-3:
        return "µs", 1e6
    if top < 1.0:
        return "ms", 1e3
    return "s", 1.0


def _scaled(value: float | None, factor: float) -> str:
    if value is None:
        return "-"
    v = value * factor
    return f"{v:.1f}" if v >= 100 else f"{v:.3g}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def method_columns(record: dict[str, Any]) -> bool:
    """Whether the record compares conv-transpose methods (method, × lhs_dilation columns)."""
    return len(record["config"].get("methods") or ()) > 1


def roofline_columns(record: dict[str, Any]) -> bool:
    return bool(record.get("roofline"))


def model_table(record: dict[str, Any], mode: str) -> Any:
    from rich.table import Table

    cfg = record["config"]
    title = (f"{cfg['arch']} {mode}: batch {cfg['batch']}, {cfg['dtype']}"
             f"{', preset ' + cfg['preset'] if cfg.get('preset') else ''}, "
             f"{record['device']['name']}")
    rows = [r for r in record["results"] if r["mode"] == mode]
    unit, factor = time_unit([r["time"].get("p90_s") for r in rows])
    methods, roof = method_columns(record), roofline_columns(record)
    roof_mode = (record.get("roofline") or {}).get(mode) or {}
    if roof_mode.get("time_s"):
        title += (f"; roofline {fmt_time(roof_mode['time_s'])} ({fmt_num(roof_mode['flops'])}"
                  f"FLOP useful, {fmt_num(roof_mode['bytes'], 'B')} min)")
    table = Table(title=title, title_justify="left")
    # With several methods the table is wide: min, dispatch and samples/s stay in the JSON.
    narrow = {"min", "dispatch", "samples/s"} if methods else set()
    cols = ["impl", *(["method"] if methods else []), "call", f"median {unit}", "p10", "p90",
            "min", "dispatch", "compile s", "samples/s", "TFLOP/s", "% peak", "GB/s", "MiB",
            "× fastest", *(["× lhs_dil", "× torch"] if methods else []),
            *(["× roofline"] if roof else [])]
    for col in cols:
        if col not in narrow:
            table.add_column(col, justify="left" if col in ("impl", "call", "method") else "right")
    for r in sorted(rows, key=lambda r: r["time"].get("median_s") or float("inf")):
        t = r["time"]
        extra = ([fmt_ratio(r.get("ratio_to_lhs_dilation")), fmt_ratio(r.get("ratio_to_torch"))]
                 if methods else [])
        if roof:
            extra.append(fmt_ratio(r.get("ratio_to_roofline")))
        cells = [
            r["impl"], *([r.get("method") or "-"] if methods else []),
            r["call"] + (" *" if r.get("default") else ""),
            _scaled(t.get("median_s"), factor), _scaled(t.get("p10_s"), factor),
            _scaled(t.get("p90_s"), factor), _scaled(t.get("min_s"), factor),
            _scaled(r["dispatch"].get("median_s"), factor), compile_seconds(r),
            fmt_num(r.get("throughput_per_s")),
            "-" if r.get("tflops_per_s") is None else f"{r['tflops_per_s']:.3g}",
            fmt_share(r.get("peak_flops_share")),
            "-" if r.get("gb_per_s") is None else f"{r['gb_per_s']:.3g}", memory_mib(r),
            "-" if r.get("ratio_to_fastest") is None else f"{r['ratio_to_fastest']:.2f}",
            *extra,
        ]
        table.add_row(*(c for c, name in zip(cells, cols, strict=True) if name not in narrow))
    return table


def print_model_record(record: dict[str, Any], console: Any) -> None:
    for mode in record["config"]["modes"]:
        console.print(model_table(record, mode))
    for f in record.get("failed_styles", []):
        console.print(f"[yellow]skipped {f['impl']} {f['call']} ({f['mode']}): {f['error']}[/]")
    f = record["fairness"]
    console.print(
        f"[green]fairness check passed[/]: parameters {sorted(set(f['parameters'].values()))}, "
        f"outputs within {f['output_tolerance']:g} of {f['reference']}, FLOPs within "
        f"{f['flops_tolerance']:.0%}.  * = the library's default (fastest) call style; "
        "compile = lower + compile seconds, (first call) where the style has no AOT path; "
        "dispatch = host time until the call returned.")
    if method_columns(record):
        picks = record["config"].get("auto_picks")
        console.print(
            "× lhs_dil = median / the same impl and call style with method lhs_dilation; × torch "
            "= median / the faster PyTorch style; × roofline = median / max(min bytes / peak "
            "GB/s, useful FLOPs / peak FLOP/s). FLOPs compared within 1% per method only."
            + (f" auto picked {picks} on this backend." if picks else ""))
