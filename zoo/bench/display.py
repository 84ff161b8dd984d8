"""Number formatting shared by the terminal tables and the report, and the rich console."""

from __future__ import annotations

from typing import Any

WIDE_COLUMNS = 200


def make_console(wide: bool = False) -> Any:
    """A rich console as wide as the terminal (80 columns, or $COLUMNS, when the output is not
    a terminal); `wide`: at least WIDE_COLUMNS, for the tables' every column."""
    from rich.console import Console

    console = Console()
    return Console(width=max(console.width, WIDE_COLUMNS)) if wide else console


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


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def method_columns(record: dict[str, Any]) -> bool:
    """Whether the record compares conv-transpose methods (method, × lhs_dilation columns)."""
    return len(record["config"].get("methods") or ()) > 1
