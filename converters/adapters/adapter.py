"""A foreign layout as data: `Adapter` renames keys between a foreign state dict and the zoo's
canonical names, fuses separate tensors into one (q, k, v into `qkv`) or splits one into
unequal parts (a packed q / kv projection), changes values on the way (`Transform`: a
transpose, a reshape, ...), drops foreign keys the zoo has no place for (with the reason), and
reads scanned checkpoints (one tensor per layer type, the layers stacked on its first axis);
`Stack` gathers per-index tensors (a mixture's experts stored one by one) into one stacked
tensor.

Key templates use placeholders: `{i}` and `{j}` are indices (digits), `{p}` a parameter name
(`weight`, `bias`), `{r}` any rest of a key (for drops). A zoo template may offset an index,
`{i+1}` (a foreign layout numbering its stages from another place). A rule pairs a foreign
template with a zoo template using the same placeholders, so one declaration serves both
directions; a rule whose transform has no inverse makes the layout read only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from canonical.errors import ConversionError

_PLACEHOLDERS = {"i": r"\d+", "j": r"\d+", "p": r"[A-Za-z_]+", "r": r".+"}
_SLOT = re.compile(r"\{(\w)([+-]\d+)?\}")


class AdapterError(ConversionError):
    """A state recognized as a foreign layout that cannot be adapted (names what is missing)."""


@dataclass(frozen=True)
class _Template:
    """A compiled key template: its regex and the offsets of its index placeholders."""

    text: str
    pattern: re.Pattern[str]
    offsets: tuple[tuple[str, int], ...]

    def match(self, key: str) -> dict[str, str] | None:
        m = self.pattern.match(key)
        if m is None:
            return None
        slots = m.groupdict()
        for name, offset in self.offsets:
            value = int(slots[name]) - offset
            if value < 0:
                return None
            slots[name] = str(value)
        return slots

    def fill(self, slots: Mapping[str, str]) -> str:
        return _fill(self.text, slots)


def _compile(template: str) -> _Template:
    parts, offsets, pos = [], [], 0
    for m in _SLOT.finditer(template):
        name, offset = m.group(1), int(m.group(2) or 0)
        parts += [re.escape(template[pos:m.start()]), f"(?P<{name}>{_PLACEHOLDERS[name]})"]
        if offset:
            offsets.append((name, offset))
        pos = m.end()
    parts.append(re.escape(template[pos:]))
    return _Template(template, re.compile("".join(parts) + r"\Z"), tuple(offsets))


def _fill(template: str, slots: Mapping[str, str]) -> str:
    """`template` with its placeholders filled from `slots` (offsets added)."""
    return _SLOT.sub(lambda m: str(int(slots[m.group(1)]) + int(m.group(2)))
                     if m.group(2) else slots[m.group(1)], template)


# --------------------------------------------------------------------------- values
@dataclass(frozen=True)
class Transform:
    """A value change of one tensor: `to_zoo(array)` and its inverse `to_foreign(array)` (None:
    the layout is read only, e.g. a reshape whose inverse needs the number of heads)."""

    name: str
    to_zoo: Callable[[np.ndarray], np.ndarray]
    to_foreign: Callable[[np.ndarray], np.ndarray] | None = None


def reshape(zoo: tuple[int, ...], foreign: tuple[int, ...]) -> Transform:
    """The same values in another shape (`-1` once in each): CLIP's class embedding `(E,)` is
    the zoo's class token `(1, 1, E)`."""
    return Transform(f"reshape {foreign} -> {zoo}", lambda a: np.reshape(a, zoo),
                     lambda a: np.reshape(a, foreign))


LEADING = Transform("(N, E) -> (1, N, E)", lambda a: np.asarray(a)[None],
                    lambda a: np.asarray(a)[0])  # an embedding table as a position embedding
TRANSPOSE = Transform("transpose", lambda a: np.asarray(a).T, lambda a: np.asarray(a).T)
# Flax / big_vision layouts (read only where the inverse needs the number of heads):
CONV_KERNEL = Transform("(kh, kw, in, out) -> (out, in, kh, kw)",
                        lambda a: np.asarray(a).transpose(3, 2, 0, 1),
                        lambda a: np.asarray(a).transpose(2, 3, 1, 0))
