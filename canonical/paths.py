"""Key paths as dotted canonical names."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def key_name(key: Any) -> str:
    """One entry of a JAX key path (attribute, dict key, sequence index) as a string."""
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def path_name(path: Iterable[Any]) -> str:
    """A JAX key path (or a tuple of names and indices) as a dotted name: ``blocks.0.fc``."""
    return ".".join(key_name(k) for k in path)


def join(prefix: str, key: str) -> str:
    """`prefix.key`; an empty part is left out (key '' names the layer itself)."""
    return ".".join(p for p in (prefix, key) if p)
