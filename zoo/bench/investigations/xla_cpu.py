"""`python -m zoo.bench xla-cpu`: minimal reproductions of the XLA:CPU limits behind the zoo's
CPU ratios (docs/investigations/xla_cpu_limits.md, "What remains, and whose
it is").

    python -m zoo.bench xla-cpu
    python -m zoo.bench xla-cpu --only concatenate,fresh-pages --rounds 20

Each reproduction is a few lines of `jax.numpy`, no zoo model: what it shows is XLA's, and its
output is what an upstream report needs. Counts read off the compiled HLO do not depend on the
machine's load; times are medians of interleaved, settled rounds with [p10, p90] of the paired
ratio (float32, default precision).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.layout import Format, Layout

from zoo.arguments import ArgumentParser, positive_int
from zoo.bench.display import make_console
from zoo.bench.investigations.breakdown import parse_hlo
from zoo.bench.timing import Prepared, round_orders, round_ratios, run_steps, settle
from zoo.bench.xla_flags import PRESETS, backend_started
from zoo.layers.norm import normalize

__all__ = ["REPROS", "cache_loop_ops", "column_major_copied", "concatenate_fusions",
           "conv_transposes", "fusion_operands", "residual_stack_loss", "transpose_kept",
           "weight_converted", "xla_cpu_main"]


Rows = list[tuple[str, str]]


@dataclass(frozen=True)
class Repro:
    """One limit: what XLA:CPU does, where it is reported, and how to show it (`run(rounds)`
    returns the (measure, value) rows to print)."""

    name: str
    claim: str
    upstream: str
    run: Callable[[int], Rows]


def _interleaved(calls: dict[str, Prepared], rounds: int, reference: str
                 ) -> dict[str, tuple[float, dict]]:
    """Median seconds per call and the paired ratio to `reference`, settled rounds of 3 calls
    in a seeded random order (as `zoo.bench` times its styles)."""
    times: dict[str, list[list[float]]] = {k: [] for k in calls}
    for order in round_orders(list(calls), rounds, seed=0):
        for key in order:
            settle(calls[key], 0.05)
            times[key].append(run_steps(calls[key], 3).step_s)
    ratios = round_ratios(times, reference)
    return {k: (float(np.median([np.median(r) for r in v])), ratios[k]) for k, v in times.items()}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _ratio(r: dict) -> str:
    return f"{r['median']:.2f}x [{r['p10']:.2f}, {r['p90']:.2f}]"


def _compiled(fn: Callable, *args: Any) -> str:
    return jax.jit(fn).lower(*args).compile().as_text()


# -- residual-fusions ---------------------------------------------------------------------------

def _layer_norm(x: jax.Array) -> jax.Array:
    d = x - x.mean(-1, keepdims=True)
    return d * lax.rsqrt((d * d).mean(-1, keepdims=True) + 1e-6)


def residual_stack_loss(norm: Callable[[jax.Array], jax.Array]) -> Callable:
    """`sum(x_L ** 2)` of `x_{i+1} = x_i + norm(x_i) @ w_i`: a transformer's residual stream."""
    def loss(ws: list[jax.Array], x: jax.Array) -> jax.Array:
        for w in ws:
            x = x + norm(x) @ w
        return (x * x).sum()
    return loss


def fusion_operands(depth: int, shape: tuple[int, ...] = (32, 65, 96),
                    closed_form: bool = False) -> tuple[int, int]:
    """(operands of all fusions, of the largest one) in the compiled gradient of a `depth`-block
    residual stack, LayerNorm differentiated by autodiff or in closed form."""
    norm = (lambda x: normalize(x, 1, 1e-6)) if closed_form else _layer_norm
    ws = [jnp.eye(shape[-1]) * 0.1] * depth
    hlo = _compiled(jax.grad(residual_stack_loss(norm)), ws, jnp.ones(shape))
    counts = [len(m.split(",")) for m in re.findall(r" fusion\(([^)]*)\)", hlo)]
    return sum(counts), max(counts)


