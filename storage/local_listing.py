"""Listing a file:// dataset (storage.datasets) without leaving its directory.

A prefix or a glob is listed by walking the directory its key starts from: only what
the glob can reach is walked (a ``*`` stays in its segment, a ``**`` reaches every
directory below), hidden directories (``_``, ``.``) are not, and a directory link is
never walked into. A symbolic link (to a file or to a directory) or a FIFO, socket or
device that the URI names (one it would list, or walk into) refuses the whole listing
(``localfs.UnsafePath``, naming it): a dataset is read from regular files only, and a
batch that silently left out what its owner put there would be wrong without saying
so. Links and special files the URI does not name (hidden ones, those a glob does not
match) are left alone. Glob and hidden-name rules are shared with S3's listings.
"""

from __future__ import annotations

import os
import re
import stat

from storage import localfs


def glob_regex(pattern: str) -> re.Pattern[str]:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:end]
                neg = body.startswith("!")
                out.append("[" + ("^" if neg else "") + re.escape(body[1 if neg else 0:]) + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out))


def hidden(key: str, base: str) -> bool:
    """A marker or hidden object under ``base``: some segment below it starts with
    ``_`` or ``.``."""
    rest = key[len(base):] if key.startswith(base) else key.rsplit("/", 1)[-1]
    return any(seg[:1] in ("_", ".") for seg in rest.split("/") if seg)


def local_etag(st: os.stat_result) -> str:
    return f'"{st.st_mtime_ns:x}-{st.st_size:x}"'


def one_local(path: str) -> list[tuple[str, int, str]]:
    """One local object, if it is there: a link or anything but a regular file is
    refused (a directory is not the object)."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    if stat.S_ISDIR(st.st_mode):
        return []
    if not stat.S_ISREG(st.st_mode):
        raise refused(path, st.st_mode)
    return [(path, st.st_size, local_etag(st))]


def refused(path: str, mode: int) -> localfs.UnsafePath:
    return localfs.UnsafePath(f"file://{path}: {localfs.not_regular(path, mode)}; a dataset "
                              "is read from regular files and directories only (remove it, "
                              "or name a narrower prefix or glob)")


def reaches(pattern: list[str], rel: list[str]) -> bool:
    """Whether a glob's segments (below its base) can match a key under the directory
    whose segments (below the same base) are ``rel``."""
    for i, name in enumerate(rel):
        if i < len(pattern) and "**" in pattern[i]:
            return True
        if i >= len(pattern) - 1 or not glob_regex(pattern[i]).fullmatch(name):
            return False
    return True


def list_local(base: str, glob: str | None, limit: int) -> list[tuple[str, int, str]]:
    """(path, size, ETag) of the regular files under the directory ``base`` that
    ``glob`` (None: all) names, hidden ones left out, sorted (see the module: what it
    walks, and the links and special files that refuse it)."""
    match = glob_regex(glob) if glob is not None else None
    pattern = glob[len(base):].split("/") if glob is not None else []

    def named(key: str) -> bool:
        return not hidden(key, base) and (match is None or bool(match.fullmatch(key)))

    def reached(key: str) -> bool:
        rel = localfs.parts(key[len(base):])
        return not hidden(key + "/", base) and (match is None or reaches(pattern, rel))

    out: list[tuple[str, int, str]] = []
    todo = [base.rstrip("/") or "/"]
    while todo and len(out) <= 10 * limit + 1000:
        d = todo.pop()
        try:
            entries = list(os.scandir(d))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for e in entries:
            p = f"{d.rstrip('/')}/{e.name}"
            if e.is_dir(follow_symlinks=False):
                if reached(p):
                    todo.append(p)
                continue
            st = e.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                if named(p):
                    out.append((p, st.st_size, local_etag(st)))
            elif reached(p) if is_dir(p) else named(p):
                raise refused(p, st.st_mode)
    return sorted(out)


def is_dir(path: str) -> bool:
    """Whether a link leads to a directory (its target stat'ed, never opened)."""
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False
