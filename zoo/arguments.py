"""What the command lines share: argument errors as one line, numbers checked when parsed."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose errors are one ``error: ...`` line on stderr (exit 2);
    the usage is printed by ``--help`` only. Subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def bounded(kind: type[int] | type[float], low: float, *, strict: bool = False
            ) -> Callable[[str], int | float]:
    """argparse type: a number of `kind` at least `low` (above it when `strict`)."""
    what = f"{'an int' if kind is int else 'a number'} {'>' if strict else '>='} {low:g}"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value < low or (strict and value == low) or value != value:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    parse.__name__ = what  # argparse names the type in its messages
    return parse


positive_int = bounded(int, 1)
non_negative_int = bounded(int, 0)
positive_float = bounded(float, 0, strict=True)
non_negative_float = bounded(float, 0)
