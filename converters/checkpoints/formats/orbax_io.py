"""Orbax checkpoint directories read and written safely: the stored tree without restoring
it, a restore into a target, a save; a failure is one `CheckpointError`, raised once what the
failed call left in flight has settled (see `settled`)."""

from __future__ import annotations

import contextlib
import gc
import inspect
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from converters.checkpoints.io import CheckpointError, first_line


def stored_tree(path: Path) -> dict[str, Any]:
    """The stored tree of an orbax checkpoint directory: {dotted name: array metadata}."""
    import orbax.checkpoint as ocp

    with settled(path, "read the orbax checkpoint metadata"), ocp.StandardCheckpointer() as ckptr:
        md = ckptr.metadata(path.absolute())
        tree = getattr(md, "item_metadata", md)
        flat = _flatten(getattr(tree, "tree", tree))
        if not flat:  # orbax may have failed quietly
            raise CheckpointError(f"{path}: the orbax checkpoint holds no arrays")
    return flat


def _flatten(tree: Any) -> dict[str, Any]:
    """{dotted name: leaf} of a tree of dicts, lists and tuples."""
    flat: dict[str, Any] = {}

    def visit(node: Any, name: str) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                visit(v, f"{name}.{k}" if name else str(k))
        elif isinstance(node, list | tuple):
            for i, v in enumerate(node):
                visit(v, f"{name}.{i}" if name else str(i))
        elif node is not None:
            flat[name] = node

    visit(tree, "")
    return flat


def restore(path: Path, target: Any = None) -> Any:
    """The tree an orbax checkpoint directory holds, into `target` (abstract) if given."""
    import orbax.checkpoint as ocp

    with settled(path, "restore the orbax checkpoint"), ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(path.absolute(), target)


SETTLE_SECONDS = 1.0  # how long a failed orbax call's reads in flight are waited for


@contextlib.contextmanager
def settled(path: Path, doing: str | None = None) -> Iterator[None]:
    """Run orbax calls on `path`; a failure is raised only once what it left behind settled.

    Orbax closes its event loop as soon as one read fails, with the other reads still in flight
    in tensorstore: each then reports "Event loop is closed", and each coroutine it never
    finished raises its own copy of the error when collected, all as unraisable exceptions in
    whatever code runs at that moment. Those reports are dropped while the calls run, and on a
    failure the garbage is collected until nothing more arrives (at most SETTLE_SECONDS): the
    failure raised is the one that matters. With `doing`, it is one CheckpointError ("cannot
    <doing>"); without, it is raised as it is.
    """
    hook = sys.unraisablehook
    dropped: list[type[BaseException]] = []

    def drop_orphans(unraisable: Any) -> None:
        if inspect.iscoroutine(unraisable.object) or (
                isinstance(unraisable.exc_value, RuntimeError)
                and str(unraisable.exc_value) == "Event loop is closed"):
            dropped.append(unraisable.exc_type)
        else:
            hook(unraisable)

    sys.unraisablehook = drop_orphans
    try:
        yield
    except Exception as e:
        _settle(e, dropped)
        if doing is None or isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: cannot {doing} ({type(e).__name__}: {first_line(e)}): "
                              "damaged?") from e
    finally:
        sys.unraisablehook = hook


def _settle(error: BaseException, dropped: list[Any]) -> None:
    """Clear the frames of `error`'s tracebacks (they hold the unfinished coroutines; the lines
    stay) and collect until no orphan has been reported for a few rounds."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__
    deadline, quiet = time.monotonic() + SETTLE_SECONDS, 0
    while quiet < 3 and time.monotonic() < deadline:
        before = len(dropped)
        time.sleep(0.01)
        gc.collect(1)
        quiet = quiet + 1 if len(dropped) == before else 0
    gc.collect()


def save_orbax_tree(tree: Any, path: Path) -> None:
    """An orbax checkpoint directory of `tree` (Linen variables, an NNX state) at `path`."""
    import orbax.checkpoint as ocp

    with settled(path), ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path.absolute(), tree)
        ckptr.wait_until_finished()