def _residual_fusions(rounds: int) -> Rows:
    rows = []
    for depth in (2, 4, 8, 16):
        auto, closed = fusion_operands(depth), fusion_operands(depth, closed_form=True)
        rows.append((f"{depth} blocks: operands (largest), auto / closed",
                     f"{auto[0]} ({auto[1]}) / {closed[0]} ({closed[1]})"))
    ws = [jnp.eye(96) * 0.1] * 16
    x = jax.random.normal(jax.random.key(0), (32, 65, 96))
    calls = {name: Prepared(jax.jit(jax.grad(residual_stack_loss(norm))), (ws, x))
             for name, norm in (("autodiff", _layer_norm),
                                ("closed", lambda x: normalize(x, 1, 1e-6)))}
    t = _interleaved(calls, rounds, "autodiff")
    rows.append(("16 blocks: gradient, autodiff LayerNorm", _ms(t["autodiff"][0])))
    rows.append(("16 blocks: gradient, closed-form LayerNorm",
                 f"{_ms(t['closed'][0])}, {_ratio(t['closed'][1])}"))
    return rows


# -- concatenate --------------------------------------------------------------------------------

def _patches(x: jax.Array, taps: int = 3) -> jax.Array:
    """im2col over the first two spatial axes: the `taps**2` shifted slices side by side."""
    n, d, h = x.shape[0], x.shape[1] - taps + 1, x.shape[2] - taps + 1
    return jnp.concatenate([x[:, a:a + d, b:b + h] for a, b in
                            itertools.product(range(taps), repeat=2)], axis=-1).reshape(n, -1)


def concatenate_fusions(shape: tuple[int, ...] = (2, 10, 66, 66, 16)) -> tuple[int, int]:
    """(operands of the concatenate, of them the outputs of separate fusions or slices)."""
    hlo = _compiled(_patches, jnp.ones(shape))
    line = next(ln for ln in hlo.splitlines() if re.search(r"= \S+ concatenate\(", ln))
    operands = re.search(r"concatenate\(([^)]*)\)", line).group(1).split(",")
    separate = [o for o in operands if re.search(r"fusion|slice", o)]
    return len(operands), len(separate)


def _concatenate(rounds: int) -> Rows:
    shape = (2, 18, 66, 66, 16)
    x = jax.random.normal(jax.random.key(0), shape)
    n_ops, separate = concatenate_fusions(shape)
    out_shape = jax.eval_shape(_patches, x).shape
    # the same output bytes from one fusion (each element read once, written once)
    d, h = shape[1] - 2, shape[2] - 2
    one_pass = jax.jit(lambda x: jnp.broadcast_to(
        x[:, :d, :h, :, None], (shape[0], d, h, shape[3], 9, shape[4])).reshape(out_shape))
    calls = {"concat": Prepared(jax.jit(_patches), (x,)), "one": Prepared(one_pass, (x,))}
    t = _interleaved(calls, rounds, "one")
    mib = np.prod(out_shape) * 4 / 2**20
    return [("concatenate of 3x3 shifted slices: operands", f"{n_ops}, {separate} written "
             "by own fusions"),
            (f"slices + concatenate ({mib:.0f} MiB out)", _ms(t["concat"][0])),
            ("the same bytes written by one fusion", _ms(t["one"][0])),
            ("slices + concatenate / one fusion", _ratio(t["concat"][1]))]


# -- nchw-conv ----------------------------------------------------------------------------------

def _conv(spec: tuple[str, str, str]) -> Callable:
    return lambda x, w: lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                                 dimension_numbers=spec)


def conv_transposes(spec: tuple[str, str, str], n: int = 8, c: int = 16, hw: int = 8) -> int:
    """Transposes and copies in the compiled 3x3 convolution of layout `spec`."""
    sizes = {"N": n, "C": c, "H": hw, "W": hw, "O": c, "I": c}
    x = jnp.ones([sizes[a] for a in spec[0]])
    w = jnp.ones([sizes.get(a, 3) for a in spec[1]])
    return len(re.findall(r"= \S+ (?:transpose|copy)\(", _compiled(_conv(spec), x, w)))


