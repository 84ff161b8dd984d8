"""`python -m zoo.bench report`: render bench/README.md and bench/plots/*.png from the records.

Reads every JSON record under bench/results/<device>/ and writes, per device, the dispatch table
and one table per architecture, preset and mode (ratios to the fastest), with PNG plots of the
time per step and of the dispatch overhead (matplotlib, Agg backend).
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any

from zoo.arguments import ArgumentParser
from zoo.bench.display import fmt_num, fmt_time, method_columns, time_unit
from zoo.bench.mesh import label as mesh_label
from zoo.bench.records import OWN, host_load, is_loaded, record_name
from zoo.bench.spec import bench_archs
from zoo.bench.tables import (
    call_label,
    dispatch_index,
    dispatch_table,
    mesh_note,
    model_table,
    precision_label,
    to_markdown,
)
from zoo.libraries import IMPLS

ROLE_COLORS = {"floor": "#7f7f7f", "bound": "#9467bd"}  # dispatch rows of no library
# The libraries' colours, in registry order (matplotlib's "tab10" cycle, the floor's and the
# bound's left out).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#8c564b", "#e377c2", "#bcbd22",
           "#17becf")


def _color(impl: str | None, role: str | None = None) -> str:
    """A library's colour; for rows of no library, their role's."""
    if impl in IMPLS:
        return PALETTE[list(IMPLS).index(impl) % len(PALETTE)]
    return ROLE_COLORS.get(role, "#999")


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


def _draw_mode(ax: Any, record: dict[str, Any], mode: str) -> None:
    """One mode's rows as horizontal bars: median with a p10-p90 whisker, slowest on top."""
    rows = sorted((r for r in record["results"] if r["mode"] == mode),
                  key=lambda r: -(r["time"].get("median_s") or 0))
    unit, factor = time_unit([r["time"].get("p90_s") for r in rows])
    multi = method_columns(record)
    med = [r["time"]["median_s"] * factor for r in rows]
    lo = [max(m - r["time"]["p10_s"] * factor, 0) for m, r in zip(med, rows, strict=True)]
    hi = [max(r["time"]["p90_s"] * factor - m, 0) for m, r in zip(med, rows, strict=True)]
    ax.barh([f"{r['impl']}:{r['method'] + ':' if r.get('method') and multi else ''}{r['call']}"
             for r in rows], med, xerr=[lo, hi],
            color=[_color(r["impl"]) for r in rows], capsize=2)
    cfg = record["config"]
    ax.set_xlabel(f"time per step, {unit} (median, p10-p90)")
    load, cores = host_load(record)
    loaded = f", LOADED host: load {load:.1f} > {cores} cores" if is_loaded(record) else ""
    ax.set_title(f"{cfg['arch']} {mode}, batch {cfg['batch']}, {cfg['dtype']}, "
                 f"{precision_label(record)} ({record['device']['name']}{loaded})", fontsize=9)


def plot_model(record: dict[str, Any], mode: str, path: str) -> None:
    plt = _plt()
    n = sum(r["mode"] == mode for r in record["results"])
    fig, ax = plt.subplots(figsize=(7, 0.35 * n + 1.2))
    _draw_mode(ax, record, mode)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_record(record: dict[str, Any], path: str) -> None:
    """Every mode of one run, one panel each, into one PNG (`python -m zoo.bench --plot`)."""
    plt = _plt()
    modes = record["config"]["modes"]
    n = max(sum(r["mode"] == m for r in record["results"]) for m in modes)
    fig, axes = plt.subplots(len(modes), 1, figsize=(7, len(modes) * (0.35 * n + 1.2)),
                             squeeze=False)
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        _draw_mode(ax, record, mode)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_dispatch(record: dict[str, Any], path: str) -> None:
    plt = _plt()
    from matplotlib.ticker import NullFormatter

    workloads, keys, by = dispatch_index(record)
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 0.3 * len(keys) + 1.5),
                             sharey=True)
    axes = axes if len(workloads) > 1 else [axes]
    labels = [f"{impl or role}: {call.replace(OWN, 'own program (raw)')}"
              for role, impl, call in keys]
    for ax, w in zip(axes, workloads, strict=True):
        vals = [by[(*k, w)]["time"]["median_s"] * 1e6 if (*k, w) in by else 0 for k in keys]
        ax.barh(labels, vals, color=[_color(impl, role) for role, impl, _ in keys])
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        for (role, _, _), value in zip(keys, vals, strict=True):
            if role == "floor" and value:
                ax.axvline(value, color="#555", lw=0.8, ls="--")
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
    if record.get("malloc", {}).get("applied"):
        parts.append("glibc malloc keeping freed memory (`zoo.runtime.malloc`)")
    text = ", ".join(parts)
    return (text[0].upper() + text[1:] + ".") if parts else ""


def _versions(record: dict[str, Any]) -> str:
    v = record["versions"]
    keys = ("jax", "jaxlib", "flax", "equinox", "optax", "torch", "python")
    s = ", ".join(f"{k} {v[k]}" for k in keys if v.get(k))
    cuda = v.get("jax_cuda") or v.get("torch_cuda")
    return s + (f", CUDA {cuda}" if cuda else "")


