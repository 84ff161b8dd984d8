"""Regenerate the pretrained tag table and the label sets (``zoo/weights/pretrained/data/``).

    python -m zoo.weights.pretrained.generate           # write tags.json and imagenet-1k.json
    python -m zoo.weights.pretrained.generate --check   # exit 1 (naming what differs) if stale

The tags come from the zoo's named models (`zoo.names`) and timm's registry: every tag with
weights on the Hub of every named model timm knows, each field as `get_pretrained_cfg` gives it
(the label set as `timm.data.infer_imagenet_subset` infers it); and from the configs'
`HUB_REPOS` (repositories timm does not list: language models). A family added to the zoo
gets its tags by running this command. Needs timm (the `dev` extra); reads no network.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from zoo.configs import CONFIGS, ConfigError, named_models
from zoo.weights.pretrained.labels import LABELS
from zoo.weights.pretrained.table import FIELDS, GENERATE, TABLE

INFORMATIONAL = ("timm_version",)  # recorded, not compared by --check


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def timm_tags(name: str) -> tuple[str, dict[str, dict[str, Any]]] | None:
    """(default tag, {tag: fields}) of `name` in timm's registry; None if timm has no such
    model or no tag of it is on the Hub."""
    import timm.models
    from timm.data import infer_imagenet_subset

    if not timm.models.is_model(name):
        return None
    out: dict[str, dict[str, Any]] = {}
    for full in timm.models.list_pretrained(f"{name}.*"):
        cfg = timm.models.get_pretrained_cfg(full).to_dict()
        if not cfg.get("hf_hub_id"):
            continue  # published at a URL only: not on the Hub
        fields = {f: _plain(cfg.get(f)) for f in FIELDS}
        fields.update(hub=cfg["hf_hub_id"], file=cfg.get("hf_hub_filename") or
                      "model.safetensors", library="timm",
                      label_set=infer_imagenet_subset(cfg) if cfg.get("num_classes") else None)
        out[full.partition(".")[2]] = fields
    if not out:
        return None
    default = timm.models.get_pretrained_cfg(name).tag
    if default not in out:
        default = next(iter(out))
    return default, {default: out[default], **{t: v for t, v in out.items() if t != default}}


def declared_tags(name: str, repos: dict[str, Any]) -> tuple[str, dict[str, dict[str, Any]]]:
    """The tags a config declares in `HUB_REPOS` for `name`: {tag: "ORG/REPO[@REV]"} or
    {tag: {"hub": ..., "library": ...}}; the first is the default."""
    if not repos or not isinstance(repos, dict):
        raise ConfigError(f"HUB_REPOS[{name!r}] must map tags to Hub repositories")
    out = {}
    for tag, spec in repos.items():
        spec = {"hub": spec} if isinstance(spec, str) else dict(spec)
        fields = dict.fromkeys(FIELDS)
        fields.update(file="model.safetensors", library="transformers")
        fields.update(spec)
        if set(fields) != set(FIELDS):
            raise ConfigError(f"HUB_REPOS[{name!r}][{tag!r}]: unknown fields "
                              f"{sorted(set(fields) - set(FIELDS))}")
        out[tag] = fields
    return next(iter(out)), out


def generate() -> dict[str, Any]:
    """The table, from the registry's named models, their configs' `HUB_REPOS` and timm."""
    import timm

    named = named_models()
    models: dict[str, Any] = {}
    for arch, cls in CONFIGS.items():
        for name, repos in cls.HUB_REPOS.items():
            if name != arch and named.get(name, (None,))[0] != arch:
                raise ConfigError(f"{cls.__name__}.HUB_REPOS names {name!r}, neither {arch} "
                                  "nor one of its named models (NAMED)")
            default, tags = declared_tags(name, repos)
            models[name] = {"arch": arch, "default": default, "tags": tags}
    for name, (arch, _) in sorted(named.items()):
        found = timm_tags(name)
        if found is None:
            continue
        default, tags = found
        if name in models:  # declared repositories come after timm's tags
            clash = set(tags) & set(models[name]["tags"])
            if clash:
                raise ConfigError(f"HUB_REPOS[{name!r}] declares tags timm has: {sorted(clash)}")
            tags = {**tags, **models[name]["tags"]}
        models[name] = {"arch": arch, "default": default, "tags": tags}
    return {"format": 1, "generated_by": GENERATE, "timm_version": timm.__version__,
            "models": dict(sorted(models.items()))}


def label_sets() -> dict[str, dict[str, Any]]:
    """The label sets shipped as data: ImageNet-1k's synsets and class names, from timm."""
    from timm.data import ImageNetInfo

    out = {}
    for label_set, path in LABELS.items():
        info = ImageNetInfo(label_set)
        out[label_set] = (path, {"label_set": label_set, "generated_by": GENERATE,
                                 "synsets": list(info.label_names()),
                                 "names": list(info.label_descriptions())})
    return out


