"""A foreign layout as data: `Adapter` renames keys between a foreign state dict and the zoo's
canonical names, and fuses separate tensors into one (q, k, v into `qkv`) or splits them back.

Key templates use placeholders: `{i}` is a layer index (digits), `{p}` a parameter name
(`weight`, `bias`). A rule pairs a foreign template with a zoo template using the same
placeholders, so one declaration serves both directions. A rename may also change the array
by an exact two-way `Transform` (`Reshape`: torchvision's layer scale `(C, 1, 1)` is the zoo's
`(C,)`), declared once for both directions too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from canonical.errors import ConversionError

_PLACEHOLDERS = {"i": r"\d+", "p": r"[A-Za-z_]+"}


class AdapterError(ConversionError):
    """A state recognized as a foreign layout that cannot be adapted (names what is missing)."""


def _compile(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w)\}", template)
    regex = "".join(re.escape(p) if n % 2 == 0 else f"(?P<{p}>{_PLACEHOLDERS[p]})"
                    for n, p in enumerate(parts))
    return re.compile(regex + r"\Z")


class Transform(Protocol):
    """An exact change of an array between a foreign layout and the zoo's, both ways
    (`from_zoo(to_zoo(a))` is `a`, bitwise); `describe()` says what it does."""

    def to_zoo(self, a: Any) -> Any: ...

    def from_zoo(self, a: Any) -> Any: ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class Reshape:
    """The foreign array has shape `foreign`, the zoo's `zoo` (one -1 each for the size that
    follows from the other: `Reshape((-1, 1, 1), (-1,))`)."""

    foreign: tuple[int, ...]
    zoo: tuple[int, ...]

    def to_zoo(self, a: Any) -> Any:
        return np.asarray(a).reshape(self.zoo)

    def from_zoo(self, a: Any) -> Any:
        return np.asarray(a).reshape(self.foreign)

    def describe(self) -> str:
        show = lambda shape: "(" + ", ".join("C" if d == -1 else str(d) for d in shape) + (
            ",)" if len(shape) == 1 else ")")
        return f"reshaped {show(self.foreign)} <-> {show(self.zoo)}"


@dataclass(frozen=True)
class Rename:
    """`foreign` <-> `zoo`, one tensor each way; `transform` changes the array exactly on the
    way (None: the array as it is)."""

    foreign: str
    zoo: str
    transform: Transform | None = None


@dataclass(frozen=True)
class Fuse:
    """Several foreign tensors (`parts`, in order) concatenated along axis 0 into one zoo tensor
    (`zoo`); split into equal parts the other way. `label` names the parts in errors."""

    parts: tuple[str, ...]
    zoo: str
    label: str


@dataclass(frozen=True)
class Adapter:
    """One foreign layout: `renames` and `fuses` between its keys and the zoo's canonical keys
    of `arch`. `prefix`: a start of foreign keys that a bare backbone leaves out (`to_zoo`
    also tries each key with it). `groups`: (key fragment, what it is) pairs that must each
    match some key; a refusal names the missing ones (the embeddings, the classifier)."""

    name: str
    description: str
    arch: str
    renames: tuple[Rename, ...]
    fuses: tuple[Fuse, ...] = ()
    prefix: str = ""
    groups: tuple[tuple[str, str], ...] = field(default=())

    @cached_property
    def _rules(self) -> list[tuple[re.Pattern[str], str, Rename | Fuse, int]]:
        out: list[tuple[re.Pattern[str], str, Rename | Fuse, int]] = [
            (_compile(r.foreign), r.foreign, r, 0) for r in self.renames]
        out += [(_compile(t), t, f, n) for f in self.fuses for n, t in enumerate(f.parts)]
        return out

    def _rule_of(self, key: str) -> tuple[Rename | Fuse, int, dict[str, str]] | None:
        for candidate in (key, self.prefix + key) if self.prefix else (key,):
            for pattern, _, rule, n in self._rules:
                m = pattern.match(candidate)
                if m:
                    return rule, n, m.groupdict()
        return None

    def coverage(self, keys: Iterable[str]) -> float:
        """The fraction of `keys` this layout has a rule for (0 for no keys)."""
        keys = list(keys)
        return sum(self._rule_of(k) is not None for k in keys) / len(keys) if keys else 0.0

    def to_zoo(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The zoo's canonical state of a foreign `state` (a new dict; arrays shared where not
        fused). AdapterError names every key without a rule and every incomplete fuse."""
        absent = self.missing_groups(state)
        if absent:
            raise AdapterError(f"{self.description}: no {' and no '.join(absent)} in the "
                               f"checkpoint")
        out: dict[str, Any] = {}
        pending: dict[tuple[Fuse, str], dict[int, Any]] = {}
        unknown = []
        for key, value in state.items():
            found = self._rule_of(key)
            if found is None:
                unknown.append(key)
                continue
            rule, n, slots = found
            if isinstance(rule, Rename):
                out[rule.zoo.format(**slots)] = (value if rule.transform is None
                                                 else rule.transform.to_zoo(value))
            else:
                pending.setdefault((rule, rule.zoo.format(**slots)), {})[n] = (value, slots)
        if unknown:
            raise AdapterError(f"{self.description}: {len(unknown)} key(s) have no place in the "
                               f"zoo's {self.arch}: " + ", ".join(map(repr, unknown[:6]))
                               + (" ..." if len(unknown) > 6 else ""))
        for (fuse, zoo_key), parts in pending.items():
            if len(parts) != len(fuse.parts):
                slots = next(iter(parts.values()))[1]
                names = [t.format(**slots) for t in fuse.parts]
                missing = [n for i, n in enumerate(names) if i not in parts]
                raise AdapterError(f"{self.description}: {fuse.label} are stored apart and "
                                   f"{', '.join(map(repr, missing))} is missing (have "
                                   f"{', '.join(repr(names[i]) for i in sorted(parts))})")
            out[zoo_key] = np.concatenate([np.asarray(parts[i][0]) for i in range(len(parts))])
        return out

    def from_zoo(self, state: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The foreign state dict of a zoo canonical `state` (a new dict, foreign key order of
        the zoo's keys). AdapterError names a zoo key this layout cannot hold."""
        back = [(_compile(r.zoo), r) for r in (*self.renames, *self.fuses)]
        out: dict[str, np.ndarray] = {}
        for key, value in state.items():
            hit = next(((m, r) for p, r in back if (m := p.match(key))), None)
            if hit is None:
                raise AdapterError(f"{self.description} has no place for the zoo key {key!r}")
            m, rule = hit
            slots = m.groupdict()
            if isinstance(rule, Rename):
                out[rule.foreign.format(**slots)] = (
                    np.asarray(value) if rule.transform is None
                    else rule.transform.from_zoo(value))
                continue
            for t, part in zip(rule.parts, np.split(np.asarray(value), len(rule.parts)),
                               strict=True):
                out[t.format(**slots)] = part
        return out

    def missing_groups(self, keys: Iterable[str]) -> list[str]:
        """The `groups` none of whose keys is present (for a refusal naming them)."""
        keys = list(keys)
        return [words for fragment, words in self.groups if not any(fragment in k for k in keys)]
