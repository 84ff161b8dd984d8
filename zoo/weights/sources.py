"""Sources of weights, as timm names them: ``hf-hub:ORG/REPO[@REVISION]`` and ``local-dir:PATH``.

One mechanism for Python and the command lines: `Source.parse` reads the text (None for a plain
path), `Source.folder()` gives a local folder holding the source's ``config.json`` and weights.
A ``hf-hub:`` source is fetched through ``huggingface_hub`` itself (`hf_hub_download`): its
cache (``HF_HUB_CACHE``), ``HF_HUB_OFFLINE``, revisions and progress bars are the library's.
The weights file is the first of `WEIGHTS` the repository has (safetensors before
``pytorch_model.bin``; a sharded index brings its shards).

What comes out of the cache is checked before anything reads it, and refused in one line
otherwise (`SourceError`):

- repository ids, revisions and file names are plain (`check_repo_id`, `check_revision`,
  `check_filename`): no ``..``, no absolute path, no character outside ``[A-Za-z0-9._-/]``;
- each file must resolve (symbolic links followed) to a regular file inside the repository's
  own cache folder: an entry linked out of the cache is refused before it is opened;
- a file stored as a blob (how ``huggingface_hub`` writes its cache) must have the content
  its name says: the blob name is the file's hash (SHA-256 for LFS files, git's blob SHA-1
  for small ones), so a changed, truncated or extended file is refused; where the cache
  holds the commit's tree listing (written by ``snapshot_download``), the size is compared
  with it as well;
- JSON files (``config.json``, a shard index) are read by `read_json`: bounded in size and
  nesting, an object at the top.

No code from the Hub runs: JSON is parsed as data, safetensors are read as arrays and
``pytorch_model.bin`` only with PyTorch's ``weights_only`` loader (by the converters).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

HF_HUB = "hf-hub:"
LOCAL_DIR = "local-dir:"
CONFIG = "config.json"
SHARD_INDEX = "model.safetensors.index.json"
# The weights of a Hub folder, the first found: safetensors first, as timm and transformers.
WEIGHTS = ("model.safetensors", SHARD_INDEX, "pytorch_model.bin")
MAX_JSON_BYTES = 16 * 2**20  # config.json files are kilobytes; an index a few megabytes
MAX_JSON_DEPTH = 32

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"(?:{_NAME}/)?{_NAME}")
_REVISION_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_FILENAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class SourceError(ValueError):
    """A source that cannot be used: one line naming it and why."""


class BadSourceError(SourceError):
    """A malformed source (a usage error: an odd repository id, revision or path)."""


class NotCachedError(SourceError):
    """The files are not in the cache and the Hub cannot be asked (offline or unreachable)."""


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


def check_repo_id(repo_id: str) -> str:
    """`repo_id` if it is a plain Hub model id (``org/name`` or ``name``), else BadSourceError."""
    if not isinstance(repo_id, str) or not _REPO_ID.fullmatch(repo_id) or ".." in repo_id \
            or "--" in repo_id:
        raise BadSourceError(f"{HF_HUB}{_shown(str(repo_id))[1:-1]}: not a Hub repository id "
                             "(ORG/NAME of letters, digits, '.', '_', '-'; no '..' or '--')")
    return repo_id


def check_revision(revision: str) -> str:
    """`revision` if it is a plain branch, tag or commit name, else BadSourceError."""
    parts = revision.split("/") if isinstance(revision, str) else [""]
    if len(revision) > 255 or not all(_REVISION_PART.fullmatch(p) for p in parts) \
            or ".." in revision or revision.endswith(".lock"):
        raise BadSourceError(f"revision {_shown(str(revision))}: not a branch, tag or commit "
                             "name (letters, digits, '.', '_', '-', '/' between parts; no "
                             "'..', no absolute path)")
    return revision


def check_filename(name: str, where: str) -> str:
    """`name` if it is a plain file name (no folder, no '..'), else SourceError."""
    if not isinstance(name, str) or not _FILENAME.fullmatch(name) or ".." in name:
        raise SourceError(f"{where}: file name {_shown(str(name))} is not a plain file name")
    return name


def read_json(path: Path, what: str | None = None) -> dict[str, Any]:
    """A JSON object from `path`, refused in one line when the file is larger than
    `MAX_JSON_BYTES`, nested deeper than `MAX_JSON_DEPTH`, not UTF-8 JSON or not an object."""
    what = what or str(path)
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise SourceError(f"{what}: {size:,} bytes, more than a config file holds (limit "
                              f"{MAX_JSON_BYTES:,})")
        with open(path, "rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except OSError as e:
        raise SourceError(f"{what}: cannot read ({e.strerror or e})") from e
    if len(data) > MAX_JSON_BYTES:
        raise SourceError(f"{what}: more than {MAX_JSON_BYTES:,} bytes")
    try:
        raw = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise SourceError(f"{what}: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise SourceError(f"{what}: not a JSON file ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:80]})") from None
    if not isinstance(raw, dict):
        raise SourceError(f"{what}: must be a JSON object, found {type(raw).__name__}")
    stack: list[tuple[Any, int]] = [(raw, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise SourceError(f"{what}: nested deeper than {MAX_JSON_DEPTH} levels")
        children = value.values() if isinstance(value, dict) else (
            value if isinstance(value, list) else ())
        stack += [(c, depth + 1) for c in children if isinstance(c, dict | list)]
    return raw


@dataclass(frozen=True)
class Source:
    """Where a model's files are: a Hub repository (at a revision) or a local folder."""

    kind: Literal["hf-hub", "local-dir"]
    location: str  # the repository id, or the folder
    revision: str | None = None

    PREFIXES: ClassVar[tuple[str, str]] = (HF_HUB, LOCAL_DIR)

    @classmethod
    def parse(cls, text: Any) -> Source | None:
        """The source `text` names (``hf-hub:ORG/REPO[@REV]``, ``local-dir:PATH``), or None
        when it names none (a plain path, a model name). A malformed one: BadSourceError."""
        if isinstance(text, Source):
            return text
        if not isinstance(text, str):
            return None
        if text.startswith(HF_HUB):
            repo, at, revision = text[len(HF_HUB):].partition("@")
            if at and not revision:
                raise BadSourceError(f"{text}: an empty revision after '@'")
            return cls("hf-hub", check_repo_id(repo), check_revision(revision) if at else None)
        if text.startswith(LOCAL_DIR):
            path = text[len(LOCAL_DIR):]
            if not path or "\x00" in path:
                raise BadSourceError(f"{text}: give the folder after {LOCAL_DIR}")
            return cls("local-dir", path)
        return None

    def __str__(self) -> str:
        if self.kind == "local-dir":
            return LOCAL_DIR + self.location
        return HF_HUB + self.location + (f"@{self.revision}" if self.revision else "")

    def folder(self, *, weights: bool = True) -> Path:
        """A local folder with the source's ``config.json`` (when it has one) and, with
        `weights`, its weights; fetched into (or found in) the Hugging Face cache for a Hub
        source, each file checked (see the module doc)."""
        if self.kind == "local-dir":
            path = Path(self.location).expanduser()
            if not path.is_dir():
                raise SourceError(f"{self}: not a folder")
            return path
        return _HubFetch(self).folder(weights)

    def file(self, name: str, *, optional: bool = False) -> Path | None:
        """One file of the source (None when it has none): in the folder, or fetched into
        (or found in) the Hugging Face cache and checked as the weights are (a tokenizer's
        files beside the weights). `optional`: None, not NotCachedError, when an offline
        cache cannot say whether the repository has it."""
        check_filename(name, str(self))
        if self.kind == "local-dir":
            path = self.folder() / name
            return path if path.is_file() else None
        fetch = _HubFetch(self)
        return fetch.try_download(name)[0] if optional else fetch.download(name)

    def config_json(self) -> dict[str, Any] | None:
        """The source's ``config.json`` as data (None when it has none); only that file is
        fetched."""
        if self.kind == "local-dir":
            path = self.folder() / CONFIG
            return read_json(path, f"{self}: {CONFIG}") if path.is_file() else None
        path = _HubFetch(self).download(CONFIG)
        return None if path is None else read_json(path, f"{self}: {CONFIG}")


