"""Command-line values -> validated choices (implementations, call styles), shared by the
benchmark commands."""

from __future__ import annotations

import argparse

import zoo


def parse_impls(value: str) -> tuple[str, ...]:
    """`all` (PyTorch only if installed) or a comma list of implementations."""
    available = tuple(i for i in zoo.IMPLS if i in {i for _, i in zoo.list_models()})
    if value == "all":
        return available
    impls = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [i for i in impls if i not in zoo.IMPLS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown impl {bad}; choose from all, {zoo.IMPLS}")
    missing = [i for i in impls if i not in available]
    if missing:
        raise argparse.ArgumentTypeError(f"{missing} not installed (PyTorch missing?)")
    return impls


def resolve_calls(value: str, impls: tuple[str, ...], *,
                  torch_compile: bool = False) -> dict[str, list[str]]:
    """--call value -> impl -> styles. Names a library lacks are skipped for that library."""
    from zoo.bench.styles import DEFAULT_STYLE, available_styles

    out: dict[str, list[str]] = {}
    wanted = [v.strip() for v in value.split(",") if v.strip()]
    for impl in impls:
        avail = available_styles(impl, torch_compile=torch_compile)
        if value == "all":
            calls = avail
        elif value == "default":
            calls = [DEFAULT_STYLE[impl]]
            if impl == "torch" and torch_compile:
                calls.append("compile")
        else:
            calls = [c for c in wanted if c in avail]
            if impl == "torch" and torch_compile and "compile" not in calls:
                calls.append("compile")
        if not calls:
            raise ValueError(f"no call style {wanted} for {impl}; it has {avail}")
        out[impl] = calls
    return out