def dump(data: Any) -> str:
    """The JSON text as committed: one tag per line, readable in a diff."""
    if not isinstance(data, dict) or "models" not in data:
        return json.dumps(data, indent=1) + "\n"
    lines = ["{"]
    head = [k for k in data if k != "models"]
    lines += [f" {json.dumps(k)}: {json.dumps(data[k])}," for k in head]
    lines.append(' "models": {')
    names = list(data["models"])
    for i, name in enumerate(names):
        entry = data["models"][name]
        lines.append(f'  {json.dumps(name)}: {{"arch": {json.dumps(entry["arch"])}, '
                     f'"default": {json.dumps(entry["default"])}, "tags": {{')
        tags = list(entry["tags"])
        for j, tag in enumerate(tags):
            comma = "," if j < len(tags) - 1 else ""
            lines.append(f"   {json.dumps(tag)}: {json.dumps(entry['tags'][tag])}{comma}")
        lines.append("  }}" + ("," if i < len(names) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def differences(committed: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """What differs between two tables (names, tags and fields), informational keys aside."""
    out = []
    old, new = committed.get("models", {}), fresh.get("models", {})
    out += [f"{n}: not in the committed table" for n in new if n not in old]
    out += [f"{n}: in the committed table, not in the registry / timm" for n in old
            if n not in new]
    for name in set(old) & set(new):
        a, b = old[name], new[name]
        for key in ("arch", "default"):
            if a.get(key) != b.get(key):
                out.append(f"{name}: {key} {a.get(key)!r} committed, {b.get(key)!r} now")
        out += [f"{name}.{t}: new tag" for t in b["tags"] if t not in a["tags"]]
        out += [f"{name}.{t}: tag gone" for t in a["tags"] if t not in b["tags"]]
        for tag in set(a["tags"]) & set(b["tags"]):
            out += [f"{name}.{tag}: {f} {a['tags'][tag].get(f)!r} committed, "
                    f"{b['tags'][tag].get(f)!r} now" for f in FIELDS
                    if a["tags"][tag].get(f) != b["tags"][tag].get(f)]
        if set(a["tags"]) == set(b["tags"]) and list(a["tags"]) != list(b["tags"]):
            out.append(f"{name}: tags in another order")
    for key in set(committed) | set(fresh):
        if key not in ("models", *INFORMATIONAL) and committed.get(key) != fresh.get(key):
            out.append(f"{key}: {committed.get(key)!r} committed, {fresh.get(key)!r} now")
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo.weights.pretrained.generate",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed files instead of writing them")
    args = parser.parse_args(argv)
    import zoo  # noqa: F401  (registers every architecture and its named models)

    outputs: list[tuple[Path, str]] = [(TABLE, dump(generate()))]
    outputs += [(path, dump(data)) for path, data in label_sets().values()]
    stale = []
    for path, text in outputs:
        old = path.read_text() if path.exists() else ""
        if args.check:
            if path == TABLE:
                diff = differences(json.loads(old) if old else {}, json.loads(text))
            else:
                diff = [] if old == text else [f"{path.name} differs"]
            stale += [f"{path.name}: {d}" for d in diff]
        elif old != text:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"stale ({len(stale)} differences; run `{GENERATE}`):", file=sys.stderr)
        for line in stale[:40]:
            print(f"  {line}", file=sys.stderr)
        return 1
    if args.check:
        print("the committed tag table and label sets are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
