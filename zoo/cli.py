"""What the command lines share: argument errors as one line."""

from __future__ import annotations

import argparse
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` whose errors are one ``error: ...`` line on stderr (exit 2);
    the usage is printed by ``--help`` only. Subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")
