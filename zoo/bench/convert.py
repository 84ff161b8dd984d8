"""`python -m zoo.bench convert`: checkpoint conversion at realistic sizes, against the by-hand
floor of the same run.

For each size a ViT checkpoint of random float32 weights is generated as PyTorch safetensors,
tensor by tensor (the benchmark itself never holds a checkpoint). Every conversion (each source
x target format; the other sources are the first conversions' outputs) runs as
``python -m converters convert`` in a fresh subprocess, recording wall time, peak RSS (the
child's own ``wait4`` rusage) and bytes written. The floors run the same way:
``safetensors.numpy.load_file`` + ``save_file``, ``load_file`` + orbax
``StandardCheckpointer().save``, and, for an orbax source, ``StandardCheckpointer().restore``
+ ``save_file`` (a conversion is compared with its source's reading floor where it has one,
else with its target's). Targets (issue 25): peak RSS <= 1.25 x checkpoint + 0.5 GB,
wall <= 1.5 x the floor of the target's kind. Every generated file is deleted at the end.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zoo.arguments import ArgumentParser
from zoo.bench.records import record_base
from zoo.names import make_config
from zoo.registry import schema

GB = 10**9
RSS_FACTOR, RSS_SLACK, WALL_FACTOR = 1.25, 0.5 * GB, 1.5
SIZES: dict[str, dict[str, Any]] = {  # name -> ViT config (ViT-H/14: 632 M parameters)
    "vit-tiny": {"width": 64, "depth": 2, "num_heads": 2, "patch_size": 16},  # for the tests
    "vit-b": {"width": 768, "depth": 12, "num_heads": 12, "patch_size": 16},
    "vit-l": {"width": 1024, "depth": 24, "num_heads": 16, "patch_size": 16},
    "vit-h": {"width": 1280, "depth": 32, "num_heads": 16, "patch_size": 14},
}


@dataclass(frozen=True)
class Fmt:
    """A checkpoint format as the benchmark writes it: `--to`, the file name, and the floor
    (by-hand copy) its conversions are compared with."""

    to: str
    name: str
    floor: str
    sharded: bool = False
    read_floor: str | None = None  # the by-hand reading of it, where that is its own kind


FORMATS = {
    "safetensors": Fmt("torch", "m.safetensors", "safetensors"),
    "sharded": Fmt("torch", "m_shards", "safetensors", sharded=True),
    "pt": Fmt("torch", "m.pt", "safetensors"),
    "canonical": Fmt("canonical", "m_canonical.safetensors", "safetensors"),
    "eqx": Fmt("eqx", "m.eqx", "safetensors"),
    "nnx": Fmt("nnx", "m_nnx", "orbax", read_floor="orbax-read"),
    "linen": Fmt("linen", "m_linen", "orbax", read_floor="orbax-read"),
}
FLOORS = {  # the by-hand conversion each floor times (argv: SRC DST)
    "safetensors": "from safetensors.numpy import load_file, save_file\n"
                   "import sys\nsave_file(load_file(sys.argv[1]), sys.argv[2])",
    "orbax": "from safetensors.numpy import load_file\nimport sys\n"
             "import orbax.checkpoint as ocp\n"
             "with ocp.StandardCheckpointer() as c:\n"
             "    c.save(__import__('os').path.abspath(sys.argv[2]), load_file(sys.argv[1]))\n"
             "    c.wait_until_finished()",
    "orbax-read": "import os, sys\nimport jax\nimport numpy as np\n"
                  "import orbax.checkpoint as ocp\nfrom safetensors.numpy import save_file\n"
                  "with ocp.StandardCheckpointer() as c:\n"
                  "    tree = c.restore(os.path.abspath(sys.argv[1]))\n"
                  "flat = jax.tree_util.tree_flatten_with_path(tree)[0]\n"
                  "save_file({jax.tree_util.keystr(p): np.asarray(a) for p, a in flat}, "
                  "sys.argv[2])",
}


class Generated:
    """A random float32 array made when it is written (shape and dtype known before)."""

    def __init__(self, shape: tuple[int, ...], seed: int):
        self.shape, self.dtype, self.seed = tuple(shape), np.dtype(np.float32), seed

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = np.random.default_rng(self.seed).random(self.shape, np.float32) - 0.5
        return a if dtype is None else a.astype(dtype)


def generate(config: Any, path: Path) -> int:
    """Write a random float32 checkpoint of `config` as PyTorch safetensors, one tensor at a
    time (the header first: every shape is known); its size in bytes."""

    spec = schema(config)[1]
    arrays = [Generated(s.shape, i) for i, s in enumerate(spec.values())]
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, a in zip(spec, arrays, strict=True):
        size = math.prod(a.shape) * 4
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        total = f.write(len(raw).to_bytes(8, "little") + raw)
        for a in arrays:
            total += f.write(np.asarray(a).tobytes())
    return total


def disk_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.exists() else 0


# Linux carries a parent's peak RSS into a forked child's `ru_maxrss` (kept across exec):
# a small launcher forks the measured command, so only the command's own peak is counted.
LAUNCHER = ("import os, subprocess, sys\n"
            "child = subprocess.Popen(sys.argv[2:])\n"
            "_, status, usage = os.wait4(child.pid, 0)\n"
            "child.returncode = os.waitstatus_to_exitcode(status)\n"
            "open(sys.argv[1], 'w').write(f'{usage.ru_maxrss} {child.returncode}')\n")


def measure(argv: list[str]) -> dict[str, Any]:
    """Run `argv` in a fresh process: wall seconds, its own peak RSS, exit status."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        report, errors = Path(tmp) / "usage", Path(tmp) / "stderr"
        with open(errors, "wb") as err:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", LAUNCHER, str(report), *argv], env=env,
                           stdout=subprocess.DEVNULL, stderr=err, check=False)
            wall = time.perf_counter() - start
        maxrss_kb, rc = (int(x) for x in report.read_text().split())
        tail = errors.read_text(errors="replace").strip().splitlines()[-1:] if rc else []
    return {"wall_s": round(wall, 3), "peak_rss_bytes": maxrss_kb * 1024, "rc": rc,
            "error": tail[0] if tail else None}