def subject(record: dict[str, Any]) -> str:
    """What a record measures (arch, shape, dtype, modes, methods, precision, K, XLA flags):
    records of one subject supersede each other."""
    if record["kind"] == "dispatch":
        return "dispatch"
    methods = record["config"].get("methods") or ()
    return record_name(record)[:-len(".json")] + ("-" + "-".join(methods) if len(methods) > 1
                                                  else "")


def latest_per_subject(records: list[tuple[str, dict[str, Any]]]
                       ) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, dict]]]:
    """(the record shown per subject, the superseded ones): the newest idle record of each
    subject, else the newest loaded one (then marked)."""
    by: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}
    for path, rec in records:
        by.setdefault((rec["device"]["slug"], subject(rec)), []).append((path, rec))
    shown, older = [], []
    for group in by.values():
        group.sort(key=lambda pr: (not is_loaded(pr[1]), pr[1].get("timestamp") or ""))
        shown.append(group[-1])
        older += group[:-1]
    return shown, older


def _load_text(record: dict[str, Any]) -> str:
    load, cores = host_load(record)
    if load is None:
        return "load unknown"
    return f"load {load:.1f}" + (f" > {cores} cores: **loaded**" if is_loaded(record) else "")


def _heading(record: dict[str, Any], mode: str) -> str:
    """A heading unique to the subject and mode: every field that tells records apart."""
    cfg = record["config"]
    parts = [f"preset `{cfg['preset']}`" if cfg.get("preset") else None,
             f"batch {cfg['batch']}", cfg["dtype"], precision_label(record)]
    if len(cfg.get("methods") or ()) > 1:
        parts.append("methods " + ", ".join(cfg["methods"]))
    elif cfg.get("method") not in (None, "auto"):
        parts.append(f"method {cfg['method']}")
    if (cfg.get("steps_per_call") or 1) > 1:
        parts.append(f"{cfg['steps_per_call']} steps per call")
    if cfg.get("xla_cpu_flags"):
        parts.append(f"XLA:CPU flags `{cfg['xla_cpu_flags']}`")
    if record.get("mesh"):
        parts.append(f"mesh {mesh_label(record['mesh']['shape'])} {record['mesh']['strategy']}")
    return f"### {cfg['arch']} {mode}: " + ", ".join(p for p in parts if p)


def _anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading (lower case, punctuation dropped)."""
    return re.sub(r"[^\w\- ]", "", heading.lstrip("# ").lower()).replace(" ", "-")


def summary_table(shown: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """One row per architecture, shape and mode of the plain runs (no method sweep, no XLA
    flags, one step per call): each library's fastest style as a ratio to the fastest row."""
    impls = tuple(IMPLS)
    lines = ["| arch | shape | mode | " + " | ".join(impls) + " | fastest | host |",
             "|---|---|---|" + "---:|" * len(impls) + "---|---|"]
    plain = [(p, r) for p, r in shown if r["kind"] == "model" and not _is_sweep(r)]
    plain.sort(key=_model_order)
    for _, rec in plain:
        cfg = rec["config"]
        for mode in cfg["modes"]:
            rows = [r for r in rec["results"] if r["mode"] == mode and r["time"].get("median_s")]
            if not rows:
                continue
            fastest = min(rows, key=lambda r: r["time"]["median_s"])
            best = {i: min((r["time"]["median_s"] for r in rows if r["impl"] == i), default=None)
                    for i in impls}
            cells = [f"{best[i] / fastest['time']['median_s']:.2f}" if best[i] else "-"
                     for i in impls]
            shape = (f"`{cfg['preset']}`, " if cfg.get("preset") else "") + f"b{cfg['batch']}"
            lines.append(f"| {cfg['arch']} | {shape} | {mode} | " + " | ".join(cells)
                         + f" | {fastest['impl']} {call_label(fastest)} "
                           f"{fmt_time(fastest['time']['median_s'])} | {_load_text(rec)} |")
    return lines


def _is_sweep(record: dict[str, Any]) -> bool:
    """A method comparison, an XLA-flag preset, fused steps or a device mesh: shown after the
    plain runs."""
    cfg = record["config"]
    return bool(len(cfg.get("methods") or ()) > 1 or cfg.get("xla_cpu_flags")
                or (cfg.get("steps_per_call") or 1) > 1 or record.get("mesh"))


def _model_order(pr: tuple[str, dict[str, Any]]) -> tuple[Any, ...]:
    arch = pr[1]["config"]["arch"]
    archs = list(bench_archs())  # the registry's order, then the bench-only subjects
    return (_is_sweep(pr[1]), archs.index(arch) if arch in archs else len(archs), arch,
            subject(pr[1]))


