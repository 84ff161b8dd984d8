"""A Hugging Face Hub cache laid out by hand, as ``huggingface_hub`` writes it, for tests that
must never reach the network.

``HF_HUB_CACHE/models--ORG--NAME/refs/REVISION`` holds the commit hash,
``snapshots/COMMIT/FILE`` is a relative symbolic link to ``blobs/ETAG``, and the blob's name is
the file's hash as the Hub gives it (SHA-256 for LFS files, weights; git's blob SHA-1 for small
ones, JSON). ``huggingface_hub``'s own `hf_hub_download` then finds the files with
``HF_HUB_OFFLINE`` set, as timm's and transformers' loaders do.

`offline_hub(monkeypatch, cache)` points the already imported ``huggingface_hub`` at `cache`,
offline: its functions read ``constants.HF_HUB_CACHE`` and ``constants.HF_HUB_OFFLINE``
(through `constants.is_offline_mode()`) when called, so patching the module attributes is what
setting the environment before the import does (the suite's conftest sets
``HF_HUB_OFFLINE=1`` before anything imports the library; a test of the environment variables
themselves runs a subprocess).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".msgpack")


def blob_name(name: str, data: bytes) -> str:
    """The blob name the Hub's etag gives `name` holding `data`."""
    if name.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


def add_repo(cache: Path, repo_id: str, files: Mapping[str, bytes | Path], *,
             revision: str = "main", commit: str | None = None,
             tree_listing: bool = False) -> Path:
    """Put `files` (name -> bytes or a file to copy) into `cache` as repository `repo_id` at
    `revision`; returns the snapshot folder. `tree_listing` also writes the commit's tree
    listing (``trees/COMMIT.json``, as ``snapshot_download`` does)."""
    contents = {n: (Path(v).read_bytes() if isinstance(v, Path | str) else bytes(v))
                for n, v in files.items()}
    if commit is None:
        h = hashlib.sha1(f"{repo_id}@{revision}".encode())
        for n in sorted(contents):
            h.update(n.encode() + blob_name(n, contents[n]).encode())
        commit = h.hexdigest()
    root = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    for name, data in contents.items():
        blob = root / "blobs" / blob_name(name, data)
        blob.write_bytes(data)
        link = snapshot / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    ref = root / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)
    if tree_listing:
        import json

        entries = {}
        for name, data in contents.items():
            entry = {"size": len(data), "blob_id": blob_name("x.json", data)}
            if name.endswith(LFS_SUFFIXES):
                entry |= {"lfs_sha256": blob_name(name, data), "lfs_size": len(data)}
            entries[name] = entry
        (root / "trees").mkdir(exist_ok=True)
        (root / "trees" / f"{commit}.json").write_text(
            json.dumps({"format_version": 1, "files": entries}))
    return snapshot


def add_folder(cache: Path, repo_id: str, folder: Path, **kwargs) -> Path:
    """Every file of `folder` (as `save_for_hf` / `save_pretrained` wrote it) as `repo_id`."""
    return add_repo(cache, repo_id, {p.name: p for p in sorted(Path(folder).iterdir())
                                     if p.is_file()}, **kwargs)


def offline_hub(monkeypatch, cache: Path) -> Path:
    """`huggingface_hub` (already imported or not) reading `cache`, offline."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache
