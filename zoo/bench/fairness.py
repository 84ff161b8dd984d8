"""Fair by construction: before anything is timed, the implementations must be the same function.

For the implementations being compared (built from one canonical state, so from the same seed):

1. parameter counts are equal;
2. outputs agree in the canonical layout: forward outputs (inference mode) and, for training,
   the training-mode loss of the first step, within a tolerance per dtype, relative to the
   reference output's largest magnitude;
3. the FLOP counts of the compiled programs (XLA `cost_analysis()` of the zoo's fast path, the
   default call style) agree within 1% (PyTorch has no compiled program: it is checked on
   outputs only and its FLOPs are reported from its JAX twin).

Any failure raises `FairnessError` naming the implementation and the numbers; `python -m zoo.bench`
then exits with status 3 and times nothing. This is what catches a Flax layer given an `int`
`kernel_size` on 3-D data: it compiles to a 1-D convolution with ~1/9 of the FLOPs.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from zoo.bench.subjects import Subject
from zoo.bench.timing import CompileInfo, compile_ahead

# Largest |a - b| allowed, relative to max |reference| (some outputs are near zero).
OUTPUT_TOLERANCE = {"float32": 1e-4, "float64": 1e-10, "bfloat16": 5e-2, "float16": 1e-2}
FLOPS_TOLERANCE = 0.01


class FairnessError(RuntimeError):
    """The implementations being compared do not compute the same thing: nothing is timed.

    `problems` lists one line per failed check; `report` holds every number measured.
    """

    def __init__(self, problems: list[str], report: dict[str, Any]) -> None:
        self.problems = problems
        self.report = report
        super().__init__(
            f"unfair comparison refused ({len(problems)} problem(s)); nothing was timed:\n  - "
            + "\n  - ".join(problems)
        )


def _forward_output(subject: Subject) -> tuple[np.ndarray, CompileInfo | None]:
    if subject.is_torch:
        import torch

        model = subject.torch_model().eval()
        with torch.no_grad():
            return subject.to_canonical(model(subject.x)), None
    fwd = subject.fast_forward()
    info, _ = compile_ahead(lambda: fwd.lower(subject.x))
    t0 = time.perf_counter()
    y = np.asarray(fwd(subject.x))  # waits
    info.first_call_s = time.perf_counter() - t0
    subject._cache["info_forward"] = info
    return subject.to_canonical(y), info


def _train_loss(subject: Subject) -> tuple[float, CompileInfo | None]:
    if subject.is_torch:
        model = subject.torch_model().train()
        return float(subject.torch_loss(model(subject.x), subject.target).detach()), None
    step = subject.fast_train()
    args = subject.train_args()
    info, _ = compile_ahead(lambda: step.lower(*args))
    t0 = time.perf_counter()
    loss = float(step(*args))  # the loss before the first update; waits
    info.first_call_s = time.perf_counter() - t0
    subject._cache["info_train"] = info
    return loss, info


def compare_outputs(outputs: dict[str, np.ndarray], tol: float,
                    what: str = "forward output") -> tuple[dict[str, Any], list[str]]:
    """Every output against the first one: shape, then max |diff| / max |reference|."""
    names = list(outputs)
    ref_name, ref = names[0], np.asarray(outputs[names[0]], np.float64)
    scale = max(float(np.abs(ref).max()) if ref.size else 0.0, 1e-30)
    entries, problems = {}, []
    for name in names[1:]:
        out = np.asarray(outputs[name], np.float64)
        if out.shape != ref.shape:
            entries[name] = {"shape": list(out.shape), "reference_shape": list(ref.shape),
                             "ok": False}
            problems.append(f"{what}: {name} has shape {out.shape}, {ref_name} {ref.shape}")
            continue
        err = float(np.abs(out - ref).max()) if ref.size else 0.0
        rel = err / scale
        ok = bool(np.isfinite(rel) and rel <= tol)
        entries[name] = {"max_abs_err": err, "rel_err": rel, "tolerance": tol, "ok": ok}
        if not ok:
            problems.append(
                f"{what}: {name} differs from {ref_name} by max |diff| {err:.3g} "
                f"({rel:.3g} of max |{ref_name}| = {scale:.3g}; tolerance {tol:g})")
    return entries, problems


def compare_flops(flops: dict[str, float | None], tol: float = FLOPS_TOLERANCE,
                  what: str = "forward") -> tuple[dict[str, Any], list[str]]:
    """Every FLOP count against the first known one, within `tol` (relative)."""
    known = {k: v for k, v in flops.items() if v}
    entries: dict[str, Any] = {k: {"flops": v} for k, v in flops.items()}
    problems: list[str] = []
    if len(known) < 2:
        return entries, problems
    ref_name, ref = next(iter(known.items()))
    for name, value in known.items():
        ratio = value / ref
        ok = abs(ratio - 1.0) <= tol
        entries[name].update(ratio=ratio, ok=ok)
        if not ok:
            problems.append(
                f"FLOPs ({what}): {name} compiles to {value:.4g} FLOPs, {ratio:.3f}x the "
                f"{ref:.4g} of {ref_name} (tolerance {tol:.0%}): not the same computation "
                "(an int kernel_size on a 3-D Flax conv gives a 1-D conv with ~1/9 the FLOPs)")
    return entries, problems


def check_fairness(subjects: dict[str, Subject], modes: tuple[str, ...] = ("forward",), *,
                   dtype: str = "float32", flops_tolerance: float = FLOPS_TOLERANCE,
                   output_tolerance: float | None = None,
                   flops_groups: dict[str, str] | None = None,
                   flops_floor: dict[str, float] | None = None) -> dict[str, Any]:
    """Run every check over `subjects` (name -> Subject, the first is the reference).

    `flops_groups` (name -> group, e.g. the conv-transpose method): FLOP counts are compared only
    within a group. The formulations of a conv-transpose legitimately compile to different FLOP
    counts (`phase` skips the multiplications by inserted zeros, `lhs_dilation` / `pad` may count
    them), so with `--method all` each method's libraries are held to 1% of each other, while
    outputs are still compared across every subject.

    `flops_floor` (mode -> useful FLOPs, `zoo.bench.roofline`): when the counts of a group differ
    by more than 1% but every one is at least 99% of the useful FLOPs, the difference is XLA's
    accounting of padding (e.g. `phase` pads explicitly; whether the zero taps are counted
    depends on the layout), recorded as a note, not refused. A program below the floor (the
    int-kernel mistake does 1/9 of the work) is always refused.

    Returns the report (also stored in JSON records); raises `FairnessError` on any failure.
    Compiles and runs the zoo's fast path once per JAX subject and mode (outside any timing);
    the compile measurements are kept for the "fast" call style.
    """
    tol = output_tolerance if output_tolerance is not None else OUTPUT_TOLERANCE.get(dtype, 1e-4)
    report: dict[str, Any] = {"reference": next(iter(subjects)), "dtype": dtype,
                              "output_tolerance": tol, "flops_tolerance": flops_tolerance}
    problems: list[str] = []

    counts = {name: s.parameter_count() for name, s in subjects.items()}
    report["parameters"] = counts
    ref_name = next(iter(counts))
    problems += [f"parameter count: {name} has {n:,}, {ref_name} {counts[ref_name]:,}"
                 for name, n in counts.items() if n != counts[ref_name]]

    for mode in modes:
        if mode == "forward":
            results = {name: _forward_output(s) for name, s in subjects.items()}
            values = {name: r[0] for name, r in results.items()}
            entries, found = compare_outputs(values, tol, "forward output")
        else:
            results = {name: _train_loss(s) for name, s in subjects.items()}
            values = {name: np.asarray(r[0]) for name, r in results.items()}
            entries, found = compare_outputs(values, tol, "training loss (first step)")
            for name, r in results.items():
                entries.setdefault(name, {})["loss"] = r[0]
        problems += found
        flops = {name: r[1].flops for name, r in results.items() if r[1] is not None}
        groups = flops_groups or {}
        flop_entries = {}
        for group in dict.fromkeys(groups.get(name, "") for name in flops):
            members = {n: v for n, v in flops.items() if groups.get(n, "") == group}
            entries_g, found = compare_flops(members, flops_tolerance,
                                             f"{mode}, method {group}" if group else mode)
            floor = (flops_floor or {}).get(mode)
            if found and floor and all(v >= 0.99 * floor for v in members.values() if v):
                report.setdefault("notes", []).append(
                    f"FLOPs ({mode}{', method ' + group if group else ''}) differ across "
                    f"libraries by up to {max(members.values()) / min(members.values()):.3f}x, "
                    f"all >= the {floor:.4g} useful FLOPs: XLA's accounting of padding")
                found = []
            for name in entries_g:
                if group:
                    entries_g[name]["group"] = group
            flop_entries.update(entries_g)
            problems += found
        report[mode] = {"outputs": entries, "flops": flop_entries}
    report["passed"] = not problems
    report["problems"] = problems
    if problems:
        raise FairnessError(problems, report)
    return report