def render(results_dir: str, readme: str, plots_dir: str) -> str:
    """bench/README.md: a summary, then the newest idle record of each subject (loaded ones
    marked), then links to the superseded records."""
    records = load_records(results_dir)
    if not records:
        raise FileNotFoundError(f"no benchmark records (*.json) under {results_dir}/")
    here = os.path.dirname(os.path.abspath(readme))
    plots_rel = os.path.relpath(plots_dir, here)
    os.makedirs(plots_dir, exist_ok=True)
    shown, older = latest_per_subject(records)
    lines = ["# Benchmark results", "",
             "Generated by `python -m zoo.bench report` from the JSON records in "
             "`bench/results/<device>/`; do not edit by hand. How to run, what each column "
             "means, the fairness check and the conclusions: "
             "[docs/benchmarks.md](../docs/benchmarks.md).", "",
             "Every model table passed the fairness check (same weights, outputs within the "
             "precision policy's tolerance, FLOPs within 1%) before it was timed. Each subject "
             "shows its newest record taken on an idle host (1-minute load average at most the "
             "core count); a subject with only loaded records shows the newest, marked "
             "**loaded**: its times are unreliable. Superseded records are listed at the end.",
             ""]
    for slug in sorted({r["device"]["slug"] for _, r in shown}):
        recs = [(p, r) for p, r in shown if r["device"]["slug"] == slug]
        first = recs[0][1]
        dev = first["device"]
        peak = dev.get("peak") or {}
        name = slug if dev["name"].lower() == slug else f"{slug}: {dev['name']}"
        lines += [f"## {name} ({dev.get('host_cpu')}, {dev.get('host_cores')} host cores)", "",
                  "### Summary", "",
                  "Each library's fastest call style, as a ratio to the fastest row of the same "
                  "run (1.00 = fastest; lower is better).", "", *summary_table(recs), "",
                  f"Versions: {_versions(first)}.", ""]
        if peak:
            lines += [f"Peak used for shares: {peak['name']}, "
                      + ", ".join(f"{k} {v:.3g} TFLOP/s" for k, v in peak["tflops"].items())
                      + f", {peak['gbps']:g} GB/s"
                      + (f" ({peak['note']})" if peak.get("note") else "") + ".", ""]
        sections: list[str] = []
        contents = ["Records shown below:", ""]
        for path, rec in recs:
            if rec["kind"] != "dispatch":
                continue
            png = f"{slug}-dispatch.png"
            plot_dispatch(rec, os.path.join(plots_dir, png))
            contents.append("- [Dispatch overhead](#dispatch-overhead)")
            sections += ["### Dispatch overhead", "",
                         "µs per call (median of per-call times, each call waited for); "
                         "× floor: ratio to a raw `jax.jit` on pre-flattened arrays of a "
                         "hand-written program; × own: ratio to the library's own compiled "
                         "program called the same raw way (isolates dispatch from program "
                         f"differences). {_conditions(rec)} ({_load_text(rec)}) "
                         f"Record: `{os.path.relpath(path, here)}`.", "",
                         *to_markdown(dispatch_table(rec)), "",
                         f"![dispatch overhead]({plots_rel}/{png})", ""]
        for path, rec in sorted((pr for pr in recs if pr[1]["kind"] == "model"),
                                key=_model_order):
            cfg = rec["config"]
            for mode in cfg["modes"]:
                png = f"{slug}-{subject(rec)}-{mode}.png"
                plot_model(rec, mode, os.path.join(plots_dir, png))
                shape = "x".join(str(d) for d in cfg["input_shape"])
                heading = _heading(rec, mode) + (" (loaded)" if is_loaded(rec) else "")
                contents.append(f"- [{heading.lstrip('# ').replace('`', '')}]"
                                f"(#{_anchor(heading)})")
                sections += [heading, "",
                             f"Input {shape} (canonical NC...), config "
                             f"`{json.dumps(_shown_config(rec), sort_keys=True)}`. "
                             f"{_roofline_text(rec, mode)}{_conditions(rec)} "
                             f"Taken {rec.get('timestamp', '?')}, {_load_text(rec)}. Record: "
                             f"`{os.path.relpath(path, here)}`.", "",
                             *to_markdown(model_table(rec, mode, wide=True)), "",
                             *([mesh_note(rec), ""] if rec.get("mesh") else []),
                             f"![{cfg['arch']} {mode}]({plots_rel}/{png})", ""]
        lines += [*contents, "", *sections]
    if older:
        lines += ["## Superseded records", "",
                  "Older or loaded records of the subjects above, kept for reference.", ""]
        for path, rec in sorted(older, key=lambda pr: (subject(pr[1]), pr[0])):
            rel = os.path.relpath(path, here)
            lines.append(f"- [`{os.path.basename(path)}`]({rel}): {subject(rec)}, "
                         f"taken {rec.get('timestamp', '?')}, {_load_text(rec)}")
        lines.append("")
    text = "\n".join(lines).rstrip() + "\n"
    with open(readme, "w") as f:
        f.write(text)
    return text


def report_main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m zoo.bench report", description=__doc__)
    p.add_argument("--results", default=os.path.join("bench", "results"))
    p.add_argument("--readme", default=os.path.join("bench", "README.md"))
    p.add_argument("--plots", default=os.path.join("bench", "plots"))
    args = p.parse_args(argv)
    try:
        render(args.results, args.readme, args.plots)
    except FileNotFoundError as e:
        p.error(f"{e}; nothing written")
    print(f"wrote {args.readme} and plots in {args.plots}/")
    return 0