@dataclass
class Run:
    """One size's conversions, in a scratch folder."""

    size: str
    config: Any
    work: Path
    checkpoint_bytes: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    floors: dict[str, dict[str, Any]] = field(default_factory=dict)

    def convert(self, source: str, target: str, src: Path) -> Path:
        fmt, floor = FORMATS[target], FORMATS[source].read_floor or FORMATS[target].floor
        dst = self.work / f"{source}-to-{fmt.name}"
        argv = [sys.executable, "-m", "converters", "convert", str(src), str(dst), "--to",
                fmt.to, "--config", self.config.to_json(), "--no-progress"]
        if fmt.sharded:
            argv += ["--shard-size", str(math.ceil(self.checkpoint_bytes / 3))]
        row = {"source": source, "target": target, **measure(argv),
               "bytes_written": disk_bytes(dst), "floor": floor}
        self.rows.append(row)
        return dst

    def floor(self, name: str, src: Path) -> None:
        dst = self.work / f"floor-{name}"
        self.floors[name] = {**measure([sys.executable, "-c", FLOORS[name], str(src),
                                        str(dst)]), "bytes_written": disk_bytes(dst)}
        remove(dst)

    def judged(self) -> list[dict[str, Any]]:
        """The rows with their ratios and whether each meets both targets."""
        size, out = self.checkpoint_bytes, []
        for row in self.rows:
            floor = self.floors.get(row["floor"], {}).get("wall_s")
            rss_limit = RSS_FACTOR * size + RSS_SLACK
            wall_ratio = round(row["wall_s"] / floor, 2) if floor else None
            out.append({**row, "rss_ratio": round(row["peak_rss_bytes"] / size, 2),
                        "wall_ratio": wall_ratio, "rss_ok": row["peak_rss_bytes"] <= rss_limit,
                        "wall_ok": wall_ratio is not None and wall_ratio <= WALL_FACTOR})
        return out


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def run_size(size: str, sources: list[str], targets: list[str], scratch: Path,
             log: Any, back_only: bool = False) -> dict[str, Any]:
    config = make_config("vit", **SIZES[size])
    work = Path(tempfile.mkdtemp(prefix=f"zoo-convert-{size}-", dir=scratch))
    run = Run(size, config, work)
    try:
        src = work / "gen.safetensors"
        run.checkpoint_bytes = generate(config, src)
        log(f"{size}: {run.checkpoint_bytes / GB:.2f} GB generated")
        for name in dict.fromkeys(FORMATS[t].floor for t in targets):
            run.floor(name, src)
            log(f"  floor {name}: {run.floors[name]}")
        made = {"safetensors": src}
        for target in targets:
            made[target] = run.convert("safetensors", target, src)
            log(f"  safetensors -> {target}: {run.rows[-1]}")
        for source in sources:
            if source == "safetensors" or source not in made:
                continue
            floor = FORMATS[source].read_floor
            if floor is not None and floor not in run.floors:
                run.floor(floor, made[source])
                log(f"  floor {floor}: {run.floors[floor]}")
            for target in ["safetensors"] if back_only else targets:
                if target != source:
                    remove(run.convert(source, target, made[source]))
                    log(f"  {source} -> {target}: {run.rows[-1]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"size": size, "config": config.to_dict(), "checkpoint_bytes": run.checkpoint_bytes,
            "floors": run.floors, "rows": run.judged()}


