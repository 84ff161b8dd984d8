"""The repository holds sources only: no packages, archives or downloads, nothing large that is
not a declared record or fixture."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_BYTES = 1_000_000
# Tracked files allowed past MAX_BYTES: committed records and fixtures, by pattern (none today;
# a new entry says which record or fixture it is and why it cannot be made at test time).
LARGE_ALLOWED: tuple[str, ...] = ()
# Leading bytes of archives, packages and serialised arrays (a wheel and an sdist included: a
# wheel is a zip, an sdist a gzip).
MAGIC: dict[str, bytes] = {
    "zip (wheel, jar, npz, torch.save)": b"PK\x03\x04",
    "gzip": b"\x1f\x8b",
    "bzip2": b"BZh",
    "xz": b"\xfd7zXZ\x00",
    "zstandard": b"\x28\xb5\x2f\xfd",
    "7-zip": b"7z\xbc\xaf\x27\x1c",
    "numpy .npy": b"\x93NUMPY",
    "pickle (protocol 2+)": b"\x80",
}


def archive_kind(head: bytes) -> str | None:
    """The kind of archive `head` (a file's first 512 bytes) starts, or None."""
    for kind, magic in MAGIC.items():
        if head.startswith(magic):
            return kind
    if head[257:262] == b"ustar":
        return "tar"
    return None


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def test_archive_kind_recognises_packages_and_passes_sources():
    assert archive_kind(b"PK\x03\x04rest") is not None
    assert archive_kind(b"\x1f\x8b\x08") == "gzip"
    assert archive_kind(bytes(257) + b"ustar\x0000") == "tar"
    assert archive_kind(b'"""A module."""\n') is None
    assert archive_kind(b"\x89PNG\r\n\x1a\n") is None  # plots are records, not archives


def test_no_tracked_file_is_an_archive():
    found = []
    for path in tracked_files():
        file = ROOT / path
        if file.is_file():
            with file.open("rb") as f:
                kind = archive_kind(f.read(512))
            if kind:
                found.append(f"{path} ({kind})")
    assert not found, "archives tracked (remove them, install from the registry): " + ", ".join(
        found)


def test_no_tracked_file_is_large_unless_declared():
    large = []
    for path in tracked_files():
        file = ROOT / path
        if (file.is_file() and file.stat().st_size > MAX_BYTES
                and not any(fnmatch.fnmatch(path, p) for p in LARGE_ALLOWED)):
            large.append(f"{path} ({file.stat().st_size:,} bytes)")
    assert not large, (f"tracked files over {MAX_BYTES:,} bytes outside LARGE_ALLOWED: "
                       + ", ".join(large))
