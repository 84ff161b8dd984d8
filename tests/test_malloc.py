"""zoo.runtime.malloc: with freed memory kept, a jitted call's fresh 32 MiB buffers no longer cost a
page
fault per 4 KiB on every call (glibc on Linux); without it, they do (the reason it exists)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from zoo.runtime.malloc import KEEP

PROBE = """
import resource, sys
if sys.argv[1] == "keep":
    from zoo.runtime.malloc import keep_freed_memory
    print(keep_freed_memory())
import jax, jax.numpy as jnp  # the backend starts after the setting, as in zoo.bench
x = jnp.ones((8, 1024, 1024))  # 32 MiB
step = jax.jit(lambda x: jnp.sin(x.swapaxes(1, 2)) * 2 + x)  # a temporary and an output
for _ in range(20):  # the heap grows to its working size over the first calls
    step(x).block_until_ready()
windows = []  # the least of 5 windows: the host's reclaim may take back a page now and then
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        step(x).block_until_ready()
    windows.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
print(min(windows))
"""


def _faults_per_call(mode: str) -> tuple[float, str]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True, env={"PATH": "", "JAX_PLATFORMS": "cpu",
                                          "PYTHONPATH": ":".join(sys.path)}).stdout.splitlines()
    return float(out[-1]), out[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.cpu_only(reason="host buffers")
def test_fresh_buffers_stop_faulting():
    pages = 32 * 2**20 // 4096
    system, _ = _faults_per_call("system")
    kept, said = _faults_per_call("keep")
    assert system >= 0.9 * pages  # each call's buffers are new memory: a fault per page
    assert kept <= 0.1 * pages, said  # reused (measured: none)
    assert said == str({"applied": True, **KEEP})