def _hub() -> Any:
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.errors
    except ImportError:
        raise SourceError("hf-hub: sources need huggingface_hub (pip install huggingface_hub)"
                          ) from None
    return huggingface_hub


def repo_folder(cache: Path, repo_id: str) -> Path:
    """The cache folder of model repository `repo_id` (``models--ORG--NAME``)."""
    return cache / ("models--" + repo_id.replace("/", "--"))


def git_blob_sha1(path: Path) -> str:
    """git's object id of the file's content (what the Hub names a small file's blob)."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    return _digest(path, h)


def sha256(path: Path) -> str:
    return _digest(path, hashlib.sha256())


def _digest(path: Path, h: Any) -> str:
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


class _HubFetch:
    """One fetch of a Hub source: every file from one commit, each checked."""

    def __init__(self, source: Source):
        self.source = source
        hub = _hub()
        self.hub = hub
        self.cache = Path(hub.constants.HF_HUB_CACHE).expanduser()
        self.repo_root = repo_folder(self.cache, source.location)
        self.revision = source.revision
        self.commit: str | None = None

    def where(self, name: str) -> str:
        return f"{self.source}: {name}"

    def download(self, name: str) -> Path | None:
        """The checked cached path of `name` at the source's commit; None when the
        repository has no such file; NotCachedError when it is not cached and the Hub cannot
        be asked."""
        path, cached = self.try_download(name)
        if not cached:
            self._not_cached(name)
        return path

    def try_download(self, name: str) -> tuple[Path | None, bool]:
        """(the checked cached path of `name` or None, False when it is neither cached nor
        known to be missing and the Hub cannot be asked)."""
        errors = self.hub.errors
        try:
            got = self.hub.hf_hub_download(self.source.location, name,
                                           revision=self.commit or self.revision)
        except errors.LocalEntryNotFoundError:
            return None, self._known_missing(name)
        except errors.EntryNotFoundError:  # the repository has no such file
            return None, True
        except errors.RevisionNotFoundError:
            raise SourceError(f"{self.source}: no revision {self.revision!r} in the "
                              "repository") from None
        except errors.RepositoryNotFoundError:
            raise SourceError(f"{self.source}: no such repository on the Hub (or it is private "
                              "or gated: log in with `hf auth login`)") from None
        except errors.HfHubHTTPError as e:
            raise SourceError(f"{self.where(name)}: the Hub answered "
                              f"{str(e).splitlines()[0][:120]}") from None
        except ValueError as e:  # huggingface_hub's own argument checks
            raise BadSourceError(f"{self.source}: {str(e).splitlines()[0][:160]}") from None
        path = Path(got)
        self._check(path, name)
        return path, True

    def _known_missing(self, name: str) -> bool:
        """Whether the cache records that the commit has no file `name` (``.no_exist``)."""
        return self.commit is not None and (
            self.repo_root / ".no_exist" / self.commit / name).exists()

    def _not_cached(self, name: str) -> None:
        offline = self.hub.constants.HF_HUB_OFFLINE
        why = ("HF_HUB_OFFLINE is set" if offline else "the Hub could not be reached")
        what = self.where(name) if (self.repo_root / "snapshots").is_dir() else str(self.source)
        raise NotCachedError(
            f"{what} is not in the Hugging Face cache ({self.cache}) and {why}: "
            f"download it once online (`hf download {self.source.location}"
            + (f" --revision {self.revision}" if self.revision else "") + "`), or point "
            "HF_HUB_CACHE at a cache that has it")

    def _check(self, path: Path, name: str) -> None:
        """`path` (a file `hf_hub_download` returned) resolves inside the repository's cache
        folder, is a regular file, and its content matches its blob name and the commit's
        tree listing where the cache has one."""
        snapshot = path.parent
        commit = snapshot.name
        if snapshot.parent.name != "snapshots" or not _HEX.fullmatch(commit):
            raise SourceError(f"{self.where(name)}: {path} is not a snapshot file of the cache")
        if self.commit is None:
            self.commit = commit
        elif commit != self.commit:
            raise SourceError(f"{self.where(name)}: from commit {commit}, the other files from "
                              f"{self.commit}")
        root = Path(os.path.realpath(self.repo_root))
        cache = Path(os.path.realpath(self.cache))
        real = Path(os.path.realpath(path))
        if not root.is_relative_to(cache):
            raise SourceError(f"{self.where(name)}: the repository's cache folder links out of "
                              f"the cache ({root})")
        if not real.is_relative_to(root):
            raise SourceError(f"{self.where(name)}: the cache entry links out of the cache "
                              f"(to {real}): refused, nothing read")
        if not real.is_file():
            raise SourceError(f"{self.where(name)}: the cache entry is not a regular file")
        size = real.stat().st_size
        if name.endswith(".json") and size > MAX_JSON_BYTES:  # refused unread, not hashed
            raise SourceError(f"{self.where(name)}: {size:,} bytes, more than a config file "
                              f"holds (limit {MAX_JSON_BYTES:,})")
        expected = self._listed_size(name)
        if expected is not None and expected != size:
            raise SourceError(f"{self.where(name)}: {size:,} bytes in the cache, the commit's "
                              f"tree listing says {expected:,}: truncated or changed")
        if real.parent == root / "blobs":
            blob = real.name
            if not _HEX.fullmatch(blob):
                raise SourceError(f"{self.where(name)}: blob {blob!r} is not named by a hash")
            got = sha256(real) if len(blob) == 64 else git_blob_sha1(real)
            if got != blob:
                raise SourceError(f"{self.where(name)}: its content ({size:,} bytes) does not "
                                  f"match its hash (blob {blob[:12]}..., content "
                                  f"{got[:12]}...): truncated or changed; delete it from the "
                                  "cache and download again")

    def _listed_size(self, name: str) -> int | None:
        """The size of `name` in the commit's cached tree listing, if the cache has one."""
        tree = self.repo_root / "trees" / f"{self.commit}.json"
        if not tree.is_file():
            return None
        try:
            files = read_json(tree, self.where(f"trees/{self.commit}.json")).get("files")
        except SourceError:
            return None  # huggingface_hub ignores a damaged listing too
        entry = files.get(name) if isinstance(files, dict) else None
        if not isinstance(entry, dict):
            return None
        size = entry.get("lfs_size", entry.get("size"))
        return size if isinstance(size, int) and not isinstance(size, bool) else None

    def folder(self, weights: bool) -> Path:
        config, config_cached = self.try_download(CONFIG)
        if not weights:
            if config is None:
                if not config_cached:
                    self._not_cached(CONFIG)
                raise SourceError(f"{self.source}: the repository has no {CONFIG}")
            return config.parent
        found, uncached = None, []
        for name in WEIGHTS:
            found, cached = self.try_download(name)
            if found is not None:
                break
            if not cached:
                uncached.append(name)
        if found is None:
            if uncached or not config_cached:
                self._not_cached(uncached[0] if uncached else CONFIG)
            raise SourceError(f"{self.source}: the repository has none of {', '.join(WEIGHTS)}")
        if found.name == SHARD_INDEX:
            index = read_json(found, self.where(SHARD_INDEX))
            wmap = index.get("weight_map")
            if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
                raise SourceError(f"{self.where(SHARD_INDEX)}: needs a 'weight_map' object of "
                                  "key -> shard file name")
            for shard in dict.fromkeys(wmap.values()):
                check_filename(shard, self.where(SHARD_INDEX))
                if self.download(shard) is None:
                    raise SourceError(f"{self.where(SHARD_INDEX)}: shard {shard!r} is not in "
                                      "the repository")
        folder = found.parent
        first = next((folder / w for w in WEIGHTS if (folder / w).is_file()), None)
        if first != found:  # what the folder's reader takes must be what was checked
            raise SourceError(f"{self.source}: {first} is in the snapshot but was not fetched")
        return folder
