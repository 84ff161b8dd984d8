"""The model catalogue and the command-line reference, generated from the registry.

    python -m zoo.docs.catalogue            # write docs/catalogue/*.md, docs/reference/cli.md
    python -m zoo.docs.catalogue --check    # exit 1, naming the stale pages, if out of date
    python -m zoo.docs.catalogue --recount  # count every model's figures again

One page per architecture: every name `zoo.list_models()` gives for it, with its parameter
count, forward FLOPs, input size, pretrained tags (`zoo/weights/pretrained/data/tags.json`), the
libraries it is registered in, the references it is tested against (its config's
`REFERENCES`) and the benchmark ratios of its records (`bench/results/`). Parameters are
counted on the canonical spec of the abstract skeleton (no weights; statistics left out, a
tied array once); FLOPs are XLA's cost analysis of the forward pass at batch 1, lowered from
abstract shapes (nothing is compiled or run). Both are kept in `docs/catalogue/figures.json`
beside the config they were counted for: a config that changed is counted again.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canonical import KINDS

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "docs" / "catalogue"
FIGURES = PAGES / "figures.json"
CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
RESULTS = ROOT / "bench" / "results"
COMMAND = "python -m zoo.docs.catalogue"
# Every architecture's own tests: its libraries against each other and against its PyTorch
# model (the outside references are each config's REFERENCES).
COMMON_TESTS = {
    "the zoo's other JAX libraries: converted weights, the same model, bitwise":
        "tests/test_equivalence.py",
    "the zoo's PyTorch model: outputs and gradients": "tests/test_torch_reference.py",
}
# The command lines whose --help the CLI page shows: (module, arguments before --help).
CLIS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("zoo.bench", ()), *(("zoo.bench", (c,)) for c in (
        "dispatch", "report", "presets", "xla-flags", "convert", "breakdown", "xla-cpu", "gpu",
        "matrix", "partition")),
    ("converters", ()), ("converters", ("convert",)), ("converters", ("inspect",)),
    ("zoo.weights.pretrained.generate", ()), ("zoo.docs.catalogue", ()),
)
MAINS = {"zoo.bench": "zoo.bench.cli:main", "converters": "converters.__main__:main",
         "zoo.weights.pretrained.generate": "zoo.weights.pretrained.generate:main",
         "zoo.docs.catalogue": "zoo.docs.catalogue:main"}


# --------------------------------------------------------------------------- figures
def parameter_count(config: Any) -> int:
    """Trainable parameters of `config`: its canonical spec without the statistics."""
    from zoo.registry import schema

    layers, spec = schema(config)
    buffers = {f"{layer.name}.{b}" for layer in layers for b in KINDS[layer.kind].buffers}
    return sum(math.prod(v.shape) for k, v in spec.items() if k not in buffers)


def forward_flops(config: Any) -> float | None:
    """XLA's FLOP count of one forward pass at batch 1, from the program lowered on abstract
    shapes; None for a program with a loop (XLA counts a loop's body once)."""
    import jax

    from zoo.bench.flops import parse
    from zoo.libraries import interface
    from zoo.registry import abstract_input, reference_impl, skeleton

    impl = reference_impl(config)
    api = interface(impl)
    static, params, state = api.split(skeleton(config, impl))
    x = abstract_input(config, impl, 1)
    lowered = jax.jit(lambda p, s, x: api.apply(static, p, s, x)[0]).lower(params, state, x)
    if "while" in lowered.as_text():
        return None
    return parse(lowered.cost_analysis())[0]


def figures(models: dict[str, Any], known: dict[str, Any], recount: bool = False
            ) -> dict[str, Any]:
    """{name: {"config", "params", "flops"}} of every model, taken from `known` where its
    config is the one counted there."""
    out = {}
    for name, config in models.items():
        entry = known.get(name)
        if recount or entry is None or entry["config"] != config.to_json():
            entry = {"config": config.to_json(), "params": parameter_count(config),
                     "flops": forward_flops(config)}
        out[name] = entry
    return out


# --------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Family:
    """One architecture and what the catalogue says of it."""

    arch: str
    config: type
    impls: tuple[str, ...]
    models: dict[str, Any]  # name -> config, the architecture's own name first


def families() -> list[Family]:
    """Every registered architecture with its named models, in the registry's order."""
    import zoo
    from zoo.names import named_models

    named = named_models()
    out = []
    for arch in zoo.ARCHS:
        cls = zoo.architecture(arch).config
        names = [arch, *sorted((n for n, (a, _) in named.items() if a == arch), key=_natural)]
        impls = tuple(i for a, i in zoo.list_implementations() if a == arch)
        out.append(Family(arch, cls, impls, {n: zoo.make_config(n) for n in names}))
    return out


def _natural(name: str) -> tuple[Any, ...]:
    """Sort key: digit runs as numbers (resnet18 before resnet101)."""
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


# --------------------------------------------------------------------------- formatting
def _si(value: float | None, billion: str = "G") -> str:
    """3 significant digits and a prefix (parameters: "B" for billions, as model names do)."""
    if value is None:
        return "—"
    for scale, prefix in ((1e12, "T"), (1e9, billion), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}"
    return f"{value:.3g}"


def _input(config: Any) -> str:
    shape = config.input_shape
    if not config.CHANNELS:
        return f"{' × '.join(map(str, shape))} tokens"
    return " × ".join(map(str, shape))


def _title(family: Family) -> str:
    doc = (family.config.__doc__ or family.arch).strip()
    return " ".join(doc.split("\n\n")[0].split())


def _tags() -> dict[str, dict[str, Any]]:
    from zoo.weights.pretrained.table import models

    return models()


def _benchmarks(arch: str) -> list[str]:
    """The summary rows of the architecture's newest idle records, or why there are none."""
    from zoo.bench.records import is_loaded
    from zoo.bench.report import latest_per_subject, load_records, summary_table

    records = load_records(str(RESULTS)) if RESULTS.is_dir() else []
    shown, _ = latest_per_subject([(p, r) for p, r in records if r["kind"] == "model"
                                   and r["config"]["arch"] == arch])
    idle = [(p, r) for p, r in shown if not is_loaded(r)]
    if not idle:
        return [f"No benchmark record of `{arch}` taken on an idle host"
                + (f" ({len(shown)} taken under load, left out)" if shown else "")
                + ": [Benchmarking](../benchmarks.md) says how to take one."]
    devices = sorted({r["device"]["slug"] for _, r in idle})
    lines = []
    for slug in devices:
        rows = [(p, r) for p, r in idle if r["device"]["slug"] == slug]
        table = summary_table(rows)[:2]
        table[0] += " record |"
        table[1] += "---|"
        for path, record in sorted(rows, key=lambda pr: pr[0]):
            table += [f"{row} `{Path(path).name}` |" for row in summary_table([(path, record)])[2:]]
        lines += [f"On `{slug}` ({rows[0][1]['device'].get('host_cpu')}): each library's "
                  "fastest call style as a ratio to the fastest (1.00 = fastest); the runs' "
                  "own shapes (presets), not the named models'. All records: "
                  "[Benchmark results](../results/index.md).", "", *table, ""]
    loaded = len(shown) - len(idle)
    if loaded:
        lines.append(f"{loaded} record(s) taken under load left out.")
    return lines


def family_page(family: Family, counted: dict[str, Any], tags: dict[str, Any]) -> str:
    """The Markdown page of one architecture."""
    cls = family.config
    loops = any(counted[n]["flops"] is None for n in family.models)
    lines = [f"# {family.arch}", "", "<!-- generated by python -m zoo.docs.catalogue: "
             "do not edit -->", "", _title(family), "",
             f"Config: `{cls.__module__}.{cls.__name__}`. Libraries: "
             + ", ".join(f"`{i}`" for i in family.impls) + ".", "",
             "## Models", "",
             "Parameters: trainable, from the canonical spec. FLOPs: one forward pass at "
             "batch 1 (XLA's count; a multiply-add is 2), at the input size shown"
             + ("; — where the program loops (XLA counts a loop's body once): the benchmark "
                "records count those" if loops else "") + ".",
             "", "| name | parameters | FLOPs | input | pretrained tags |",
             "|---|---:|---:|---|---|"]
    for name, config in family.models.items():
        fig = counted[name]
        entry = tags.get(name)
        shown_tags = ("—" if entry is None
                      else f"{len(entry['tags'])}, default `{entry['default']}`")
        label = f"`{name}`" + (" (the default config)" if name == family.arch else "")
        lines.append(f"| {label} | {_si(fig['params'], 'B')} | {_si(fig['flops'])} | "
                     f"{_input(config)} | {shown_tags} |")
    lines.append("")
    tagged = [n for n in family.models if n in tags]
    if tagged:
        lines += ["## Pretrained weights", "",
                  "`zoo.create(\"NAME.TAG\", impl, pretrained=True)`; a name without its tag "
                  "means the default tag ([Pretrained weights](../pretrained.md)).", "",
                  "| model | Hub repository | library | classes | input |",
                  "|---|---|---|---:|---|"]
        for name in tagged:
            for tag, fields in tags[name]["tags"].items():
                size = fields.get("input_size")
                lines.append(f"| `{name}.{tag}` | `{fields['hub']}` | {fields['library']} | "
                             f"{fields.get('num_classes') or '—'} | "
                             f"{' × '.join(map(str, size)) if size else '—'} |")
        lines.append("")
    refs = {**getattr(cls, "REFERENCES", {}), **COMMON_TESTS}
    lines += ["## Tested against", "", "| reference | test |", "|---|---|",
              *(f"| {ref} | `{test}` |" for ref, test in refs.items()), "",
              "## Benchmarks", "", *_benchmarks(family.arch)]
    return "\n".join(lines).rstrip() + "\n"


def index_page(fams: list[Family], counted: dict[str, Any], tags: dict[str, Any]) -> str:
    lines = ["# Model catalogue", "", "<!-- generated by python -m zoo.docs.catalogue: "
             "do not edit -->", "",
             "Every model `zoo.create` builds by name, generated from the registry "
             "(`zoo.list_models()`, `zoo.list_implementations()`, the pretrained tag table). "
             f"{sum(len(f.models) for f in fams)} names in {len(fams)} architectures, "
             f"{sum(len(v['tags']) for v in tags.values())} pretrained tags.", "",
             "| architecture | names | pretrained | parameters | libraries |",
             "|---|---:|---:|---|---|"]
    for fam in fams:
        params = [counted[n]["params"] for n in fam.models]
        low, high = _si(min(params), "B"), _si(max(params), "B")
        span = low if low == high else f"{low} – {high}"
        ntags = sum(len(tags[n]["tags"]) for n in fam.models if n in tags)
        lines.append(f"| [{fam.arch}]({fam.arch}.md) | {len(fam.models)} | {ntags or '—'} | "
                     f"{span} | {', '.join(fam.impls)} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the CLI page
def _call(target: str) -> Callable[[list[str]], Any]:
    import importlib

    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def help_text(module: str, args: tuple[str, ...]) -> str:
    """What `python -m module *args --help` prints, 80 columns wide."""
    out = io.StringIO()
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            _call(MAINS[module])([*args, "--help"])
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return out.getvalue().rstrip()


def cli_page() -> str:
    lines = ["# Command lines", "", "<!-- generated by python -m zoo.docs.catalogue: "
             "do not edit -->", "",
             "Every command's `--help`, as it prints it. The guides show them at work: "
             "[Benchmarking](../benchmarks.md), [Checkpoints](../checkpoints.md).", ""]
    for module, args in CLIS:
        lines += [f"## `python -m {' '.join((module, *args))}`", "", "```text",
                  help_text(module, args), "```", ""]
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------- writing
def render(recount: bool = False) -> dict[Path, str]:
    """Every generated file: path -> text."""
    import zoo  # noqa: F401  (registers every architecture)

    fams = families()
    known = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    counted = figures({n: c for f in fams for n, c in f.models.items()}, known, recount)
    tags = _tags()
    out = {PAGES / "index.md": index_page(fams, counted, tags)}
    out |= {PAGES / f"{f.arch}.md": family_page(f, counted, tags) for f in fams}
    out[FIGURES] = json.dumps(counted, indent=1, sort_keys=True) + "\n"
    out[CLI_PAGE] = cli_page()
    return out


def stale(files: dict[Path, str]) -> list[str]:
    """The generated files that differ from the committed ones, and those no longer made."""
    out = [str(p.relative_to(ROOT)) for p, text in files.items()
           if not p.exists() or p.read_text() != text]
    out += [f"{p.relative_to(ROOT)} (no longer generated)" for p in sorted(PAGES.glob("*"))
            if p not in files]
    return out


def main(argv: list[str] | None = None) -> int:
    from zoo.arguments import ArgumentParser

    parser = ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed pages instead of writing them")
    parser.add_argument("--recount", action="store_true",
                        help="count every model's parameters and FLOPs again (minutes)")
    args = parser.parse_args(argv)
    files = render(args.recount)
    differ = stale(files)
    if args.check:
        if differ:
            print(f"stale: {', '.join(differ)}; run `{COMMAND}`", file=sys.stderr)
            return 1
        print(f"the {len(files)} generated files are up to date")
        return 0
    for path in differ:
        full = ROOT / path.split(" ")[0]
        if full in files:
            full.parent.mkdir(parents=True, exist_ok=True)
            full.write_text(files[full])
        else:
            full.unlink()
        print(f"{'wrote' if full in files else 'removed'} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
