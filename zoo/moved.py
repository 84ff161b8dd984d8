"""Module paths that moved: the old path still imports, with a DeprecationWarning that names the
new one (`import zoo.fast` -> `zoo.runtime.fast`). One finder on `sys.meta_path` serves every
moved path and its submodules; the old module is a view whose attributes are the new one's."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from typing import Any

MOVED = {"zoo.fast": "zoo.runtime.fast", "zoo.training": "zoo.runtime.training",
         "zoo.sharding": "zoo.runtime.sharding", "zoo.precision": "zoo.runtime.precision",
         "zoo.malloc": "zoo.runtime.malloc", "zoo.generation": "zoo.runtime.generation",
         "zoo.init": "zoo.weights.init", "zoo.adapters": "zoo.weights.adaptation",
         "zoo.hub": "zoo.weights.sources", "zoo.pretrained": "zoo.weights.pretrained",
         "converters.adapters.hub": "converters.adapters.config_readers"}


def new_name(name: str) -> str | None:
    """Where the module `name` lives now, None if it did not move."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return None


class _Moved(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self.__moved_to__), attr)

    def __dir__(self) -> list[str]:
        return dir(importlib.import_module(self.__moved_to__))


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of `MOVED` (and of their submodules)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self) if new_name(name) else None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _Moved(spec.name)
        module.__moved_to__ = new_name(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        warnings.warn(f"{module.__name__} moved to {module.__moved_to__}; import it from "
                      "there (the old path goes in a later release)", DeprecationWarning,
                      stacklevel=2)
        importlib.import_module(module.__moved_to__)


def install() -> None:
    """Put the finder on `sys.meta_path` (once)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
