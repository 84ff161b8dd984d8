"""Match the layers of a foreign source to those of a target, evidence in a fixed order:

1. **map**: an explicit user rule ``SRC=DST`` (a regular expression on the source key, fully
   matched, and its replacement, e.g. ``Dense_(\\d+)=fc\\1``): it overrides every other rule;
2. **name**: the source key is the target's canonical name (after `strip`/`add` prefix rules,
   or the longest prefix all source keys share, such as HF's ``model.``); a name whose layer
   has another kind or shape is no match (not a veto: structure may still pair it);
3. **shape**: the only layer of the target's kind with exactly these canonical shapes;
4. **order**: layers of the same kind and shapes, paired in source order, which counts as
   evidence only where the source keeps definition order (a torch state_dict, a live model)
   or the names number their layers (``Conv_0``, ``layers.2``, ``linear1``).

Anything else (two equally plausible candidates, a shape that fits no target layer, a layer
left over on either side) raises `MatchError` with the table and a suggested ``--map``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from canonical.errors import ConversionError
from canonical.kinds import Layer
from converters.matching.nesting import by_nesting
from converters.matching.sources import SourceLayer

Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class TargetLayer:
    """A layer of the target: canonical name, kind, canonical shapes, flatten fact."""

    name: str
    kind: str
    shapes: Shapes
    flatten_shape: tuple[int, ...] | None = None

    @classmethod
    def of(cls, layer: Layer, spec: dict[str, tuple[int, ...]]) -> TargetLayer:
        prefix = layer.name + "."
        shapes = {k[len(prefix):]: tuple(v) for k, v in spec.items() if k.startswith(prefix)}
        if layer.name in spec:  # a bare parameter
            shapes = {"": tuple(spec[layer.name])}
        return cls(layer.name, layer.kind, shapes, layer.flatten_shape)


@dataclass(frozen=True)
class Row:
    """One line of the mapping table (`target` / `rule` empty: unmatched)."""

    source: str
    target: str
    kind: str
    source_shape: tuple[int, ...] | None
    target_shape: tuple[int, ...] | None
    rule: str


class MatchError(ConversionError):
    """The layers could not be matched without a guess; `rows` is the table."""

    def __init__(self, message: str, rows: list[Row]):
        super().__init__(message + "\n" + render(rows))
        self.rows = rows


def _main_shape(shapes: Shapes | None) -> tuple[int, ...] | None:
    if not shapes:
        return None
    return shapes.get("weight", shapes.get("", next(iter(shapes.values()))))


def render(rows: Sequence[Row]) -> str:
    """The table as plain text (the CLI prints it with rich when it can)."""
    head = ("source", "target", "kind", "source shape", "target shape", "rule")
    lines = [tuple(map(str, (r.source, r.target or "-", r.kind or "?",
                             r.source_shape or "-", r.target_shape or "-", r.rule or "-")))
             for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*line).rstrip() for line in (head, *lines))


def _template(name: str) -> str:
    return re.sub(r"\d+", "#", name)


def _numbered(names: Sequence[str]) -> bool:
    """Names that differ only in their numbers (natural order is their index order)."""
    return len({_template(n) for n in names}) == 1 and len(set(names)) == len(names) and any(
        c.isdigit() for c in names[0])


def _parse_map(rule: str) -> tuple[re.Pattern[str], str]:
    src, sep, dst = rule.partition("=")
    if not sep or not src or not dst:
        raise ConversionError(f"--map {rule!r}: expected SRC=DST (a regular expression on the "
                              "source layer key and the target layer name)")
    try:
        return re.compile(src), dst
    except re.error as e:
        raise ConversionError(f"--map {rule!r}: bad regular expression ({e})") from e


def _shared_prefixes(keys: Sequence[str]) -> list[str]:
    """The prefixes (whole dotted parts) all keys share, longest first: ``model.layers.``, then
    ``model.`` for HF-style ``model.layers.0``."""
    parts = [k.split(".") for k in keys]
    common: list[str] = []
    for group in zip(*(p[:-1] for p in parts), strict=False):
        if len(set(group)) != 1:
            break
        common.append(group[0])
    return [".".join(common[:n]) + "." for n in range(len(common), 0, -1)]


class _Matcher:
    def __init__(self, sources: list[SourceLayer], targets: list[TargetLayer], ordered: bool):
        self.sources, self.targets, self.ordered = sources, targets, ordered
        self.by_name = {t.name: t for t in targets}
        self.pairs: dict[str, tuple[TargetLayer, str]] = {}  # source key -> (target, rule)
        self.taken: set[str] = set()
        self.problems: list[str] = []

    def fits(self, s: SourceLayer, t: TargetLayer) -> bool:
        return t.kind in s.kinds and s.shapes(t.kind) == t.shapes

    def pair(self, s: SourceLayer, t: TargetLayer, rule: str) -> None:
        self.pairs[s.key] = (t, rule)
        self.taken.add(t.name)

    def free(self) -> tuple[list[SourceLayer], list[TargetLayer]]:
        return ([s for s in self.sources if s.key not in self.pairs],
                [t for t in self.targets if t.name not in self.taken])

    def by_names(self, rename: dict[str, str], rule: str, strict: bool) -> None:
        for s in self.free()[0]:
            name = rename.get(s.key)
            t = self.by_name.get(name) if name is not None else None
            if t is None or t.name in self.taken:
                if strict and name is not None:
                    self.problems.append(f"{rule} sends {s.key!r} to {name!r}, which is "
                                         + ("taken" if t is not None else "no target layer"))
                continue
            if self.fits(s, t):
                self.pair(s, t, rule)
            elif strict:
                got = _main_shape(s.shapes(t.kind)) if t.kind in s.kinds else s.kinds
                self.problems.append(f"{s.key!r} -> {t.name!r} ({rule}): the target is a "
                                     f"{t.kind} of shape {_main_shape(t.shapes)}, the source "
                                     f"has {got}")

    def by_structure(self) -> None:
        changed = True
        while changed:  # a unique shape fit on both sides, until nothing changes
            changed = False
            sources, targets = self.free()
            for t in targets:
                fit = [s for s in sources if self.fits(s, t)]
                if len(fit) == 1 and sum(self.fits(fit[0], u) for u in targets) == 1:
                    self.pair(fit[0], t, "shape")
                    changed = True
                    break
        if not self.ordered:
            by_nesting(self)
        sources, targets = self.free()
        groups: dict[tuple, list[TargetLayer]] = {}
        for t in targets:
            groups.setdefault((t.kind, tuple(sorted(t.shapes.items()))), []).append(t)
        for group in groups.values():
            fit = [s for s in sources if self.fits(s, group[0]) and s.key not in self.pairs]
            if len(fit) > len(group):
                self.problems.append(
                    f"ambiguous: {[s.key for s in fit]} all fit {[t.name for t in group]} "
                    f"({group[0].kind}, shape {_main_shape(group[0].shapes)}): more candidates "
                    "than places; say which with --map")
                continue
            if len(fit) != len(group) or len(group) < 2:
                continue
            if self.ordered or _numbered([s.key for s in fit]):
                for s, t in zip(sorted(fit, key=lambda s: s.index), group, strict=True):
                    self.pair(s, t, "order")
            else:
                self.problems.append(
                    f"ambiguous: {[s.key for s in fit]} all fit {[t.name for t in group]} "
                    f"({group[0].kind}, shape {_main_shape(group[0].shapes)}) and the source "
                    "keeps no order: say which is which with --map")

    def likely_kind(self, s: SourceLayer) -> str:
        """For the table: a kind of the target with the source's array ranks, else the first
        candidate."""
        for t in self.targets:
            got = s.shapes(t.kind) if t.kind in s.kinds else None
            if got is not None and {k: len(v) for k, v in got.items()} == {
                    k: len(v) for k, v in t.shapes.items()}:
                return t.kind
        return s.kinds[0] if s.kinds else ""

    def rows(self) -> list[Row]:
        out = []
        for s in self.sources:
            t, rule = self.pairs.get(s.key, (None, ""))
            kind = t.kind if t else self.likely_kind(s)
            out.append(Row(s.key, t.name if t else "", kind, _main_shape(s.shapes(kind))
                           if kind else None, _main_shape(t.shapes) if t else None, rule))
        out += [Row("", t.name, t.kind, None, _main_shape(t.shapes), "")
                for t in self.targets if t.name not in self.taken]
        return out


def match(sources: list[SourceLayer], targets: list[TargetLayer], *, maps: Sequence[str] = (),
          strip: str = "", add: str = "", ordered: bool = False) -> list[Row]:
    """The mapping table source layer -> target layer, or `MatchError` (see the module doc).

    `maps`: ``SRC=DST`` rules; `strip` / `add`: a prefix removed from / put before every
    source key; `ordered`: the source lists its layers in definition order.
    """
    m = _Matcher(sources, targets, ordered)
    keys = [s.key for s in sources]
    unknown = [s.key for s in sources if not s.kinds]
    if unknown:
        leaves = {s.key: sorted(s.arrays) for s in sources if not s.kinds}
        raise MatchError(f"no layer kind holds the arrays of {unknown} ({leaves})", m.rows())
    for rule in maps:
        pattern, repl = _parse_map(rule)
        hits = {s.key: pattern.fullmatch(s.key) for s in m.free()[0]}
        try:
            rename = {k: hit.expand(repl) for k, hit in hits.items() if hit is not None}
        except (re.error, IndexError) as e:
            raise ConversionError(f"--map {rule!r}: bad replacement ({e})") from e
        if not rename:
            m.problems.append(f"--map {rule!r} matches no unmatched source key")
        m.by_names(rename, f"map {rule}", strict=True)
    renamed = {k: add + (k[len(strip):] if strip and k.startswith(strip) else k) for k in keys}
    m.by_names(renamed, "name", strict=False)
    named = any(rule == "name" for _, rule in m.pairs.values())
    prefixes = _shared_prefixes(keys) if not named and not strip and len(keys) > 1 else []
    # The shared prefix whose removal names the most target layers (HF's ``model.`` before
    # ``model.layers.``, whose removal would also strip the target's own ``layers.``).
    prefix = max(prefixes, key=lambda p: sum(add + k[len(p):] in m.by_name for k in keys),
                 default="")
    if prefix and any(add + k[len(prefix):] in m.by_name for k in keys):
        m.by_names({k: add + k[len(prefix):] for k in keys}, f"name ({prefix!r} stripped)", False)
    m.by_structure()
    rows = m.rows()
    left = [r for r in rows if not r.rule]
    if m.problems or left:
        lines = m.problems + [f"unmatched {'source' if r.source else 'target'} layer "
                              f"{r.source or r.target!r} ({r.kind}, shape "
                              f"{r.source_shape or r.target_shape})" for r in left]
        raise MatchError("cannot match the source's layers to the target's without a guess:\n  - "
                         + "\n  - ".join(lines) + "\n" + suggest(rows), rows)
    return rows


def suggest(rows: Sequence[Row], most: int = 4) -> str:
    """What to pass: a `--map` for an unmatched source whose kind and shape fit exactly one
    unmatched target (and that target no other source); where several fit, the candidates
    (never a pairing by sorted names); nothing for a layer whose shape fits no target (a map
    cannot fix a shape)."""
    src = [r for r in rows if r.source and not r.rule]
    dst = [r for r in rows if not r.source]

    def fit(a: Row, b: Row) -> bool:
        return a.kind == b.kind and a.source_shape == b.target_shape

    hints: list[str] = []
    open_: dict[tuple[str, ...], list[str]] = {}
    wanted = {t.target: sum(fit(s, t) for s in src) for t in dst}
    for s in src:
        cands = tuple(t.target for t in dst if fit(s, t))
        if len(cands) == 1 and wanted[cands[0]] == 1:
            hints.append(f"--map '{re.escape(s.source)}={cands[0]}'")
        elif cands:
            open_.setdefault(cands, []).append(s.source)
    lines = [f"fix: give the pairs explicitly: {' '.join(hints[:most])}"] if hints else []
    for cands, sources in list(open_.items())[:most]:
        lines.append(f"undecided: {sources} fit {list(cands)} alike (same kind and shape; "
                     "nothing in the source orders them): give one --map SRC=DST each, e.g. "
                     f"--map '{re.escape(sources[0])}=<one of those>'")
    if len(open_) > most:
        lines.append(f"... and {len(open_) - most} more such groups")
    return "\n".join(lines) if lines else (
        "fix: check --arch/--config (the layers or shapes differ), or give pairs with "
        "--map SRC=DST")