HEADS_IN = Transform("(E, heads, D) -> (heads * D, E)",
                     lambda a: np.asarray(a).reshape(a.shape[0], -1).T)
HEADS_OUT = Transform("(heads, D, E) -> (E, heads * D)",
                      lambda a: np.asarray(a).reshape(-1, a.shape[-1]).T)
FLATTEN = Transform("flatten", lambda a: np.asarray(a).reshape(-1))


def _to_zoo(transform: Transform | None, a: Any) -> Any:
    return a if transform is None else transform.to_zoo(np.asarray(a))


def _to_foreign(transform: Transform | None, a: Any, what: str) -> np.ndarray:
    if transform is None:
        return np.asarray(a)
    if transform.to_foreign is None:
        raise AdapterError(f"{what}: its values are changed one way only "
                           f"({transform.name}): the layout is read, not written")
    return transform.to_foreign(np.asarray(a))


# --------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class Rename:
    """`foreign` <-> `zoo`, one tensor each way (its values changed by `transform`)."""

    foreign: str
    zoo: str
    transform: Transform | None = None


@dataclass(frozen=True)
class Fuse:
    """Several foreign tensors (`parts`, in order, each changed by `transform`) concatenated
    along axis 0 into one zoo tensor (`zoo`); split into equal parts the other way. `label`
    names the parts in errors."""

    parts: tuple[str, ...]
    zoo: str
    label: str
    transform: Transform | None = None


@dataclass(frozen=True)
class Split:
    """One foreign tensor (`foreign`, changed by `transform`) split along axis 0 into zoo
    tensors (`parts`) of relative sizes `sizes` (a packed q/k/v into the zoo's `q` and `kv`:
    (1, 2)); concatenated the other way."""

    foreign: str
    parts: tuple[str, ...]
    sizes: tuple[int, ...]
    transform: Transform | None = None


@dataclass(frozen=True)
class Stack:
    """Per-index foreign tensors stacked on a new leading axis into one zoo tensor (a
    mixture's experts, `{j}` their index): for each index the `parts` (in order) concatenated
    along axis 0, then the indices `0 .. n-1` stacked; unstacked and split into equal parts
    the other way. `label` names the parts in errors."""

    parts: tuple[str, ...]
    zoo: str
    label: str


@dataclass(frozen=True)
class Drop:
    """Foreign keys the zoo has no place for, left out on reading (`reason` says why: a buffer
    derived from the config, a token used only in pre-training, a pooler timm's model has
    not); nothing is written for them."""

    foreign: str
    reason: str


Rule = Rename | Fuse | Split | Stack | Drop


