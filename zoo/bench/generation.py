"""The language models' `prefill` and `decode` modes: tokens per second of the prompt and
milliseconds per new token, per library and call style, against PyTorch eager (the zoo's
reference and `transformers`' own `generate`, same weights) and the memory-bandwidth floor.

- **Precision**: the run computes at `--precision` (`zoo.runtime.precision.use`; the record states
it and the dots' precision in the timed decode step's program).
- **Fairness first**: the prompt's last logits of every library within `logits_bound` of the
  reference's (the policy's bound for the format the arithmetic runs in: full float32, TF32 or
  bfloat16), and the same greedy tokens everywhere (`transformers` included), but where two
  logits of the first JAX library are within that bound of each other (a near-tie its
  rounding may decide either way: each such position and both logits are in the record's
  `near_ties`); else `FairnessError`, nothing timed.
- **Timing**: a whole `generate` of 1, of `base_tokens(new)` and of `new` greedy tokens (no
  EOS), medians of `repeat` runs each after a warm-up call; prefill is the first
  (`batch * prompt` tokens), a decode step `(t(new) - t(base)) / (new - base)`: both programs
  hold the loop, so the work a loop program does once per call (XLA hoists the weights'
  conversions and layouts out of the loop: each call converts them) is not charged to the
  steps; it is the record's `loop_setup_s` (`t(base) - t(1)` less its steps). Compile time
  is the first calls' excess.
- **Floor**: a decode step reads every weight and the cache's keys and values once; their
  bytes (the cache at its mean length over the run) over the copy bandwidth measured in the
  run (`copy_bandwidth`, read plus write traffic of a large copy, the faster of one before and
  one after the timing) is the time no style beats.

Call styles of the JAX libraries (`zoo.runtime.generation.loop`): `loop` (the whole loop compiled,
`zoo.generate`'s default, timed by default: the fastest for Equinox and within 10% of the
fastest for Linen and NNX in the GPT-2 124M record),
`python` (a jitted step per token), `flat` (the same on the weights' flat leaves); `--call all`
times the three.
"""

from __future__ import annotations

import os
import re
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

import zoo
from zoo.bench.fairness import FairnessError
from zoo.bench.options import parse_impls
from zoo.bench.presets import PresetError, find_preset
from zoo.bench.records import record_base, write_json
from zoo.bench.subjects import build_config, build_models
from zoo.libraries import library
from zoo.runtime import precision as policy
from zoo.runtime.generation import Settings
from zoo.runtime.generation.loop import Generator
from zoo.weights.loading import hub_config

MODES = ("prefill", "decode")
STYLES = {"loop": "compiled", "python": "python", "flat": "flat"}
FASTEST = ("loop",)  # the style timed by default (`--call all`: every one)
PROMPT, NEW = 32, 32  # default tokens, when the model's positions hold them
COPY_BYTES = 256 * 2**20


@dataclass(frozen=True)
class GenerationRun:
    """One run's shape: `prompt` tokens of `batch` sequences, `new` greedy tokens; the JAX
    call `styles` timed, at `precision`."""

    arch: str
    impls: tuple[str, ...]
    overrides: dict[str, Any]
    batch: int = 1
    prompt: int = 32
    new: int = 32
    repeat: int = 3
    seed: int = 0
    dtype: str = "float32"
    hf: bool = True  # also time transformers' generate
    preset: str | None = None
    styles: tuple[str, ...] = FASTEST
    precision: str = "default"

    @property
    def name(self) -> str:
        """The record's file name."""
        prec = "" if self.precision == "default" else f"-{self.precision}"
        return (f"{self.arch}-{self.preset or f'b{self.batch}'}-b{self.batch}-{self.dtype}-"
                f"p{self.prompt}-n{self.new}{prec}-generation.json")


