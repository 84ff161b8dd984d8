"""`python -m converters` run in-process by the tests."""

from __future__ import annotations

from typing import Any

from converters.__main__ import main


def cli(capsys: Any, *args: object) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `python -m converters ARGS` (paths may be Paths)."""
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err