@dataclass(frozen=True)
class Adapter:
    """One foreign layout: `renames`, `fuses`, `splits` and `drops` between its keys and the
    zoo's canonical keys of `arch`. `prefix`: a start of foreign keys that a bare backbone
    leaves out (`to_zoo` also tries each key with it). `strip`: starts of foreign keys removed
    before the rules (the first that fits: a training state's `opt/target/`, big_vision's
    `params/img/`). `unstack`: (stacked, per layer) key starts of scanned checkpoints: a key
    under `stacked` holds every layer on its first axis and reads as the per-layer keys
    (`{i}` in the per-layer start). `groups`: (key fragment, what it is) pairs that must each
    match some key; a refusal names the missing ones (the embeddings)."""

    name: str
    description: str
    arch: str
    renames: tuple[Rename, ...]
    fuses: tuple[Fuse, ...] = ()
    prefix: str = ""
    groups: tuple[tuple[str, str], ...] = field(default=())
    splits: tuple[Split, ...] = ()
    drops: tuple[Drop, ...] = ()
    strip: tuple[str, ...] = ()
    unstack: tuple[tuple[str, str], ...] = ()
    stacks: tuple[Stack, ...] = ()

    @cached_property
    def _rules(self) -> list[tuple[_Template, Rule, int]]:
        out: list[tuple[_Template, Rule, int]] = [(_compile(t), s, n) for s in self.stacks
                                                  for n, t in enumerate(s.parts)]
        out += [(_compile(r.foreign), r, 0) for r in self.renames]
        out += [(_compile(t), f, n) for f in self.fuses for n, t in enumerate(f.parts)]
        out += [(_compile(s.foreign), s, 0) for s in self.splits]
        out += [(_compile(d.foreign), d, 0) for d in self.drops]
        return out

    @cached_property
    def _zoo_rules(self) -> list[tuple[_Template, Rule, int]]:
        out: list[tuple[_Template, Rule, int]] = [(_compile(r.zoo), r, 0)
                                                  for r in (*self.stacks, *self.renames,
                                                            *self.fuses)]
        out += [(_compile(t), s, n) for s in self.splits for n, t in enumerate(s.parts)]
        return out

    @property
    def writable(self) -> bool:
        """Whether every value change has an inverse (the zoo's state can be written back)."""
        transforms = [r.transform for r in (*self.renames, *self.fuses, *self.splits)]
        return all(t is None or t.to_foreign is not None for t in transforms)

    def _stripped(self, key: str) -> str:
        return next((key[len(s):] for s in self.strip if key.startswith(s)), key)

    def _keys(self, key: str) -> list[str]:
        """The names a foreign key is read under: stripped, and one per layer's name (the
        first layer's, for coverage) when it is stacked."""
        key = self._stripped(key)
        for stacked, per_layer in self.unstack:
            if key.startswith(stacked):
                return [_fill(per_layer, {"i": "0"}) + key[len(stacked):]]
        return [key]

    def _rule_of(self, key: str) -> tuple[Rule, int, dict[str, str]] | None:
        for candidate in (key, self.prefix + key) if self.prefix else (key,):
            for template, rule, n in self._rules:
                slots = template.match(candidate)
                if slots is not None:
                    return rule, n, slots
        return None

    def coverage(self, keys: Iterable[str]) -> float:
        """The fraction of `keys` this layout has a rule for (0 for no keys)."""
        keys = list(keys)
        return (sum(self._rule_of(self._keys(k)[0]) is not None for k in keys) / len(keys)
                if keys else 0.0)

    def _expanded(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """`state` under the names the rules read: prefixes stripped, stacked layers apart."""
        out: dict[str, Any] = {}
        for key, value in state.items():
            key = self._stripped(key)
            stacked = next(((s, p) for s, p in self.unstack if key.startswith(s)), None)
            if stacked is None:
                out[key] = value
                continue
            value = np.asarray(value)
            for i in range(value.shape[0]):
                out[_fill(stacked[1], {"i": str(i)}) + key[len(stacked[0]):]] = value[i]
        return out

    def to_zoo(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The zoo's canonical state of a foreign `state` (a new dict; arrays shared where not
        changed). AdapterError names every key without a rule and every incomplete fuse."""
        absent = self.missing_groups(state)
        if absent:
            raise AdapterError(f"{self.description}: no {' and no '.join(absent)} in the "
                               f"checkpoint")
        out: dict[str, Any] = {}
        pending: dict[tuple[Fuse, str], dict[int, Any]] = {}
        stacked: dict[tuple[Stack, str], dict[tuple[int, int], Any]] = {}
        unknown = []
        for key, value in self._expanded(state).items():
            found = self._rule_of(key)
            if found is None:
                unknown.append(key)
                continue
            rule, n, slots = found
            if isinstance(rule, Stack):
                stacked.setdefault((rule, _fill(rule.zoo, slots)), {})[
                    (int(slots["j"]), n)] = value
            elif isinstance(rule, Rename):
                out[_fill(rule.zoo, slots)] = _to_zoo(rule.transform, value)
            elif isinstance(rule, Fuse):
                pending.setdefault((rule, _fill(rule.zoo, slots)), {})[n] = (value, slots)
            elif isinstance(rule, Split):
                out.update(self._split(rule, key, _to_zoo(rule.transform, value), slots))
        if unknown:
            raise AdapterError(f"{self.description}: {len(unknown)} key(s) have no place in the "
                               f"zoo's {self.arch}: " + ", ".join(map(repr, unknown[:6]))
                               + (" ..." if len(unknown) > 6 else ""))
        for (fuse, zoo_key), parts in pending.items():
            if len(parts) != len(fuse.parts):
                slots = next(iter(parts.values()))[1]
                names = [_fill(t, slots) for t in fuse.parts]
                missing = [n for i, n in enumerate(names) if i not in parts]
                raise AdapterError(f"{self.description}: {fuse.label} are stored apart and "
                                   f"{', '.join(map(repr, missing))} is missing (have "
                                   f"{', '.join(repr(names[i]) for i in sorted(parts))})")
            out[zoo_key] = np.concatenate([np.asarray(_to_zoo(fuse.transform, parts[i][0]))
                                           for i in range(len(parts))])
        for (rule, zoo_key), parts in stacked.items():
            out[zoo_key] = self._stacked(rule, zoo_key, parts)
        return out

    def _stacked(self, rule: Stack, zoo_key: str, parts: dict[tuple[int, int], Any]
                 ) -> np.ndarray:
        """The zoo tensor of a `Stack`: every index's parts concatenated, then stacked."""
        count = 1 + max(j for j, _ in parts)
        missing = [(j, n) for j in range(count) for n in range(len(rule.parts))
                   if (j, n) not in parts]
        if missing:
            raise AdapterError(f"{self.description}: {rule.label} of {zoo_key!r} are stored "
                               f"apart and {len(missing)} are missing (index, part): "
                               f"{missing[:6]}")
        return np.stack([np.concatenate([np.asarray(parts[(j, n)])
                                         for n in range(len(rule.parts))])
                         for j in range(count)])

    def _split(self, rule: Split, key: str, value: Any, slots: dict[str, str]
               ) -> dict[str, np.ndarray]:
        a = np.asarray(value)
        total = sum(rule.sizes)
        if a.shape[0] % total:
            raise AdapterError(f"{self.description}: {key!r} has {a.shape[0]} rows, which do "
                               f"not split as {rule.sizes}")
        unit = a.shape[0] // total
        cuts = np.cumsum([s * unit for s in rule.sizes])[:-1]
        return {_fill(t, slots): part for t, part in zip(rule.parts, np.split(a, cuts),
                                                         strict=True)}

    def from_zoo(self, state: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The foreign state dict of a zoo canonical `state` (a new dict, foreign key order of
        the zoo's keys; stacked layers written one key per layer, no prefix stripped on
        reading added). AdapterError names a zoo key this layout cannot hold, or a value
        changed one way only."""
        out: dict[str, np.ndarray] = {}
        pending: dict[tuple[Split, str], dict[int, Any]] = {}
        for key, value in state.items():
            hit = next(((slots, rule, n) for t, rule, n in self._zoo_rules
                        if (slots := t.match(key)) is not None), None)
            if hit is None:
                raise AdapterError(f"{self.description} has no place for the zoo key {key!r}")
            slots, rule, n = hit
            if isinstance(rule, Stack):
                for j, one in enumerate(np.asarray(value)):
                    for t, part in zip(rule.parts, np.split(one, len(rule.parts)), strict=True):
                        out[_fill(t, {**slots, "j": str(j)})] = part
            elif isinstance(rule, Rename):
                out[_fill(rule.foreign, slots)] = _to_foreign(rule.transform, value, key)
            elif isinstance(rule, Fuse):
                for t, part in zip(rule.parts, np.split(np.asarray(value), len(rule.parts)),
                                   strict=True):
                    out[_fill(t, slots)] = _to_foreign(rule.transform, part, key)
            else:
                foreign = _fill(rule.foreign, slots)
                pending.setdefault((rule, foreign), {})[n] = np.asarray(value)
                if len(pending[(rule, foreign)]) == len(rule.parts):
                    parts = pending.pop((rule, foreign))
                    out[foreign] = _to_foreign(rule.transform, np.concatenate(
                        [parts[i] for i in range(len(rule.parts))]), key)
        for (rule, foreign), parts in pending.items():
            missing = [t for i, t in enumerate(rule.parts) if i not in parts]
            raise AdapterError(f"{self.description}: {foreign!r} needs the zoo's "
                               f"{', '.join(missing)} too")
        return out

    def dropped(self, keys: Iterable[str]) -> dict[str, str]:
        """The keys of `keys` this layout leaves out on reading, with the reason."""
        out = {}
        for key in keys:
            found = self._rule_of(self._keys(key)[0])
            if found is not None and isinstance(found[0], Drop):
                out[key] = found[0].reason
        return out

    def missing_groups(self, keys: Iterable[str]) -> list[str]:
        """The `groups` none of whose keys is present (for a refusal naming them)."""
        keys = list(keys)
        return [words for fragment, words in self.groups if not any(fragment in k for k in keys)]
