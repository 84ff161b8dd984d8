"""Progress of long work: rich's live bars on a terminal, plain lines elsewhere.

rich redraws its bars only on a terminal: with the output redirected (a log file, CI, `| tee`)
a transient bar prints nothing until the work ends. `progress(console, ...)` gives rich's
`Progress` on a terminal and a `LineProgress` otherwise, which prints a line when a task
starts, at most every `interval` seconds while it advances, and when it completes.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["LineProgress", "progress"]


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _size(n: float) -> str:
    for factor, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= factor:
            return f"{n / factor:.1f} {unit}"
    return f"{int(n)} B"


class LineProgress:
    """The part of rich's `Progress` API the zoo uses, printing plain lines to `console`.

    `in_bytes`: counts are bytes (shown as MiB/GiB, with the rate).
    """

    def __init__(self, console: Any, *, interval: float = 10.0, in_bytes: bool = False,
                 clock: Any = time.monotonic) -> None:
        self.console, self.interval, self.in_bytes, self.clock = console, interval, in_bytes, clock
        self.tasks: dict[int, dict[str, Any]] = {}

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **_: Any) -> int:
        now = self.clock()
        task = len(self.tasks)
        self.tasks[task] = {"description": description, "total": total, "completed": 0,
                            "start": now, "printed": now, "done": False}
        self._print(description + ("" if total is None else f": 0/{self._count(total)}"))
        return task

    def advance(self, task: int, advance: float = 1) -> None:
        self.update(task, completed=self.tasks[task]["completed"] + advance)

    def update(self, task: int, *, completed: float | None = None, total: float | None = None,
               **_: Any) -> None:
        t = self.tasks[task]
        if total is not None:
            t["total"] = total
        if completed is not None:
            t["completed"] = completed
        now = self.clock()
        finished = t["total"] is not None and t["completed"] >= t["total"]
        if finished and not t["done"]:
            t["done"] = True
        elif finished or now - t["printed"] < self.interval:
            return
        t["printed"] = now
        self._print(self._line(t, now))

    def remove_task(self, task: int) -> None:
        self.tasks[task]["done"] = True

    def _count(self, n: float) -> str:
        return _size(n) if self.in_bytes else f"{n:g}"

    def _line(self, t: dict[str, Any], now: float) -> str:
        elapsed = now - t["start"]
        done, total = t["completed"], t["total"]
        line = f"{t['description']}: {self._count(done)}"
        if total:
            line += f"/{self._count(total)} ({done / total:.0%})"
        line += f", {_clock(elapsed)} elapsed"
        if self.in_bytes and elapsed > 0:
            line += f", {_size(done / elapsed)}/s"
        if total and 0 < done < total and elapsed > 0:
            line += f", ETA {_clock(elapsed * (total - done) / done)}"
        return line

    def _print(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False)


def progress(console: Any, *columns: Any, transient: bool = True, in_bytes: bool = False,
             interval: float = 10.0) -> Any:
    """rich's `Progress(*columns)` on `console` if it is a terminal, else a `LineProgress`."""
    if console.is_terminal:
        from rich.progress import Progress

        return Progress(*columns, console=console, transient=transient)
    return LineProgress(console, interval=interval, in_bytes=in_bytes)
