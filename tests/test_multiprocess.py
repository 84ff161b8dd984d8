"""Multi-process data parallelism: 2 processes on 127.0.0.1 (`jax.distributed`, gloo, 2 CPU
devices each) train a zoo model as one process with 4 devices does (tests/multiprocess_worker.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from zoo.testing import assert_close

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.multiprocess_worker", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _results(procs: list[subprocess.Popen]) -> list[dict]:
    """Each process's JSON; every process is killed if one fails or runs past the timeout."""
    try:
        outs = [p.communicate(timeout=TIMEOUT) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"a worker ran past {TIMEOUT} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def test_two_processes_train_as_one():
    port = str(_free_port())
    two = _results([_start("--processes", "2", "--process-id", str(i), "--port", port)
                    for i in range(2)])
    (one,) = _results([_start("--processes", "1")])
    assert one["processes"] == 1 and one["devices"] == 4
    for run in two:
        assert run["processes"] == 2 and run["devices"] == 4
        assert_close(run["losses"], one["losses"])
        assert_close(run["params"], one["params"])
    assert one["losses"][1] != one["losses"][0]  # the step trained