def _nchw_conv(rounds: int) -> Rows:
    x = jax.random.normal(jax.random.key(0), (32, 16, 16, 128))  # ResNet-18-cifar's layer2
    w = jax.random.normal(jax.random.key(1), (3, 3, 128, 128)) * 0.05
    first, last = ("NCHW", "OIHW", "NCHW"), ("NHWC", "HWIO", "NHWC")
    calls = {"NHWC": Prepared(jax.jit(_conv(last)), (x, w)),
             "NCHW": Prepared(jax.jit(_conv(first)), (x.transpose(0, 3, 1, 2),
                                                        w.transpose(3, 2, 0, 1)))}
    t = _interleaved(calls, rounds, "NHWC")
    return [("transposes/copies in the program", f"NCHW/OIHW {conv_transposes(first)}, "
             f"NHWC/HWIO {conv_transposes(last)}"),
            ("3x3 conv 128->128, 16x16, batch 32: NHWC", _ms(t["NHWC"][0])),
            ("the same in NCHW/OIHW", f"{_ms(t['NCHW'][0])}, {_ratio(t['NCHW'][1])}")]


# -- gemv-layout --------------------------------------------------------------------------------

def _row_times_kernel(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """`x (1, in) @ kernel (in, out)`: Flax's Dense at batch-1 decoding."""
    return x @ kernel


def _row_times_weight(x: jax.Array, weight: jax.Array) -> jax.Array:
    """The same product on `weight (out, in)`, contracted where it lies (PyTorch's and the
    zoo's Equinox layout)."""
    return lax.dot_general(x, weight, (((1,), (1,)), ((), ())))


def transpose_kept(n_in: int = 64, n_out: int = 16) -> bool:
    """Whether the compiled `x @ weight.T` of a stored `(out, in)` weight keeps a transpose
    (or copy) of it rather than folding it into the product."""
    hlo = _compiled(lambda x, w: x @ w.T, jnp.ones((1, n_in)), jnp.ones((n_out, n_in)))
    return bool(re.search(r"= \S+ (?:transpose|copy)\(", hlo))


def column_major_copied(n_in: int = 64, n_out: int = 16) -> bool:
    """Whether an `(in, out)` kernel given to the compiled product in a column-major layout
    (the bytes of an `(out, in)` weight, `jax.experimental.layout`) is copied back to
    row-major before the dot, rather than read where it lies."""
    device = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    column_major = Format(Layout(major_to_minor=(1, 0)), device)
    hlo = (jax.jit(_row_times_kernel, in_shardings=(None, column_major))
           .lower(jnp.ones((1, n_in)), jnp.ones((n_in, n_out))).compile().as_text())
    return bool(re.search(rf"= f32\[{n_in},{n_out}\]\{{1,0\}} (?:copy|fusion)\(", hlo))


def _gemv_layout(rounds: int) -> Rows:
    rows: Rows = []
    for name, (n_in, n_out) in (("GPT-2's c_proj", (3072, 768)),
                                ("Qwen2.5-0.5B's down_proj", (4864, 896))):
        kernel = jax.random.normal(jax.random.key(0), (n_in, n_out))
        weight = jnp.asarray(np.asarray(kernel).T.copy())
        x = jax.random.normal(jax.random.key(1), (1, n_in))
        calls = {"in_out": Prepared(jax.jit(_row_times_kernel), (x, kernel)),
                 "out_in": Prepared(jax.jit(_row_times_weight), (x, weight))}
        t = _interleaved(calls, rounds, "out_in")
        gb = n_in * n_out * 4 / 1e9
        rows += [(f"{name} {n_in}->{n_out}, batch 1: (in, out) kernel",
                  f"{_ms(t['in_out'][0])}, {gb / t['in_out'][0]:.0f} GB/s"),
                 ("  (out, in) weight", f"{_ms(t['out_in'][0])}, {gb / t['out_in'][0]:.0f} GB/s"),
                 ("  (in, out) / (out, in)", _ratio(t["in_out"][1]))]
    rows.append(("x @ w.T of a stored (out, in) w", "transposed first" if transpose_kept()
                 else "folded into the product"))
    rows.append(("an (in, out) kernel laid out column-major", "copied to row-major first"
                 if column_major_copied() else "read where it lies"))
    return rows


# -- bf16-gemv ----------------------------------------------------------------------------------

def weight_converted(n_in: int = 64, n_out: int = 16) -> bool:
    """Whether the compiled batch-1 product of a bfloat16 `(out, in)` weight converts the
    whole weight to float32 (an f32 array of the weight's shape) before its dot."""
    hlo = _compiled(_row_times_weight, jnp.ones((1, n_in), jnp.bfloat16),
                    jnp.ones((n_out, n_in), jnp.bfloat16))
    return bool(re.search(rf"= f32\[{n_out},{n_in}\]\S* (?:convert|fusion)\(", hlo))


def _bf16_gemv(rounds: int) -> Rows:
    rows: Rows = []
    for name, (n_in, n_out) in (("GPT-2's c_fc", (768, 3072)),
                                ("Qwen2.5-0.5B's down_proj", (4864, 896))):
        weight = jax.random.normal(jax.random.key(0), (n_out, n_in))
        x = jax.random.normal(jax.random.key(1), (1, n_in))
        step = jax.jit(_row_times_weight)
        calls = {"f32": Prepared(step, (x, weight)),
                 "bf16": Prepared(step, (x.astype(jnp.bfloat16), weight.astype(jnp.bfloat16)))}
        t = _interleaved(calls, rounds, "f32")
        rows += [(f"{name} {n_in}->{n_out}, batch 1: float32",
                  f"{_ms(t['f32'][0])}, {n_in * n_out * 4 / 1e9 / t['f32'][0]:.0f} GB/s"),
                 ("  bfloat16 (half the bytes)",
                  f"{_ms(t['bf16'][0])}, {n_in * n_out * 2 / 1e9 / t['bf16'][0]:.0f} GB/s"),
                 ("  bfloat16 / float32 time", _ratio(t["bf16"][1]))]
    rows.append(("the bfloat16 weight", "converted to float32 whole, every call"
                 if weight_converted() else "read as bfloat16 by the dot"))
    return rows


# -- kv-cache ------------------------------------------------------------------------------------

def _decode_loop(head_major: bool, steps: int) -> Callable:
    """`steps` decode steps of one attention layer over a KV cache (keys = values, enough
    here), each writing its token's slot in place and attending over every slot: the cache
    kept slot-major `(N, L, heads, D)` (Flax's layout, and the zoo's) or head-major
    `(N, heads, L, D)` (`transformers`'), read by the same two batched products."""
    axis = 2 if head_major else 1

    def step(i: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        cache, x = carry  # x: (N, heads, D)
        cache = lax.dynamic_update_slice_in_dim(cache, jnp.expand_dims(jnp.tanh(x), axis),
                                                i, axis)
        keys = cache if head_major else jnp.swapaxes(cache, 1, 2)  # (N, heads, L, D)
        weights = jax.nn.softmax(jnp.einsum("ngd,ngkd->ngk", x, keys), axis=-1)
        return cache, x + jnp.einsum("ngk,ngkd->ngd", weights, keys)

    return jax.jit(lambda cache, x: lax.fori_loop(0, steps, step, (cache, x)))


def _cache_args(head_major: bool, slots: int, heads: int = 12, d: int = 64
                ) -> tuple[jax.Array, jax.Array]:
    shape = (1, heads, slots, d) if head_major else (1, slots, heads, d)
    return jnp.zeros(shape), jnp.full((1, heads, d), 0.01)


def cache_loop_ops(head_major: bool, slots: int = 64) -> tuple[int, int]:
    """(copies, transposes) of a whole cache in the compiled decode loop's body (and the
    fusions it calls), each a pass over the cache at every step (a transpose's own copy to
    its layout counted once, as the transpose)."""
    cache, x = _cache_args(head_major, slots)
    hlo = _decode_loop(head_major, 4).lower(cache, x).compile().as_text()
    computations, _ = parse_hlo(hlo)
    body = re.search(r"while\(.*?body=%?([\w.\-]+)", hlo).group(1)
    lines = list(computations[body])
    for line in computations[body]:
        for called in re.findall(r"calls=%?([\w.\-]+)", line):
            lines += computations.get(called, [])
    same_size = [ln for ln in lines if re.search(r"= f32\[[\d,]+\]\S* (?:copy|transpose)\(", ln)
                 and np.prod([int(d) for d in re.search(r"f32\[([\d,]+)\]", ln).group(1)
                              .split(",")]) == cache.size]
    return (sum(" copy(" in ln and " copy(%transpose" not in ln for ln in same_size),
            sum(" transpose(" in ln for ln in same_size))


def _kv_cache(rounds: int) -> Rows:
    rows: Rows = []
    steps = 16
    for slots in (64, 1024):
        calls = {name: Prepared(_decode_loop(major, steps), _cache_args(major, slots))
                 for name, major in (("slot", False), ("head", True))}
        t = _interleaved(calls, rounds, "slot")
        mb = calls["slot"].args[0].nbytes / 1e6
        rows += [(f"GPT-2's attention (12 heads of 64), {slots} slots ({mb:.1f} MB), a step: "
                  "(N, L, heads, D) cache", f"{t['slot'][0] / steps * 1e6:.0f} us"),
                 ("  (N, heads, L, D) cache", f"{t['head'][0] / steps * 1e6:.0f} us"),
                 ("  head-major / slot-major", _ratio(t["head"][1]))]
    for name, major in (("slot-major", False), ("head-major", True)):
        copies, transposes = cache_loop_ops(major)
        rows.append((f"passes over the whole cache in a step, {name}",
                     f"copies: {copies}, transposes: {transposes}"))
    return rows


# -- fresh-pages and ynn-conv: each setting in a fresh process ------------------------------------

_PAGES_CHILD = """
import json, resource, sys, time
if sys.argv[1] == "keep":
    from zoo.runtime.malloc import keep_freed_memory
    keep_freed_memory()
import jax, jax.numpy as jnp, numpy as np
x = jnp.ones((16, 1024, 1024))  # 64 MiB: above glibc's largest dynamic mmap threshold
step = jax.jit(lambda x: jnp.sin(x) * 2 + x)
for _ in range(10):
    step(x).block_until_ready()
faults, seconds = [], []
for _ in range(int(sys.argv[2])):
    before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    step(x).block_until_ready()
    seconds.append(time.perf_counter() - start)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps([float(np.median(seconds)), float(np.median(faults))]))
"""

_CONV_CHILD = """
import json, os, sys, time
os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:int(sys.argv[1])]))
import jax, jax.numpy as jnp, numpy as np
from jax import lax
x = jax.random.normal(jax.random.key(0), (32, 32, 32, 64))  # ResNet-18-cifar's layer1
w = jax.random.normal(jax.random.key(1), (3, 3, 64, 64)) * 0.05
conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
step = jax.jit(jax.value_and_grad(lambda x, w: (conv(x, w) ** 2).sum(), (0, 1)))
for _ in range(3):
    jax.block_until_ready(step(x, w))
t = []
for _ in range(int(sys.argv[2])):
    s = time.perf_counter(); jax.block_until_ready(step(x, w)); t.append(time.perf_counter() - s)
print(json.dumps(float(np.median(t))))
"""


def _child(code: str, args: list[str], xla_flags: str = "") -> Any:
    """Run `code` in a fresh Python (JAX's backend and glibc's settings start anew) and return
    the JSON of its last line."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": os.pathsep.join(sys.path),
           "XLA_FLAGS": " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), xla_flags) if f)}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         check=True, env=env)
    return json.loads(out.stdout.splitlines()[-1])


def _fresh_pages(rounds: int) -> Rows:
    n = str(max(rounds, 5))
    (t_sys, f_sys), (t_keep, f_keep) = _child(_PAGES_CHILD, ["system", n]), _child(
        _PAGES_CHILD, ["keep", n])
    return [("64 MiB elementwise call, glibc's defaults", _ms(t_sys)),
            ("  page faults per call (16,384 pages)", f"{f_sys:,.0f}"),
            ("the same, zoo.runtime.malloc.keep_freed_memory()", _ms(t_keep)),
            ("  page faults per call", f"{f_keep:,.0f}")]


def _ynn_conv(rounds: int) -> Rows:
    if not hasattr(os, "sched_getaffinity"):
        return [("cores", "needs Linux's CPU affinity (os.sched_setaffinity)")]
    if len(os.sched_getaffinity(0)) < 2:
        return [("cores available", "1: needs 2")]
    n = str(max(rounds, 5))
    one, two = _child(_CONV_CHILD, ["1", n]), _child(_CONV_CHILD, ["2", n])
    e_one, e_two = (_child(_CONV_CHILD, [c, n], PRESETS["eigen-conv"]) for c in ("1", "2"))
    return [("YNNPACK (XLA's default), 1 core", _ms(one)),
            ("  on 2 cores", f"{_ms(two)}: {one / two:.2f}x faster"),
            ("XLA's own (preset eigen-conv), 1 core", _ms(e_one)),
            ("  on 2 cores", f"{_ms(e_two)}: {e_one / e_two:.2f}x faster"),
            ("YNNPACK / XLA's own, 2 cores", f"{two / e_two:.2f}x")]


REPROS: tuple[Repro, ...] = (
    Repro("residual-fusions", "Through a residual stack's gradient, XLA:CPU fuses autodiff's "
          "LayerNorm chain into every later block's fusions: their operands grow with depth "
          "squared (the zoo's closed-form LayerNorm gradient halves them).",
          "not reported yet: file with this output", _residual_fusions),
    Repro("concatenate", "XLA:CPU never fuses a concatenate's operands into it: each shifted "
          "slice of an im2col patch matrix is written by its own fusion, then copied again.",
          "not reported yet (related: openxla/xla#46351, slices kept out of YNNPACK "
          "fusions)", _concatenate),
    Repro("nchw-conv", "XLA:CPU's convolutions are channels-last: a channels-first one "
          "(Equinox's per-sample idiom, PyTorch's kernel layout) is wrapped in transposes.",
          "not reported yet: file with this output", _nchw_conv),
    Repro("fresh-pages", "XLA:CPU allocates every call's large buffers afresh: with glibc's "
          "defaults each is new memory, a page fault per 4 KiB on every call.",
          "not reported yet: file with this output", _fresh_pages),
    Repro("ynn-conv", "XLA:CPU's default YNNPACK convolution runs ResNet-18-cifar's layer1 "
          "(64->64, 32x32, batch 32; forward and both gradients) on one of two cores; XLA's "
          "own convolution (`--xla-cpu-flags eigen-conv`) uses both.",
          "not reported yet (YNNPACK fusion flags as workarounds: jax-ml/jax#37465)",
          _ynn_conv),
    Repro("gemv-layout", "XLA:CPU's matrix-vector product (batch-1 decoding) reads Flax's "
          "(in, out) kernel at a fraction of the bandwidth of an (out, in) weight when in > out, "
          "and a stored (out, in) weight used as `x @ w.T` is transposed first, not contracted "
          "where it lies.", "not reported yet: file with this output", _gemv_layout),
    Repro("bf16-gemv", "XLA:CPU has no bfloat16 matrix-vector product: each bfloat16 weight "
          "is converted whole to float32 at every call, then multiplied (batch-1 decoding in "
          "bfloat16 reads and writes more bytes than in float32).",
          "not reported yet: file with this output", _bf16_gemv),
    Repro("kv-cache", "In a decode loop, XLA:CPU transposes a slot-major KV cache "
          "(N, L, heads, D) whole at every step for the attention's batched products; a "
          "head-major cache (N, heads, L, D), which they read as it lies, is copied whole at "
          "every step instead (its one-slot write is not done in place), and is slower.",
          "not reported yet: file with this output", _kv_cache),
)


def run_repros(names: list[str], rounds: int, console: Any) -> None:
    """Run the reproductions `names`, one table each."""
    from rich.table import Table

    console.print(f"jax {jax.__version__}, {jax.default_backend()}, load average "
                  f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}", highlight=False)
    for repro in (r for r in REPROS if r.name in names):
        table = Table(title=f"{repro.name}: {repro.claim}", title_justify="left",
                      caption=f"upstream: {repro.upstream}", caption_justify="left",
                      expand=True, show_header=False)
        table.add_column("measure", ratio=3)
        table.add_column("value", ratio=2)
        for measure, value in repro.run(rounds):
            table.add_row(measure, value)
        console.print(table)


def xla_cpu_main(argv: list[str]) -> int:
    names = [r.name for r in REPROS]
    p = ArgumentParser(prog="python -m zoo.bench xla-cpu",
                       description="minimal reproductions of XLA:CPU's limits")
    p.add_argument("--only", default=",".join(names), help=f"comma list of {', '.join(names)}")
    p.add_argument("--rounds", type=positive_int, default=10, help="timed rounds (default 10)")
    args = p.parse_args(argv)
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(only) - set(names))
    if unknown:
        p.error(f"unknown --only {unknown} (use {', '.join(names)})")
    if not backend_started():  # XLA:CPU's facts, whatever accelerator the machine has
        jax.config.update("jax_platforms", "cpu")
    elif jax.default_backend() != "cpu":
        p.error(f"JAX already runs on {jax.default_backend()}; run with JAX_PLATFORMS=cpu")
    run_repros(only, args.rounds, make_console())
    return 0
