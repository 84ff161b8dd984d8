"""Nesting evidence: where a source nests its layers in scopes (Flax's `ResNetBlock_3`,
holding `Conv_0`, `BatchNorm_1`, `conv_proj`), the scopes say which layers belong together.

1. **scopes pair with scopes**: a source scope pairs with the target scope (any dotted prefix
   of the target's names, `layer2.0`) holding exactly the same kinds and shapes, inside the
   target scope of its parent, consistent with the layers already paired; where several fit,
   numbered sibling scopes of one template (`ResNetBlock_0`, `ResNetBlock_1`, ...) pair with
   them in order, and nothing else does;
2. **layers inside a scope pair** pair by a shape unique in the pair, then by the numbers of
   same-template siblings (`Conv_0` before `Conv_1`), then by analogy: a name relative to its
   scope (`BatchNorm_0`) pairs with the relative target name (`bn1`) it pairs with in every
   other scope pair of the same template where that was decided;
3. what is left at the top pairs by a shape unique among the top's unpaired layers.

Nothing here pairs by sorted names: where this evidence does not decide, the layers stay
unpaired and the matcher reports them as ambiguous.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

RULE = "nesting"


def _scopes(key: str) -> list[str]:
    """The proper dotted prefixes of `key`, outermost first ("" is the top)."""
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _inside(name: str, scope: str) -> bool:
    return not scope or name.startswith(scope + ".")


def _relative(name: str, scope: str) -> str:
    return name[len(scope) + 1:] if scope else name


def _template(name: str) -> str:
    return re.sub(r"\d+", "#", name)


def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


class Nesting:
    """The nesting pass over a `converters.matching.match._Matcher` `m` (its `sources`,
    `targets`, `fits`, `pair`, `pairs`, `taken`)."""

    def __init__(self, m: Any):
        self.m = m
        sigs = {self.tsig(t) for t in m.targets}
        self.ssig = {s.key: self._source_sig(s, sigs) for s in m.sources}
        self.order = {t.name: i for i, t in enumerate(m.targets)}
        self.scope_pairs: dict[str, str] = {"": ""}
        self.sig_of: dict[tuple[str, str], Counter] = {}

    @staticmethod
    def tsig(t: Any) -> tuple:
        return (t.kind, tuple(sorted(t.shapes.items())))

    @staticmethod
    def _source_sig(s: Any, sigs: set[tuple]) -> tuple | None:
        for kind in s.kinds:
            shapes = s.shapes(kind)
            if shapes is not None and (kind, tuple(sorted(shapes.items()))) in sigs:
                return (kind, tuple(sorted(shapes.items())))
        return None

    # ----------------------------------------------------------------- scopes
    def source_scopes(self) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        for s in self.m.sources:
            for scope in _scopes(s.key):
                out.setdefault(scope, []).append(s)
        return out

    def target_scopes(self) -> dict[str, list[Any]]:
        """Target scopes by their layers; of scopes holding the same layers, the deepest."""
        out: dict[str, list[Any]] = {}
        for t in self.m.targets:
            for scope in _scopes(t.name):
                out.setdefault(scope, []).append(t)
        deepest: dict[frozenset, str] = {}
        for scope in sorted(out, key=lambda n: n.count(".")):
            deepest[frozenset(t.name for t in out[scope])] = scope
        return {scope: out[scope] for scope in deepest.values()}

    def _fits_scope(self, s_scope: str, members: list[Any], t_scope: str,
                    t_members: list[Any], paired_from: dict[str, str]) -> bool:
        if self.sig_of[("s", s_scope)] != self.sig_of[("t", t_scope)]:
            return False
        for k, t in self.scope_pairs.items():  # nested as the scopes paired already
            if not k:
                continue
            if _inside(s_scope, k) != _inside(t_scope, t) or (
                    _inside(k, s_scope) != _inside(t, t_scope)):
                return False
        inside = {t.name for t in t_members}
        for s in members:  # layers paired already must agree with the scope pair
            if s.key in self.m.pairs and self.m.pairs[s.key][0].name not in inside:
                return False
        return all(_inside(paired_from[t.name], s_scope) for t in t_members
                   if t.name in paired_from)

    def pair_scopes(self) -> None:
        sources, targets = self.source_scopes(), self.target_scopes()
        sources = {k: v for k, v in sources.items() if all(self.ssig[s.key] for s in v)}
        self.sig_of = {("s", k): Counter(self.ssig[s.key] for s in v) for k, v in sources.items()}
        self.sig_of.update({("t", k): Counter(map(self.tsig, v)) for k, v in targets.items()})
        changed = True
        while changed:
            changed = False
            used = set(self.scope_pairs.values())
            paired_from = {t.name: src for src, (t, _) in self.m.pairs.items()}
            todo = [k for k in sources if k not in self.scope_pairs]
            cands = {k: [t for t in targets if t not in used and self._fits_scope(
                k, sources[k], t, targets[t], paired_from)] for k in todo}
            families: dict[tuple, list[str]] = {}
            for k in todo:
                key = (k.rpartition(".")[0], _template(k), tuple(cands[k]))
                families.setdefault(key, []).append(k)
            for (_, template, found), family in families.items():
                if not found or len(found) != len(family):
                    continue
                if any(cands[k] and set(cands[k]) <= set(found) for k in todo
                       if k not in family):
                    continue  # another scope fits only these places too: no guess
                if len(family) > 1 and "#" not in template.rpartition(".")[2]:
                    continue  # several equal candidates and no numbers to order them by
                ordered = sorted(found, key=lambda t: min(self.order[x.name]
                                                          for x in targets[t]))
                for k, t in zip(sorted(family, key=_natural), ordered, strict=True):
                    self.scope_pairs[k] = t
                changed = True
                break

    # ----------------------------------------------------------------- layers
    def free_in(self, s_scope: str, t_scope: str) -> tuple[list[Any], list[Any]]:
        """The unpaired layers of a scope pair not inside a deeper paired scope."""
        deeper_s = [k for k in self.scope_pairs if k != s_scope and _inside(k, s_scope)]
        deeper_t = [self.scope_pairs[k] for k in deeper_s]
        sources = [s for s in self.m.sources if s.key not in self.m.pairs
                   and _inside(s.key, s_scope) and not any(_inside(s.key, k) for k in deeper_s)]
        targets = [t for t in self.m.targets if t.name not in self.m.taken
                   and _inside(t.name, t_scope) and not any(_inside(t.name, k)
                                                            for k in deeper_t)]
        return sources, targets

    def by_shape(self, sources: list[Any], targets: list[Any]) -> bool:
        for t in targets:
            fit = [s for s in sources if self.m.fits(s, t)]
            if len(fit) == 1 and sum(self.m.fits(fit[0], u) for u in targets) == 1:
                self.m.pair(fit[0], t, RULE)
                return True
        return False

    def by_numbers(self, scope: str, sources: list[Any], targets: list[Any]) -> bool:
        groups: dict[tuple, list[Any]] = {}
        for t in targets:
            groups.setdefault(self.tsig(t), []).append(t)
        for group in groups.values():
            fit = [s for s in sources if self.m.fits(s, group[0])]
            names = [_relative(s.key, scope) for s in fit]
            if (len(group) > 1 and len(fit) == len(group)
                    and len({_template(n) for n in names}) == 1 and "#" in _template(names[0])):
                ordered = sorted(group, key=lambda t: self.order[t.name])
                for s, t in zip(sorted(fit, key=lambda s: _natural(s.key)), ordered,
                                strict=True):
                    self.m.pair(s, t, RULE)
                return True
        return False

    def by_analogy(self, s_scope: str, t_scope: str, sources: list[Any],
                   targets: list[Any]) -> bool:
        free = {t.name: t for t in targets}
        siblings = [(k, v) for k, v in self.scope_pairs.items()
                    if k and k != s_scope and _template(k) == _template(s_scope)]
        for s in sources:
            rel = _relative(s.key, s_scope)
            seen = set()
            for k, v in siblings:
                hit = self.m.pairs.get(f"{k}.{rel}")
                if hit is not None:
                    seen.add(_relative(hit[0].name, v) if _inside(hit[0].name, v) else None)
            if len(seen) == 1 and None not in seen:
                t = free.get(f"{t_scope}.{seen.pop()}")
                if t is not None and self.m.fits(s, t):
                    self.m.pair(s, t, RULE)
                    return True
        return False

    def run(self) -> None:
        self.pair_scopes()
        inner = sorted((k for k in self.scope_pairs if k), key=lambda k: -k.count("."))
        if not inner:
            return  # no nesting to go by: the flat rules decide
        changed = True
        while changed:
            changed = False
            for k in inner:
                sources, targets = self.free_in(k, self.scope_pairs[k])
                if sources and (self.by_shape(sources, targets)
                                or self.by_numbers(k, sources, targets)
                                or self.by_analogy(k, self.scope_pairs[k], sources, targets)):
                    changed = True
        while self.by_shape(*self.free_in("", "")):
            pass


def by_nesting(m: Any) -> None:
    """Pair what the nesting of the source's scopes decides (see the module doc)."""
    Nesting(m).run()
