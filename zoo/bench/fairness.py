"""Fair by construction: before anything is timed, the implementations must be the same function.

For the implementations being compared (built from one canonical state, so from the same seed):

1. parameter counts are equal;
2. outputs agree in the canonical layout: forward outputs (inference mode) and, for training,
   the training-mode loss of the first step, relative to the reference output's largest
   magnitude. First strictly, at full float32 (`zoo.runtime.precision.exact`), then at the precision
   the benchmark times (`--precision`), each within the precision policy's tolerance for the
   format the arithmetic runs in (`zoo.runtime.precision.tolerance(..., kind="max_relative")`);
3. the FLOP counts of the programs (the zoo's fast path, the default call style) agree within
   1% and reach the useful FLOPs of the shape, counted on the pre-optimisation HLO
   (`zoo.bench.flops.COMPARED`: the whole computation on every backend; the compiled GPU
   program hides cuDNN and cuBLAS calls and pads each layout its own way, so its count is
   recorded, never compared); a program with no count at all is refused, never skipped
   (PyTorch has no XLA program: it is checked on outputs only and its FLOPs are reported from
   its JAX twin).

Any failure raises `FairnessError` naming the implementation and the numbers; `python -m zoo.bench`
then exits with status 3 and times nothing. This is what catches a Flax layer given an `int`
`kernel_size` on 3-D data: it compiles to a 1-D convolution with ~1/9 of the FLOPs.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from zoo.bench import flops as flops_mod
from zoo.bench.subjects import Subject
from zoo.bench.timing import CompileInfo, compile_ahead
from zoo.runtime import precision as policy

FLOPS_TOLERANCE = 0.01


def output_tolerance(dtype: str, precision: str = policy.EXACT) -> float:
    """Largest max |a - b| / max |reference| allowed (some outputs are near zero)."""
    return policy.tolerance(dtype, precision, kind="max_relative")


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


def _flops_of(value: Any) -> float | None:
    return flops_mod.usable(value[0] if isinstance(value, tuple | list) else value)


def compare_flops(counts: dict[str, dict[str, Any] | float | None], tol: float = FLOPS_TOLERANCE,
                  what: str = "forward", sources: tuple[str, ...] = flops_mod.COMPARED
                  ) -> tuple[dict[str, Any], list[str]]:
    """Every program's FLOP count against the first one's, within `tol` (relative).

    `counts`: name -> {source: flops or (flops, bytes)} (`zoo.bench.flops.count`), or a bare
    number (a pre-optimisation count, "lowered"). The counts compared come from the first of
    `sources` every program has; the others (the compiled count) are kept in each entry's
    `counts`, as information. A program without a count from `sources` is a problem, not a
    pass.
    """
    per: dict[str, dict[str, float]] = {}
    for name, c in counts.items():
        c = {"lowered": c} if not isinstance(c, dict) else c
        per[name] = {s: v for s, raw in c.items() if (v := _flops_of(raw)) is not None}
    problems = [f"FLOPs ({what}): no usable count for {name} from {' or '.join(sources)}: "
                "the work cannot be checked"
                for name, c in per.items() if not any(s in c for s in sources)]
    known = {name: c for name, c in per.items() if any(s in c for s in sources)}
    source = flops_mod.common_source(known, sources)
    entries: dict[str, Any] = {name: {"flops": c.get(source) if source else None,
                                      "source": source, "counts": c} for name, c in per.items()}
    if len(known) < 2 or source is None:
        return entries, problems
    values = {name: c[source] for name, c in known.items()}
    ref_name, ref = next(iter(values.items()))
    for name, value in values.items():
        ratio = value / ref
        ok = abs(ratio - 1.0) <= tol
        entries[name].update(ratio=ratio, ok=ok)
        if not ok:
            problems.append(
                f"FLOPs ({what}): {name} counts {value:.4g} FLOPs, {ratio:.3f}x the "
                f"{ref:.4g} of {ref_name} (tolerance {tol:.0%}, {source} counts): not the same "
                "computation (an int kernel_size on a 3-D Flax conv gives a 1-D conv with ~1/9 "
                "the FLOPs)")
    return entries, problems


def check_flops(counts: dict[str, dict[str, Any]], mode: str, *,
                tol: float = FLOPS_TOLERANCE, groups: dict[str, str] | None = None,
                floor: float | None = None, notes: list[str] | None = None,
                sources: tuple[str, ...] = flops_mod.COMPARED
                ) -> tuple[dict[str, Any], list[str]]:
    """The FLOP checks of one mode: `compare_flops` within each group (`groups`: name ->
    group), and every count against the useful FLOPs `floor`. Counts that differ by more than
    `tol` but all reach the floor are XLA's accounting (a note in `notes`, not a problem); one
    below 99% of the floor does less work than the model needs and is always refused."""
    groups = groups or {}
    out: dict[str, Any] = {}
    problems: list[str] = []
    for group in dict.fromkeys(groups.get(name, "") for name in counts):
        members = {n: v for n, v in counts.items() if groups.get(n, "") == group}
        entries, found = compare_flops(members, tol,
                                       f"{mode}, method {group}" if group else mode, sources)
        known = [e["flops"] for e in entries.values() if e["flops"]]
        short = {n: e["flops"] for n, e in entries.items()
                 if floor and e["flops"] and e["flops"] < 0.99 * floor}
        found += [f"FLOPs ({mode}): {n} is counted at {v:.4g}, below the {floor:.4g} "
                  f"useful FLOPs of this shape: it does less work than the model needs"
                  for n, v in short.items()]
        if (found and not short and floor and len(known) == len(members)
                and all(v >= 0.99 * floor for v in known)):
            if notes is not None:
                notes.append(
                    f"FLOPs ({mode}{', method ' + group if group else ''}) differ across "
                    f"libraries by up to {max(known) / min(known):.3f}x, all >= the "
                    f"{floor:.4g} useful FLOPs: XLA's accounting (padding, fusions)")
            found = []
        for name in entries:
            if group:
                entries[name]["group"] = group
        out.update(entries)
        problems += found
    return out, problems


def _check_mode(subjects: dict[str, Subject], mode: str, tol: float, flops_tolerance: float,
                flops_groups: dict[str, str] | None, flops_floor: float | None,
                notes: list[str], with_flops: bool = True,
                flops_sources: tuple[str, ...] = flops_mod.COMPARED
                ) -> tuple[dict[str, Any], list[str]]:
    """Outputs (or first losses) and FLOP counts of one mode, at the precision in effect."""
    if mode == "forward":
        results = {name: _forward_output(s) for name, s in subjects.items()}
        values = {name: r[0] for name, r in results.items()}
        entries, problems = compare_outputs(values, tol, "forward output")
    else:
        results = {name: _train_loss(s) for name, s in subjects.items()}
        values = {name: np.asarray(r[0]) for name, r in results.items()}
        entries, problems = compare_outputs(values, tol, "training loss (first step)")
        for name, r in results.items():
            entries.setdefault(name, {})["loss"] = r[0]
    if not with_flops:  # FLOP counts do not depend on the precision: checked once, strictly
        return {"outputs": entries}, problems
    counts = {name: dict(r[1].flop_counts) for name, r in results.items() if r[1] is not None}
    flop_entries, found = check_flops(counts, mode, tol=flops_tolerance, groups=flops_groups,
                                      floor=flops_floor, notes=notes, sources=flops_sources)
    return {"outputs": entries, "flops": flop_entries}, problems + found


def check_fairness(subjects: dict[str, Subject], modes: tuple[str, ...] = ("forward",), *,
                   dtype: str = "float32", precision: str = policy.EXACT,
                   strict: bool = True, flops_tolerance: float = FLOPS_TOLERANCE,
                   flops_groups: dict[str, str] | None = None,
                   flops_floor: dict[str, float] | None = None,
                   flops_sources: tuple[str, ...] = flops_mod.COMPARED) -> dict[str, Any]:
    """Run every check over `subjects` (name -> Subject, the first is the reference).

    Outputs and FLOPs are checked strictly at full float32 (the report's top level), then, when
    `precision` is not "highest", again at `precision` (`report["at_precision"]`, tolerance
    from the format that precision computes in); the fast path's compile measurements of the
    last pass are kept for the "fast" call style, so call this with the precision to be timed.

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

    `flops_sources`: the counts compared, first found first (`zoo.bench.flops.COMPARED`: the
    programs before optimisation and partitioning, the global computation on every backend;
    the compiled count is recorded beside them).

    `strict=False`: one pass, at `precision` only, FLOPs included (its tolerance that of the
    format it computes in): each program is compiled once, for the precision timed (the GPU
    run, where every compilation costs seconds; the strict pass is the test suite's).

    Returns the report (also stored in JSON records); raises `FairnessError` on any failure.
    """
    policy.check_precision(precision)
    first = policy.EXACT if strict else precision
    tol = output_tolerance(dtype, first)
    report: dict[str, Any] = {"reference": next(iter(subjects)), "dtype": dtype,
                              "precision": first, "output_tolerance": tol,
                              "check": "strict" if strict else "timed",
                              "flops_tolerance": flops_tolerance,
                              "flops_sources": list(flops_sources)}
    problems: list[str] = []
    notes: list[str] = []

    counts = {name: s.parameter_count() for name, s in subjects.items()}
    report["parameters"] = counts
    ref_name = next(iter(counts))
    problems += [f"parameter count: {name} has {n:,}, {ref_name} {counts[ref_name]:,}"
                 for name, n in counts.items() if n != counts[ref_name]]

    passes = [(first, report)]
    fmt = policy.compute_format(dtype, precision)
    if fmt == policy.compute_format(dtype, first):
        # This backend computes `precision` in the same format (XLA:CPU, PyTorch on CPU): the
        # strict pass, run with the setting to be timed, is the pass at that precision.
        passes = [(precision, report)]
        report["at_precision"] = {"precision": precision, "format": fmt, "same_as_strict": True}
    else:
        report["at_precision"] = {"precision": precision, "format": fmt,
                                  "output_tolerance": output_tolerance(dtype, precision)}
        passes.append((precision, report["at_precision"]))
    for i, (prec, out) in enumerate(passes):
        if problems and i:  # the strict pass failed: refuse now
            break
        with policy.use(prec):
            for mode in modes:
                out[mode], found = _check_mode(
                    subjects, mode, out["output_tolerance"], flops_tolerance, flops_groups,
                    (flops_floor or {}).get(mode), notes, with_flops=i == 0,
                    flops_sources=flops_sources)
                problems += [f"{p} (at precision {prec})" if i else p for p in found]
    if notes:
        report["notes"] = list(dict.fromkeys(notes))
    report["passed"] = not problems
    report["problems"] = problems
    if problems:
        raise FairnessError(problems, report)
    return report