def markdown(record: dict[str, Any]) -> str:
    """The record as the table of docs/investigations/conversion.md (ratios: the machine may
    be loaded)."""
    lines = ["| size | source | target | wall / floor | peak RSS / checkpoint | meets RSS | "
             "meets wall |", "|---|---|---|---:|---:|:-:|:-:|"]
    for s in record["sizes"]:
        for name, f in s["floors"].items():
            lines.append(f"| {s['size']} | floor: {name} | | 1.00 | "
                         f"{f['peak_rss_bytes'] / s['checkpoint_bytes']:.2f} | | |")
        for r in s["rows"]:
            wall = "failed" if r["rc"] else f"{r['wall_ratio']:.2f}"
            lines.append(f"| {s['size']} | {r['source']} | {r['target']} | {wall} | "
                         f"{r['rss_ratio']:.2f} | {'yes' if r['rss_ok'] else 'no'} | "
                         f"{'yes' if r['wall_ok'] else 'no'} |")
    return "\n".join(lines)


def _names(text: str, known: dict[str, Any], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ValueError(f"--{what} {text!r}: unknown {bad}; choose from {', '.join(known)}")
    return names


def convert_main(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m zoo.bench convert", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="vit-b,vit-l", help=f"comma list of {', '.join(SIZES)}")
    p.add_argument("--sources", default=",".join(FORMATS), help="source formats")
    p.add_argument("--targets", default=",".join(FORMATS), help="target formats")
    p.add_argument("--scratch", default=tempfile.gettempdir(), metavar="DIR",
                   help="where the checkpoints are generated (deleted after each size)")
    p.add_argument("--back-only", action="store_true",
                   help="convert the other sources back to safetensors only (not to every "
                        "target): 2n pairs instead of n^2, for the big sizes")
    p.add_argument("--json", metavar="PATH", help="write the record here")
    p.add_argument("--markdown", action="store_true", help="print the docs table")
    args = p.parse_args(argv)
    try:
        sizes = _names(args.sizes, SIZES, "sizes")
        sources = _names(args.sources, FORMATS, "sources")
        targets = _names(args.targets, FORMATS, "targets")
    except ValueError as e:
        p.error(str(e))
    if not os.path.isdir(args.scratch):
        p.error(f"--scratch {args.scratch}: no such folder")
    record = record_base("convert")
    record["targets"] = {"rss": f"<= {RSS_FACTOR} x checkpoint + {RSS_SLACK / GB} GB",
                         "wall": f"<= {WALL_FACTOR} x floor"}
    record["sizes"] = []
    for size in sizes:
        record["sizes"].append(run_size(size, sources, targets, Path(args.scratch),
                                        lambda m: print(m, flush=True), args.back_only))
        if args.json:  # kept up to date: a long run leaves what it measured
            Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    record["host_load_avg_end"] = list(os.getloadavg())
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    if args.markdown:
        print(markdown(record))
    return 0
