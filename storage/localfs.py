"""Local paths that never follow a symbolic link, and never open what is not a file.

A data location (``file:///L/a/``) and the local object store are directories that
other users may write into; a link in them (``linkdir -> /L/b/in``, ``passwd.jsonl ->
/etc/passwd``) must not lead a read or a write out of them, and a FIFO or a device in
them must not block the process that opens it. So:

- ``real_under`` resolves a path below a root: the root's own links are resolved (an
  admin named it), every existing component below it must be a real directory or
  file, never a link (``UnsafePath`` naming it);
- ``open_dir`` opens a directory one component at a time from ``/`` with
  ``O_NOFOLLOW`` (creating the missing ones if asked), so a link swapped in after a
  check is refused too, never followed;
- ``open_file_at`` opens a regular file without following a link and without
  blocking (``O_NONBLOCK``), then checks what it opened with ``fstat``: a FIFO, a
  socket or a device is refused (``UnsafePath``), never read.
"""

from __future__ import annotations

import errno
import os
import stat

# A directory is opened for walking only (O_PATH where there is one): search permission
# is enough, as for any path a process resolves.
_DIR = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
LINK = ("is a symbolic link: links under a data location or an object store are "
        "never followed")


class UnsafePath(ValueError):
    """A path through a symbolic link, or one that names something that is not a
    regular file (a FIFO, a socket, a device)."""


def kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(path: str, mode: int) -> UnsafePath:
    if stat.S_ISLNK(mode):
        return UnsafePath(f"{path} {LINK}")
    return UnsafePath(f"{path} is {kind(mode)}, not a regular file: only regular files are "
                      "read or written")


def parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


def real_under(root: str, path: str) -> str:
    """``path`` (``root`` or below it, both absolute) as a real path: ``root``'s real path
    joined with the rest, where no existing component below ``root`` may be a symbolic
    link (UnsafePath naming it as ``path`` spells it). Components that do not exist yet
    are kept as they are (a directory an output will create). The trailing ``/`` of
    ``path``, if any, is kept."""
    base = root.rstrip("/")
    if path != base and not path.startswith(base + "/"):
        raise UnsafePath(f"{path} is not under {root}")
    out = os.path.realpath(base or "/").rstrip("/")
    shown = base
    rest = parts(path[len(base):])
    for i, name in enumerate(rest):
        if name == "..":
            raise UnsafePath(f"{path} has a .. segment")
        out, shown = f"{out}/{name}", f"{shown}/{name}"
        try:
            st = os.lstat(out)
        except (FileNotFoundError, NotADirectoryError):
            out = "/".join([out, *rest[i + 1:]])
            break
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(f"{shown} {LINK}")
    out = out or "/"
    return out + "/" if path.endswith("/") and not out.endswith("/") else out


def _step(fd: int, name: str, at: str, create: bool) -> int:
    """The directory ``name`` in the directory ``fd``, opened without following a link."""
    try:
        return os.open(name, _DIR, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            raise UnsafePath(f"{at} {LINK}") from None
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", at) from None
    try:
        os.mkdir(name, dir_fd=fd)  # 0o777 less the umask, as mkdir(1) makes it
    except FileExistsError:
        pass
    return _step(fd, name, at, False)


def open_dir(path: str, create: bool = False) -> int:
    """A descriptor of the directory at the absolute ``path``, opened from ``/`` one
    component at a time without following links (UnsafePath naming a link), its missing
    components created if ``create`` (else FileNotFoundError; NotADirectoryError when
    one is a file). Close it when done."""
    fd = os.open("/", _DIR)
    at = ""
    try:
        for name in parts(path):
            if name == "..":
                raise UnsafePath(f"{path} has a .. segment")
            at += "/" + name
            nfd = _step(fd, name, at, create)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_file_at(dir_fd: int, name: str, shown: str) -> int:
    """A read-only descriptor of the regular file ``name`` in the directory ``dir_fd``,
    opened without following a link or blocking on a FIFO; UnsafePath (naming
    ``shown``) for a link or anything that is not a regular file. FileNotFoundError
    when it is not there."""
    mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    if not stat.S_ISREG(mode):  # never opened: a device's open may act
        raise not_regular(shown, mode)
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.ENODEV):  # swapped since the stat
            raise UnsafePath(f"{shown} is no longer a regular file") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(shown, mode)
    return fd


def open_file(path: str) -> int:
    """``open_file_at`` of an absolute path, its directories opened by ``open_dir``."""
    head, _, name = path.rstrip("/").rpartition("/")
    dfd = open_dir(head or "/")
    try:
        return open_file_at(dfd, name, path)
    finally:
        os.close(dfd)