def copy_bandwidth(nbytes: int = COPY_BYTES, repeat: int = 5) -> float:
    """Bytes per second moved (read plus written) by the fastest large copy: NumPy's, and
    PyTorch's (threaded) when installed."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    copies: list[Callable[[], Any]] = [lambda: np.copyto(dst, src)]
    try:
        import torch

        s, d = torch.from_numpy(src), torch.from_numpy(dst)
        copies.append(lambda: d.copy_(s))
    except ImportError:
        pass
    best = min(_median([_seconds(c) for _ in range(repeat)]) for c in copies)
    return 2 * nbytes / best


def _seconds(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    out = fn()
    jax.block_until_ready(out) if not hasattr(out, "numpy") else None
    return time.perf_counter() - start


def _median(values: list[float]) -> float:
    return float(np.median(values))


def _nbytes(tree: Any) -> int:
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def _hf_model(config: Any, torch_model: Any) -> Any:
    """`transformers`' model of `config` holding the zoo reference's weights, in their dtype."""
    import transformers

    transformers.logging.set_verbosity_error()
    hf_config = transformers.AutoConfig.for_model(**hub_config(config))
    model = transformers.AutoModelForCausalLM.from_config(hf_config,
                                                          attn_implementation="eager")
    model = model.to(next(torch_model.parameters()).dtype)  # bfloat16 runs too
    missing, unexpected = model.load_state_dict(torch_model.state_dict(), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise FairnessError([f"transformers' model does not take the zoo's weights: missing "
                             f"{missing}, unexpected {unexpected}"], {})
    model.tie_weights()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


def base_tokens(new: int) -> int:
    """The shorter generation a decode step is timed against: half of `new`, at least 3 tokens
    (a loop of two steps; XLA removes a loop of one, and the work it hoists with it), else 1
    (`new` below 6: the step then carries the loop's per-call work)."""
    return new // 2 if new // 2 >= 3 else 1


class _Timed:
    """One (library, style): `generate(n)` runs a whole greedy generation of `n` tokens."""

    def __init__(self, impl: str, style: str, generate: Callable[[int], Any]) -> None:
        self.impl, self.style, self.generate = impl, style, generate
        self.first: dict[int, float] = {}

    def output(self, n: int) -> np.ndarray:
        """The tokens of a first call (compiling), its time kept."""
        start = time.perf_counter()
        out = np.asarray(self.generate(n))
        self.first[n] = time.perf_counter() - start
        return out

    def measure(self, run: GenerationRun) -> dict[str, Any]:
        base = base_tokens(run.new)
        lengths = sorted({1, base, run.new})
        for n in lengths:
            if n not in self.first:
                self.output(n)
        times = {n: _median([_seconds(lambda n=n: self.generate(n)) for _ in range(run.repeat)])
                 for n in lengths}
        steps, spent = run.new - base, times[run.new] - times[base]
        decode = spent / max(steps, 1)
        return {"impl": self.impl, "style": self.style, "prefill_s": times[1],
                "generate_s": times[run.new], "decode_s": decode, "decode_from": base,
                "loop_setup_s": (times[base] - times[1] - (base - 1) * decode
                                 if base > 1 else None),
                "compile_s": sum(max(self.first[n] - times[n], 0) for n in lengths),
                "prefill_tokens_per_s": run.batch * run.prompt / times[1],
                "decode_tokens_per_s": run.batch * steps / spent if spent > 0 else None}


def _jax_styles(impl: str, model: Any, ids: np.ndarray, mask: np.ndarray,
                run: GenerationRun) -> tuple[list[_Timed], dict[str, Any], list[str]]:
    """The timed styles, the weights' and cache's bytes, and the precisions of the dots in
    the decode step's program."""
    api = zoo.interface(impl)
    gens = {n: Generator(api.decoding(model, run.batch, run.prompt + run.new),
                         Settings(max_new_tokens=n))
            for n in {1, base_tokens(run.new), run.new}}
    timed = [_Timed(impl, name, lambda n, s=STYLES[name]: gens[n](ids, mask, s))
             for name in run.styles]
    gen = gens[run.new]
    p = gen.prepared
    slots = np.zeros((run.batch, p.max_length), np.int32)
    state = jax.eval_shape(gen._prefill, p.weights, p.cache, ids, slots, jax.random.key(0))
    return (timed, {"weights": _nbytes(p.weights), "cache": _nbytes(p.cache)},
            dot_precisions(gen.step.lower(p.weights, state).as_text()))


def dot_precisions(stablehlo: str) -> list[str]:
    """The precisions of the dots in a lowered program's text (`DEFAULT` where none is
    given), sorted: what `--precision` made of it."""
    found = set()
    for line in stablehlo.splitlines():
        if "dot_general" in line:
            config = re.search(r"precision = \[(\w+), (\w+)\]", line)
            found.update(config.groups() if config else ("DEFAULT",))
    return sorted(found)


def logits_bound(dtype: str, precision: str, backend: str | None = None) -> float:
    """The largest prompt-logits difference allowed (max |a - b| / max |reference|): the
    precision policy's for the format `dtype` computes in at `precision` on `backend`
    (default: JAX's)."""
    return policy.tolerance(dtype, precision, kind="max_relative", backend=backend)


def _torch_styles(impl: str, model: Any, hf: Any, ids: np.ndarray, mask: np.ndarray,
                  run: GenerationRun) -> list[_Timed]:
    import torch

    tids, tmask = torch.from_numpy(ids).long(), torch.from_numpy(mask).long()

    def transformers_generate(n: int) -> Any:
        with torch.no_grad():
            return hf.generate(tids, attention_mask=tmask, max_new_tokens=n, min_new_tokens=n,
                               do_sample=False)

    timed = [_Timed(impl, "eager", lambda n: zoo.generate(model, impl, ids, mask,
                                                           max_new_tokens=n))]
    return timed + ([_Timed(impl, "hf-generate", transformers_generate)] if hf else [])


def _near_ties(outputs: dict[str, np.ndarray], score: Callable[[np.ndarray], np.ndarray],
                bound: float) -> tuple[list[dict[str, Any]], list[str]]:
    """Where a call's greedy tokens leave the first call's: each row's first different token,
    with both tokens' logits in the first call's library on the common prefix (`score`: the
    last position's logits of a `(1, L)` prefix). A flip between two logits within `bound` of
    the largest (max |a - b| / max |logits|) is a near-tie the dtype's rounding may decide
    either way; any other is a problem."""
    name, first = next(iter(outputs.items()))
    ties, problems = [], []
    for k, v in outputs.items():
        if v.shape != first.shape:
            problems.append(f"{k}: {v.shape[1]} tokens, {name} {first.shape[1]}")
            continue
        for row in np.flatnonzero((v != first).any(axis=1)):
            at = int(np.argmax(v[row] != first[row]))
            logits = score(first[row:row + 1, :at])
            a, b = int(first[row, at]), int(v[row, at])
            gap = float(abs(logits[a] - logits[b]) / np.max(np.abs(logits)))
            tie = {"call": k, "row": int(row), "position": at, "tokens": [a, b],
                   "logits": [float(logits[a]), float(logits[b])], "gap_relative": gap}
            ties.append(tie)
            if gap > bound:
                problems.append(f"{k}: greedy tokens differ from {name}'s at position {at} "
                                f"(row {row}), logits {gap:.1e} apart (bound {bound:.1e})")
    return ties, problems


def _fairness(outputs: dict[str, np.ndarray], logits: dict[str, np.ndarray],
              reference: str | None = None, bound: float = logits_bound("float32", "highest"),
              score: Callable[[np.ndarray], np.ndarray] | None = None) -> dict[str, Any]:
    """Prompt logits within `bound` (`logits_bound`) of the `reference`'s (default: the
    first), and the same greedy tokens everywhere; with `score` (see `_near_ties`), tokens
    that part at a near-tie of the first call's logits are reported, not refused."""
    ref_name = reference if reference in logits else next(iter(logits))
    ref = logits[ref_name]
    rel = {k: float(np.max(np.abs(v - ref)) / np.max(np.abs(ref))) for k, v in logits.items()}
    first_name, first = next(iter(outputs.items()))
    if score is None:
        ties = []
        problems = [f"{k}: greedy tokens differ from {first_name}'s"
                    for k, v in outputs.items() if v.shape != first.shape or (v != first).any()]
    else:
        ties, problems = _near_ties(outputs, score, bound)
    problems += [f"{k}: prompt logits {r:.1e} from {ref_name}'s (bound {bound:.1e})"
                 for k, r in rel.items() if r > bound]
    report = {"logits_relative": rel, "reference": ref_name, "bound": bound,
              "same_tokens": not ties and not problems, "near_ties": ties}
    if problems:
        raise FairnessError(problems, report)
    return report


def run_generation(run: GenerationRun, progress: Callable[[str], None] = lambda s: None
                   ) -> dict[str, Any]:
    """Build, check, time at `run.precision`; the run's JSON record (`FairnessError` when the
    libraries do not compute the same thing)."""
    with policy.use(run.precision):
        return _run_generation(run, progress)


def _run_generation(run: GenerationRun, progress: Callable[[str], None]) -> dict[str, Any]:
    load_at_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    progress(f"building {', '.join(run.impls)} ({run.arch}, {run.dtype})")
    config = build_config(run.arch, run.overrides, "auto")
    models = build_models(config, run.impls, run.seed, run.dtype)
    rng = np.random.default_rng(run.seed)
    ids = rng.integers(0, config.vocab_size, (run.batch, run.prompt)).astype(np.int32)
    mask = np.ones_like(ids)
    timed: list[_Timed] = []
    sizes: dict[str, Any] = {}
    logits: dict[str, np.ndarray] = {}
    programs: dict[str, list[str]] = {}
    for impl in run.impls:
        if library(impl).is_jax:
            styles, sizes, programs[impl] = _jax_styles(impl, models[impl], ids, mask, run)
            timed += styles
            logits[impl] = np.asarray(zoo.interface(impl).forward(models[impl], ids)[:, -1],
                                      np.float32)
    hf = None
    reference = next((i for i in run.impls if library(i).reference), None)
    if reference is not None:  # PyTorch's: the zoo's reference and transformers
        import torch

        hf = _hf_model(config, models[reference]) if run.hf else None
        timed += _torch_styles(reference, models[reference], hf, ids, mask, run)
        with torch.no_grad():
            tids = torch.from_numpy(ids).long()
            logits[reference] = models[reference](tids)[:, -1].float().numpy()
            if hf is not None:
                logits["transformers"] = hf(tids).logits[:, -1].float().numpy()
    progress(f"fairness: logits and greedy tokens of {len(timed)} calls (compiling)")
    outputs = {f"{t.impl} {t.style}": t.output(run.new) for t in timed}
    bound = logits_bound(run.dtype, run.precision)
    first_jax = next((i for i in run.impls if library(i).is_jax), None)
    score = None if first_jax is None else (
        lambda prefix: np.asarray(zoo.interface(first_jax).forward(models[first_jax], prefix)
                                  [0, -1], np.float32))
    fairness = _fairness(outputs, logits, reference, bound, score)
    fairness["precision"] = {"asked": run.precision, "decode_step_dots": programs,
                             "format": policy.compute_format(run.dtype, run.precision)}
    progress("copy bandwidth")
    bandwidth = copy_bandwidth()
    results = []
    for i, t in enumerate(timed):
        progress(f"[{i + 1}/{len(timed)}] timing {t.impl} {t.style}")
        results.append(t.measure(run))
    bandwidth = max(bandwidth, copy_bandwidth())  # before and after: the less disturbed
    if not sizes:  # no JAX library: the reference's sizes
        sizes = {"weights": sum(p.numel() * p.element_size()
                                for p in models[reference].parameters()), "cache": None}
    floor = _floor(config, run, sizes, bandwidth)
    for r in results:
        r["floor_ratio"] = r["decode_s"] / floor if floor else None
    record = record_base("generation")
    record["host_load_avg_at_start"] = list(load_at_start) if load_at_start else None
    record["config"] = {**run.__dict__, "resolved_config": config.to_dict(), "modes": MODES}
    record["bandwidth_bytes_per_s"] = bandwidth
    record["floor"] = {"decode_s": floor, **sizes}
    record["fairness"] = fairness
    record["results"] = results
    return record


def _floor(config: Any, run: GenerationRun, sizes: dict[str, Any], bandwidth: float) -> float:
    """Seconds of a decode step at the copy bandwidth: the weights plus the keys and values of
    the cache at its mean length over the run."""
    slots = run.prompt + run.new
    cache = sizes["cache"] or 0
    mean = run.prompt + run.new / 2
    return (sizes["weights"] + cache * mean / slots) / bandwidth


def table(record: dict[str, Any]) -> list[str]:
    """The run in lines of at most 80 columns."""
    cfg, floor = record["config"], record["floor"]
    load = record.get("host_load_avg")
    prec = cfg.get("precision", "default")
    lines = [f"{cfg['arch']} batch {cfg['batch']}, prompt {cfg['prompt']}, {cfg['new']} new "
             f"tokens, {cfg['dtype']}" + ("" if prec == "default" else f" at {prec}")
             + (f", load {load[0]:.1f}" if load else ""),
             f"floor {floor['decode_s'] * 1e3:.2f} ms/step: {floor['weights'] / 1e6:.0f} MB "
             f"weights + cache at {record['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s (copy)",
             f"{'library':7} {'style':11} {'prefill tok/s':>13} {'ms/step':>8} "
             f"{'tok/s':>8} {'x floor':>7} {'x torch':>7} {'compile s':>9}"]
    torch_s = min((r["decode_s"] for r in record["results"] if r["decode_s"] > 0
                   and library(r["impl"]).reference and r["style"] == "eager"), default=None)
    for r in record["results"]:
        step = r["decode_s"] if r["decode_s"] > 0 else None  # else: lost in the timer's noise
        ratio = (_number(step / torch_s, 7, 2) if torch_s and step else
                 _number(None, 7) if torch_s else f"{'':7}")
        lines.append(f"{r['impl']:7} {r['style']:11} {r['prefill_tokens_per_s']:13.0f} "
                     f"{_number(step and step * 1e3, 8, 2)} "
                     f"{_number(r['decode_tokens_per_s'], 8)} "
                     f"{_number(step and r['floor_ratio'], 7, 2)} {ratio} "
                     f"{r['compile_s']:9.2f}")
    setup = [f"{r['impl']} {r['style']} {r['loop_setup_s'] * 1e3:.0f}"
             for r in record["results"] if r.get("loop_setup_s") is not None]
    if setup:  # the loop program's per-call work (the weights' hoisted conversions)
        lines += textwrap.wrap("once a call, before its steps (ms): " + ", ".join(setup), 80)
    for tie in record.get("fairness", {}).get("near_ties", []):
        a, b = tie["logits"]
        lines.append(f"near-tie: {tie['call']}'s row {tie['row']} parts at token "
                     f"{tie['position']} (logits {a:.4g} and {b:.4g})")
    return lines


def _number(value: float | None, width: int, digits: int = 1) -> str:
    """`value` in `width` columns, "-" for None (a decode step lost in the noise: the
    difference of two timings at or below zero)."""
    return f"{'-':>{width}}" if value is None else f"{value:{width}.{digits}f}"


def default_prompt(config: Any) -> int:
    """The default prompt's tokens: `PROMPT`, or half the model's positions if fewer."""
    limit = getattr(config, "max_length", None)
    return PROMPT if limit is None else min(PROMPT, limit // 2)


def default_new(config: Any, prompt: int) -> int:
    """The default new tokens after `prompt`: `NEW`, or what the model's positions leave."""
    limit = getattr(config, "max_length", None)
    return NEW if limit is None else max(1, min(NEW, limit - prompt))


def decode_step(impl: str, model: Any, config: Any, batch: int = 1
                ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """One decode step of `zoo.generate`'s loop in a JAX library (`Generator.step`: it donates
    its state and returns the next) and its arguments `(weights, state)`, the state after a
    prefill of a random default-length prompt."""
    prompt = default_prompt(config)
    new = default_new(config, prompt)
    gen = Generator(zoo.interface(impl).decoding(model, batch, prompt + new),
                    Settings(max_new_tokens=new))
    p = gen.prepared
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (batch, prompt))
    slots = np.zeros((batch, p.max_length), np.int32)
    slots[:, :prompt] = 1
    state = gen.prefill(p.weights, p.cache, ids.astype(np.int32), slots, jax.random.key(0))
    return gen.step, (p.weights, state)


def run_from_args(args: Any) -> GenerationRun:
    """The run the command line asks for (`PresetError`, `ValueError`, `ArgumentTypeError`
    for bad values: the caller's one-line error). The default prompt and new tokens fit the
    model's positions."""
    import json

    preset = find_preset(args.preset, args.arch) if args.preset else None
    arch = preset.arch if preset else args.arch
    if arch is None:
        raise PresetError("name an architecture or a preset")
    overrides = dict(preset.config) if preset else {}
    if args.config:
        overrides.update(json.loads(args.config))
    config = build_config(arch, overrides, "auto")
    if not getattr(config, "GENERATES", False):
        why = ("an encoder: its config's GENERATES is false" if hasattr(config, "GENERATES")
               else "not a language model")
        raise ValueError(f"{arch} does not generate text ({why}); --mode forward or train "
                         "times it")
    limit = getattr(config, "max_length", None)
    prompt = args.prompt or default_prompt(config)
    new = args.new_tokens or default_new(config, prompt)
    if limit is not None and prompt + new > limit:
        asked = f"--prompt {prompt}" + (f" and --new-tokens {new}" if args.new_tokens else "")
        raise ValueError(f"{asked}: {prompt + new} tokens (prompt and new) exceed the model's "
                         f"{limit} positions")
    return GenerationRun(arch, parse_impls(args.impl), overrides, batch=args.batch or 1,
                         prompt=prompt, new=new, repeat=args.repeat or 3, seed=args.seed,
                         dtype=args.dtype or "float32", hf=not args.no_transformers,
                         preset=preset.name if preset else None, styles=styles(args.call),
                         precision=args.precision)


def styles(call: str) -> tuple[str, ...]:
    """The JAX call styles `--call` names: "default" (`FASTEST`), "all" or a comma list."""
    if call in ("default", "idiomatic"):
        return FASTEST
    if call == "all":
        return tuple(STYLES)
    names = tuple(dict.fromkeys(c.strip() for c in call.split(",")))
    unknown = [n for n in names if n not in STYLES]
    if unknown:
        raise ValueError(f"--call {call}: prefill/decode styles are {', '.join(STYLES)}, "
                         "default or all")
    return names


def generation_main(run: GenerationRun, args: Any, console: Any) -> int:
    """`python -m zoo.bench ARCH --mode prefill|decode`: run, print, save."""
    from rich.console import Console

    status = (lambda s: None) if args.no_progress else (
        lambda s: console.print(s, style="dim", highlight=False))
    try:
        record = run_generation(run, status)
    except FairnessError as e:
        Console(stderr=True).print(f"[bold red]zoo.bench: {e}[/]", highlight=False)
        return 3
    for line in table(record):
        console.print(line, highlight=False, soft_wrap=True)
    for path in [args.json] if args.json else []:
        write_json(record, path)
    if args.record:
        write_json(record, os.path.join(args.results_dir, record["device"]["slug"], run.name))
    return 0
