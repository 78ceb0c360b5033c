"""A model folder as ``models add`` reads it: a local directory or an object-store prefix.

``open_folder`` names either (an ``s3://bucket/prefix/`` is read with the deployment's
object-store credentials and endpoint, its listing once); the checks read its JSON
files alone (``read_json``), and ``local_copy`` downloads an object-store folder's
files only once they passed. Whatever cannot be read is ``Refused``: one line naming
what is missing, the client's error. A local folder holds regular files and folders
only: a symbolic link (which would be read, then left out of what is published) or a
FIFO, socket or device is refused, naming it. A JSON file nested deeper than
``MAX_JSON_DEPTH`` is refused too (no reader of a model's files needs more).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from jobs.core.errors import InvalidRequest, shown
from jobs.fleet import registry
from storage.objects import ObjectStore
from storage.stores import open_store

# The deepest nesting of a model folder's JSON files (transformers' configs nest a few
# levels: a text_config's rope_scaling, a tokenizer_config's added_tokens_decoder).
MAX_JSON_DEPTH = 64


class Refused(InvalidRequest, code="invalid_model_folder"):
    """A folder the kind's engine cannot serve: one line naming what is missing."""

    def __init__(self, message: str) -> None:
        super().__init__(message, param="source")


class Folder(Protocol):
    """What the checks read: files by relative posix path."""

    where: str

    def has(self, rel: str) -> bool: ...

    def read(self, rel: str) -> bytes: ...

    def files(self) -> list[str]: ...


class LocalFolder:
    def __init__(self, root: Path) -> None:
        self.root, self.where = root, str(root)

    def has(self, rel: str) -> bool:
        p = self.root / rel
        return p.is_file() and not p.is_symlink()

    def read(self, rel: str) -> bytes:
        """The file's bytes, opened without following a link (a link put in place
        after ``check_entries`` is an OSError, not another file's content)."""
        fd = os.open(self.root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            return f.read()

    def check_entries(self) -> None:
        """Refused, naming the first, for an entry that is neither a regular file nor
        a folder: a symbolic link, a FIFO, a socket, a device (dot-entries, which are
        never published, aside)."""
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            for name in sorted(dirnames) + sorted(filenames):
                if name.startswith("."):
                    continue
                p = Path(dirpath) / name
                mode = p.lstat().st_mode
                rel = p.relative_to(self.root).as_posix()
                if stat.S_ISLNK(mode):
                    raise Refused(f"{shown(rel)} is a symbolic link: a model folder holds "
                                  "its files themselves (copy them in, e.g. cp -L)")
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    raise Refused(f"{shown(rel)} is not a regular file (a FIFO, socket or "
                                  "device): a model folder holds files and folders only")
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]

    def files(self) -> list[str]:
        """Every regular file (dot-files, such as markers, left out), as published."""
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in filenames:
                p = Path(dirpath) / f
                if not f.startswith(".") and p.is_file() and not p.is_symlink():
                    out.append(p.relative_to(self.root).as_posix())
        return sorted(out)


class StoreFolder:
    """An object-store prefix; its listing is read once."""

    def __init__(self, uri: str, store: ObjectStore, keys: list[str]) -> None:
        self.where, self.store = uri, store
        self.keys = sorted(k for k in keys if k and not k.endswith("/")
                           and not k.rsplit("/", 1)[-1].startswith("."))
        self._set = set(self.keys)

    def has(self, rel: str) -> bool:
        return rel in self._set

    def read(self, rel: str) -> bytes:
        return self.store.get_bytes(rel)

    def files(self) -> list[str]:
        return list(self.keys)


def open_folder(source: str) -> Folder:
    """The folder ``source`` names: ``s3://bucket/prefix/`` or a local directory.
    Refused (one line) when it cannot be read."""
    if source.startswith("s3://"):
        try:
            store = open_store(source)
            keys = store.list("")
        except Exception as e:  # noqa: BLE001 - any failure to read it is the user's line
            raise Refused(f"cannot read {shown(source)}: {_reason(e)}") from None
        folder = StoreFolder(source, store, keys)
        if not folder.keys:
            raise Refused(f"{shown(source)} holds no files")
        return folder
    if "://" in source:
        raise Refused(f"{shown(source)}: give a local folder or an s3:// URI")
    path = Path(source)
    try:
        found = path.is_dir()
    except (OSError, ValueError):  # a name too long, a character the system refuses
        found = False
    if not found:
        raise Refused(f"no folder at {shown(source)}")
    local = LocalFolder(path.resolve())
    local.check_entries()
    return local


def _reason(e: BaseException) -> str:
    from botocore.exceptions import ClientError

    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        return f"{err.get('Code', 'error')}: {err.get('Message') or 'refused'}"
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


@contextmanager
def local_copy(folder: Folder, scratch: Path) -> Iterator[Path]:
    """A local directory holding ``folder``'s files: itself, or a download of an
    object-store folder into a temporary directory under ``scratch`` (removed after)."""
    if isinstance(folder, LocalFolder):
        yield folder.root
        return
    assert isinstance(folder, StoreFolder)
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".model-add-", dir=scratch) as tmp:
        root = Path(tmp)
        for rel in folder.files():
            registry.check_file_path(rel)
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                folder.store.download(rel, dest)
            except Exception as e:  # noqa: BLE001 - one line: the file that could not be had
                raise Refused(f"cannot read {rel} of {shown(folder.where)}: "
                              f"{_reason(e)}") from None
        yield root


def read_json(folder: Folder, rel: str) -> Any:
    try:
        raw = folder.read(rel)
    except OSError as e:
        raise Refused(f"cannot read {rel}: {e.strerror or _reason(e)}") from None
    try:
        got = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise Refused(f"{rel} is not valid JSON") from None
    except RecursionError:
        got = None
        deep = True
    else:
        deep = too_deep(got)
    if deep:
        raise Refused(f"{rel} nests deeper than {MAX_JSON_DEPTH} levels: not a model's "
                      "JSON file")
    return got


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a parsed JSON value nests deeper than ``limit`` (read level by level,
    without recursion)."""
    level = [value]
    for _ in range(limit):
        level = [c for v in level if isinstance(v, dict | list)
                 for c in (v.values() if isinstance(v, dict) else v)
                 if isinstance(c, dict | list)]
        if not level:
            return False
    return True


def read_object(folder: Folder, rel: str) -> dict[str, Any]:
    got = read_json(folder, rel)
    if not isinstance(got, dict):
        raise Refused(f"{rel} is not a JSON object")
    return got
