"""`python -m zoo.bench report`: render bench/README.md and bench/plots/*.png from the records.

Reads every JSON record under bench/results/<device>/ and writes, per device, the dispatch table
and one table per architecture, preset and mode (ratios to the fastest), with PNG plots of the
time per step and of the dispatch overhead (matplotlib, Agg backend).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from typing import Any

from zoo.bench.display import fmt_num, fmt_time, method_columns, time_unit
from zoo.bench.spec import bench_archs
from zoo.bench.tables import (
    dispatch_index,
    dispatch_table,
    model_table,
    precision_label,
    to_markdown,
)

IMPL_COLORS = {"eqx": "#1f77b4", "linen": "#ff7f0e", "nnx": "#2ca02c", "torch": "#d62728",
               "floor": "#7f7f7f", "bound": "#9467bd"}


def load_records(results_dir: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(glob.glob(os.path.join(results_dir, "**", "*.json"), recursive=True)):
        with open(path) as f:
            record = json.load(f)
        if record.get("kind") in ("model", "dispatch"):
            out.append((path, record))
    return out


def _plt() -> Any:
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("the report's plots need matplotlib: pip install "
                          "'jax-model-zoo[bench]'") from e

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_model(record: dict[str, Any], mode: str, path: str) -> None:
    plt = _plt()
    rows = sorted((r for r in record["results"] if r["mode"] == mode),
                  key=lambda r: -(r["time"].get("median_s") or 0))
    unit, factor = time_unit([r["time"].get("p90_s") for r in rows])
    multi = method_columns(record)
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1.2))
    med = [r["time"]["median_s"] * factor for r in rows]
    lo = [max(m - r["time"]["p10_s"] * factor, 0) for m, r in zip(med, rows, strict=True)]
    hi = [max(r["time"]["p90_s"] * factor - m, 0) for m, r in zip(med, rows, strict=True)]
    ax.barh([f"{r['impl']}:{r['method'] + ':' if r.get('method') and multi else ''}{r['call']}"
             for r in rows], med, xerr=[lo, hi],
            color=[IMPL_COLORS.get(r["impl"], "#999") for r in rows], capsize=2)
    cfg = record["config"]
    ax.set_xlabel(f"time per step, {unit} (median, p10-p90)")
    ax.set_title(f"{cfg['arch']} {mode}, batch {cfg['batch']}, {cfg['dtype']}, "
                 f"{precision_label(record)} ({record['device']['name']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_dispatch(record: dict[str, Any], path: str) -> None:
    plt = _plt()
    from matplotlib.ticker import NullFormatter

    workloads, keys, by = dispatch_index(record)
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 0.3 * len(keys) + 1.5),
                             sharey=True)
    axes = axes if len(workloads) > 1 else [axes]
    labels = [f"{i}:{c}" if i != "floor" else "floor (raw jax.jit)" for i, c in keys]
    labels = [lab.replace("own program, raw jax.jit", "own program (raw)") for lab in labels]
    for ax, w in zip(axes, workloads, strict=True):
        vals = [by[(i, c, w)]["time"]["median_s"] * 1e6 if (i, c, w) in by else 0
                for i, c in keys]
        ax.barh(labels, vals, color=[IMPL_COLORS.get(i, "#999") for i, _ in keys])
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        floor = by.get(("floor", keys[0][1], w)) if keys and keys[0][0] == "floor" else None
        if floor is not None:
            ax.axvline(floor["time"]["median_s"] * 1e6, color="#555", lw=0.8, ls="--")
        ax.set_title(record["config"]["workloads"][w], fontsize=9)
        ax.set_xlabel("µs per call (median, log)")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _shown_config(record: dict[str, Any]) -> dict[str, Any]:
    """The resolved config; with several methods its method field is per row."""
    shown = dict(record["config"]["resolved_config"])
    if method_columns(record):
        for key in ("conv_method", "method"):
            if key in shown:
                shown[key] = "per row"
    return shown


def _roofline_text(record: dict[str, Any], mode: str) -> str:
    roof = (record.get("roofline") or {}).get(mode)
    if not roof or not roof.get("time_s"):
        return ""
    text = (f"Roofline {fmt_time(roof['time_s'])}: {fmt_num(roof['flops'])}FLOP useful, "
            f"{fmt_num(roof['bytes'], 'B')} minimum traffic (`zoo.bench.roofline`). ")
    if method_columns(record):
        picks = record["config"].get("auto_picks")
        text += ("× lhs_dilation: same impl and call style with method `lhs_dilation`; × torch: "
                 "the faster PyTorch style. " + (f"`auto` picked {picks}. " if picks else ""))
    return text


def _conditions(record: dict[str, Any]) -> str:
    """Host load and PyTorch threads while the record was taken (shared machines)."""
    parts = []
    if record.get("host_load_avg"):
        parts.append(f"host load average {record['host_load_avg'][0]:.1f}")
    if record.get("config", {}).get("torch_threads") or record.get("torch_threads"):
        threads = record.get("config", {}).get("torch_threads") or record.get("torch_threads")
        parts.append(f"PyTorch threads {threads}")
    text = ", ".join(parts)
    return (text[0].upper() + text[1:] + ".") if parts else ""


def _versions(record: dict[str, Any]) -> str:
    v = record["versions"]
    keys = ("jax", "jaxlib", "flax", "equinox", "optax", "torch", "python")
    s = ", ".join(f"{k} {v[k]}" for k in keys if v.get(k))
    cuda = v.get("jax_cuda") or v.get("torch_cuda")
    return s + (f", CUDA {cuda}" if cuda else "")


def render(results_dir: str, readme: str, plots_dir: str) -> str:
    records = load_records(results_dir)
    plots_rel = os.path.relpath(plots_dir, os.path.dirname(os.path.abspath(readme)) or ".")
    os.makedirs(plots_dir, exist_ok=True)
    lines = ["# Benchmark results", "",
             "Generated by `python -m zoo.bench report` from the JSON records in "
             "`bench/results/<device>/`; do not edit by hand. How to run, what each column "
             "means, the fairness check and the conclusions: "
             "[docs/benchmarks.md](../docs/benchmarks.md).", "",
             "Every model table passed the fairness check (same weights, outputs within the "
             "precision policy's tolerance, FLOPs within 1%) before it was timed. **Bold** = the "
             "library's default (fastest) call style, `zoo.fast`. Times are per step "
             "(median, p10–p90), dispatch = host time until the call returned, compile = "
             "lowering + XLA compilation seconds, or (first call) where a style has no "
             "ahead-of-time path.", ""]
    devices = sorted({r["device"]["slug"] for _, r in records})
    for slug in devices:
        recs = [(p, r) for p, r in records if r["device"]["slug"] == slug]
        first = recs[0][1]
        dev = first["device"]
        peak = dev.get("peak") or {}
        name = slug if dev["name"].lower() == slug else f"{slug}: {dev['name']}"
        lines += [f"## {name} ({dev.get('host_cpu')}, {dev.get('host_cores')} host cores)", "",
                  f"Versions: {_versions(first)}.", ""]
        if peak:
            lines += [f"Peak used for shares: {peak['name']}, "
                      + ", ".join(f"{k} {v:.3g} TFLOP/s" for k, v in peak["tflops"].items())
                      + f", {peak['gbps']:g} GB/s"
                      + (f" ({peak['note']})" if peak.get("note") else "") + ".", ""]
        for path, rec in recs:
            if rec["kind"] != "dispatch":
                continue
            png = f"{slug}-dispatch.png"
            plot_dispatch(rec, os.path.join(plots_dir, png))
            lines += ["### Dispatch overhead", "",
                      "µs per call (median of per-call times, each call waited for); × floor: "
                      "ratio to a raw `jax.jit` on pre-flattened arrays of a hand-written "
                      "program; × own: ratio to the library's own compiled program called the "
                      "same raw way (isolates dispatch from program differences). "
                      f"{_conditions(rec)} "
                      f"Record: `{os.path.relpath(path, os.path.dirname(readme) or '.')}`.", "",
                      *to_markdown(dispatch_table(rec)), "",
                      f"![dispatch overhead]({plots_rel}/{png})", ""]
        models = [(p, r) for p, r in recs if r["kind"] == "model"]
        order = bench_archs()  # the registry's order, then the bench-only subjects
        models.sort(key=lambda pr: (order.index(pr[1]["config"]["arch"])
                                    if pr[1]["config"]["arch"] in order else len(order), pr[0]))
        for path, rec in models:
            cfg = rec["config"]
            name = os.path.splitext(os.path.basename(path))[0]
            for mode in cfg["modes"]:
                png = f"{slug}-{name}-{mode}.png"
                plot_model(rec, mode, os.path.join(plots_dir, png))
                shape = "x".join(str(d) for d in cfg["input_shape"])
                lines += [f"### {cfg['arch']} {mode}: batch {cfg['batch']}, {cfg['dtype']}, "
                          f"{precision_label(rec)}"
                          + (f", preset `{cfg['preset']}`" if cfg.get("preset") else ""), "",
                          f"Input {shape} (canonical NC...), config "
                          f"`{json.dumps(_shown_config(rec), sort_keys=True)}`. "
                          f"{_roofline_text(rec, mode)}{_conditions(rec)} Record: "
                          f"`{os.path.relpath(path, os.path.dirname(readme) or '.')}`.", "",
                          *to_markdown(model_table(rec, mode)), "",
                          f"![{cfg['arch']} {mode}]({plots_rel}/{png})", ""]
    text = "\n".join(lines).rstrip() + "\n"
    with open(readme, "w") as f:
        f.write(text)
    return text


def report_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m zoo.bench report", description=__doc__)
    p.add_argument("--results", default=os.path.join("bench", "results"))
    p.add_argument("--readme", default=os.path.join("bench", "README.md"))
    p.add_argument("--plots", default=os.path.join("bench", "plots"))
    args = p.parse_args(argv)
    render(args.results, args.readme, args.plots)
    print(f"wrote {args.readme} and plots in {args.plots}/")
    return 0
