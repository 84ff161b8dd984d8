"""XLA:CPU flags for a benchmark run: named presets, a probe of which flags this XLA accepts, and
`apply`, which sets `XLA_FLAGS` before JAX starts its backend (`--xla-cpu-flags`).

XLA reads `XLA_FLAGS` once, when the first backend is created, and aborts the process on a flag
it does not know. So every flag is first probed in a subprocess (a clear error instead of an
abort), and `apply` refuses to run once a backend exists (the flags would silently not apply).

    python -m zoo.bench xla-flags              # presets, and which flags this XLA accepts
    python -m zoo.bench convt --preset convt-256-cpu --xla-cpu-flags onednn
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

from zoo.arguments import ArgumentParser

# Measured on CPU in docs/investigations/conv_transpose.md; `none` is XLA's own default.
PRESETS: dict[str, str] = {
    "none": "",
    "onednn": "--xla_cpu_use_onednn=true",
    "onednn-custom-call": "--xla_cpu_experimental_onednn_custom_call=true",
    "onednn-all": "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_custom_call=true",
    "xnnpack": "--xla_cpu_use_xnnpack=true",
    # XLA's own convolutions instead of YNNPACK's (docs/investigations/xla_cpu_limits.md,
    # "YNNPACK's convolutions"):
    # YNNPACK ran ResNet-18-cifar's 64-channel 32x32 layers on one of two cores.
    "eigen-conv": "--xla_cpu_experimental_ynn_fusion_type=-individual_convolution",
}
PROBE_TIMEOUT_S = 120


class XlaFlagsError(ValueError):
    """Bad `--xla-cpu-flags`: unknown preset, a flag XLA rejects, or a backend already started."""


def resolve(value: str) -> str:
    """A preset name or a string of `--xla_*` flags -> the flag string."""
    if value in PRESETS:
        return PRESETS[value]
    flags = value.split()
    bad = [f for f in flags if not f.startswith("--xla_")]
    if bad or not flags:
        raise XlaFlagsError(f"--xla-cpu-flags: {value!r} is neither a preset "
                            f"({', '.join(PRESETS)}) nor a string of --xla_* flags")
    return " ".join(flags)


@functools.cache
def probe(flag: str) -> str | None:
    """None if this XLA accepts `flag` (a subprocess starts the CPU backend with it), else
    XLA's message."""
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    code = "import jax; jax.devices()"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=PROBE_TIMEOUT_S)
    if proc.returncode == 0:
        return None
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return (lines[-1] if lines else f"exit status {proc.returncode}")[:300]


def accepted(flags: str) -> dict[str, str | None]:
    """flag -> None (accepted) or XLA's message, for every flag of `flags`."""
    return {f: probe(f) for f in flags.split()}


def backend_started() -> bool:
    from jax._src import xla_bridge

    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if started is not None else bool(getattr(xla_bridge, "_backends", {}))


def apply(value: str) -> str:
    """Probe the flags of `value` (a preset or flag string), then append them to `XLA_FLAGS`.
    Returns the resulting `XLA_FLAGS`. Raises `XlaFlagsError` if a flag is rejected or if JAX
    has already started a backend."""
    flags = resolve(value)
    if backend_started():
        raise XlaFlagsError("--xla-cpu-flags: JAX's backend is already initialised; XLA_FLAGS "
                            "must be set before the first JAX computation")
    rejected = {f: msg for f, msg in accepted(flags).items() if msg is not None}
    if rejected:
        flag, msg = next(iter(rejected.items()))
        raise XlaFlagsError(f"--xla-cpu-flags: this XLA rejects {flag} ({msg})")
    current = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = " ".join(f for f in (current, flags) if f)
    return os.environ["XLA_FLAGS"]


def xla_flags_main(argv: list[str]) -> int:
    """`python -m zoo.bench xla-flags`: the presets and whether this XLA accepts their flags."""

    ArgumentParser(prog="python -m zoo.bench xla-flags",
                   description="the XLA:CPU flag presets, each flag probed").parse_args(argv)
    import jax

    print(f"jax {jax.__version__}: XLA:CPU flag presets (--xla-cpu-flags NAME)")
    for name, flags in PRESETS.items():
        print(f"  {name}")
        for flag, msg in accepted(flags).items():
            print(f"    {flag}: {'accepted' if msg is None else 'REJECTED ' + msg}")
        if not flags:
            print("    (XLA's defaults)")
    return 0
