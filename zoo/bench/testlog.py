"""A pytest plugin (`-p zoo.bench.testlog`) that writes every test's outcome as it finishes.

`--test-log PATH`: one JSON line when collection ends (`{"collected": N}`), then one per test
when its teardown ends (`{"test": nodeid, "outcome": passed|failed|error|skipped, "s":
seconds, "message": first line}`), flushed at once: a run stopped or killed at any point still
reports what it did. `--stop-after S`: no test starts once S seconds have passed since the
session started; the rest are left out and counted as `cut` (`summary`), so a capped run ends
within one test of its cap instead of walking thousands of skips.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

STOP_REASON = "time cap reached"
_STATE: dict[str, Any] = {"log": None, "stop_at": None, "session": None, "tests": {}}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("zoo test log")
    group.addoption("--test-log", default=None, metavar="PATH",
                    help="write each test's outcome to PATH (JSON lines) as it finishes")
    group.addoption("--stop-after", type=float, default=None, metavar="S",
                    help="start no test after S seconds; the rest are counted as cut")


def _write(line: dict[str, Any]) -> None:
    if _STATE["log"] is not None:
        _STATE["log"].write(json.dumps(line) + "\n")
        _STATE["log"].flush()


def pytest_sessionstart(session: pytest.Session) -> None:
    path = session.config.getoption("--test-log")
    stop = session.config.getoption("--stop-after")
    _STATE.update(session=session, tests={},
                  log=open(path, "w") if path else None,  # noqa: SIM115 (closed at the end)
                  stop_at=None if stop is None else time.time() + stop)


def pytest_collection_finish(session: pytest.Session) -> None:
    _write({"collected": len(session.items)})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _STATE["tests"].setdefault(report.nodeid, {"outcome": "passed", "s": 0.0,
                                                       "message": ""})
    entry["s"] += report.duration
    if report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        longrepr = report.longrepr
        entry["message"] = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
    elif report.failed:
        entry["outcome"] = "failed" if report.when == "call" else "error"
        crash = getattr(report.longrepr, "reprcrash", None)
        text = (crash.message if crash is not None else str(report.longrepr or "")).strip()
        entry["message"] = (text.splitlines() or [""])[0][:200]


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    entry = _STATE["tests"].pop(nodeid, None)
    if entry is not None:
        _write({"test": nodeid, **entry})
    session = _STATE["session"]
    if _STATE["stop_at"] is not None and time.time() > _STATE["stop_at"] and session:
        session.shouldstop = STOP_REASON


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _STATE["log"] is not None:
        _STATE["log"].close()
        _STATE["log"] = None


def summary(path: str) -> dict[str, Any]:
    """Counts of a test log (a line cut by a kill is left out): tests collected, passed,
    failed, errors, skipped, cut (collected, never finished), with the failures' first lines."""
    counts = {"collected": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    with open(path) as f:
        for line in f:
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if "collected" in item:
                counts["collected"] = item["collected"]
                continue
            key = {"error": "errors"}.get(item["outcome"], item["outcome"])
            counts[key] += 1
            if key in ("failed", "errors"):
                failures.append(f"{item['test']}: {item['message'] or key}")
    done = counts["passed"] + counts["failed"] + counts["errors"] + counts["skipped"]
    return {**counts, "cut": max(0, counts["collected"] - done), "failures": failures}
