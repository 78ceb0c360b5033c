"""The object-store interface, its local-directory implementation, and stream helpers.

Writes take a readable binary stream and never hold a whole object in memory
(S3 uses multipart uploads above ``multipart_threshold``); reads are streamed.
A write is atomic: readers see the old object or the new one, never a part.
``compose`` writes one object as the concatenation of others (an upload's parts):
server-side on S3 where its multipart rules allow, streamed otherwise. The S3
implementation is storage.s3_store's; ``storage.stores.open_store`` opens either by URL.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import stat
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import suppress
from itertools import chain
from pathlib import Path
from typing import IO, Any, Protocol

from storage import localfs

CHUNK = 1024 * 1024
# S3's multipart rules: every part but the last at least 5 MiB, at most 5 GiB each, at
# most 10,000 parts.
MIN_PART, MAX_PART, MAX_PARTS = 5 * CHUNK, 5 * 1024**3, 10_000


class ObjectNotFound(KeyError):
    pass


class Digest(Protocol):
    """What ``compose`` feeds the bytes it writes to (``hashlib.md5()``, say)."""

    def update(self, data: bytes, /) -> None: ...


class ObjectStore(ABC):
    @abstractmethod
    def put_stream(self, key: str, stream: IO[bytes]) -> int:
        """Store everything read from ``stream`` under ``key``; returns the byte count."""

    @abstractmethod
    def open(self, key: str) -> IO[bytes]:
        """A streamed reader of the object (close it when done)."""

    @abstractmethod
    def size(self, key: str) -> int: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def list(self, prefix: str) -> list[str]: ...

    def put_bytes(self, key: str, data: bytes) -> int:
        import io

        return self.put_stream(key, io.BytesIO(data))

    def get_bytes(self, key: str) -> bytes:
        with self.open(key) as f:
            return f.read()

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
            return True
        except ObjectNotFound:
            return False

    def iter_chunks(self, key: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        with self.open(key) as f:
            while block := f.read(chunk_size):
                yield block

    def download(self, key: str, path: Path) -> None:
        with self.open(key) as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)

    def delete_prefix(self, prefix: str) -> None:
        for key in self.list(prefix):
            self.delete(key)

    def compose(self, key: str, part_keys: Sequence[str], digest: Digest | None = None) -> int:
        """Store the concatenation of the objects ``part_keys``, in that order, under
        ``key`` (the parts are left as they are); returns its byte count. ``digest``,
        if given, is fed every byte of the result. This default streams the parts'
        chunks through ``put_stream``: one chunk in memory at a time."""
        def blocks() -> Iterator[bytes]:
            for block in chain.from_iterable(self.iter_chunks(k) for k in part_keys):
                if digest is not None:
                    digest.update(block)
                yield block

        return self.put_stream(key, io.BufferedReader(ConcatReader(blocks()), CHUNK))


class PartsInPlace(ABC):
    """A store that writes an object from parts sent one by one, numbered as they come
    (S3's multipart upload): an upload's parts go straight into its object's parts, and
    completing it costs no copy."""

    @abstractmethod
    def begin_parts(self, key: str) -> str:
        """Start an object made of parts; returns the id of its parts."""

    @abstractmethod
    def put_part(self, key: str, parts_id: str, number: int, stream: IO[bytes]) -> str:
        """Store part ``number`` (1…10,000) read from the rewindable ``stream``; its ETag."""

    @abstractmethod
    def end_parts(self, key: str, parts_id: str, parts: Sequence[tuple[int, str]]) -> None:
        """Make the object of ``parts`` ((number, ETag), numbers ascending); the others
        are dropped. ``PartsGone`` if they were ended or aborted before."""

    @abstractmethod
    def abort_parts(self, key: str, parts_id: str) -> None:
        """Drop every part (nothing to drop is no error)."""

    @abstractmethod
    def copy_part(self, key: str, parts_id: str, number: int, source: str) -> str:
        """Make the object ``source`` part ``number``, server-side; its ETag."""

    @abstractmethod
    def compose_ranges(self, key: str, pieces: Sequence[tuple[str, int, int]],
                       digest: Digest | None = None) -> int:
        """Store the byte ranges ((source key, offset, length)), in that order, as
        ``key``; its byte count (``digest`` fed every byte, as ``compose``)."""


class PartsGone(Exception):
    """The parts of an object were ended or aborted already."""


class LocalStore(ObjectStore):
    """A directory; writes go to a temp file in the same directory, then rename.

    A key is a relative path (no ``..``, no leading ``/``). Every operation opens the
    key's directories one by one from the root's real path without following links
    (storage.localfs): a key that passes through a symbolic link, or names one, a FIFO
    or a device, is refused (``UnsafePath``), so nothing outside the root is ever read
    or written through the store, and a write replaces a link at its key, never its
    target. ``listing`` never lists links. Files are created with ``mode`` (less the
    umask): 0600 for the service's own objects, 0666 for an output dataset that a
    team's other users read (0644 under the usual umask). ``exact``: the root's path
    must be its real path (no link in it at all; a root a caller resolved already)."""

    def __init__(self, root: Path, mode: int = 0o600, exact: bool = False) -> None:
        self.root = Path(root)
        self.real = os.path.realpath(self.root)
        if exact and self.real != os.path.normpath(self.root):
            raise localfs.UnsafePath(f"{self.root} passes through a symbolic link: links "
                                     "are never followed")
        self.mode = mode
        os.close(localfs.open_dir(self.real, create=True))

    def _split(self, key: str) -> tuple[list[str], str]:
        names = localfs.parts(key)
        if key.startswith("/") or "\x00" in key or not names or ".." in names:
            raise ValueError(f"invalid object key {key!r}")
        return names[:-1], names[-1]

    def _dir(self, dirs: list[str], create: bool = False) -> int:
        return localfs.open_dir("/".join([self.real, *dirs]), create=create)

    def _shown(self, key: str) -> str:
        return f"{self.real}/{key}"

    def put_stream(self, key: str, stream: IO[bytes]) -> int:
        dirs, name = self._split(key)
        dfd = self._dir(dirs, create=True)
        try:
            tmp = f".tmp-{secrets.token_hex(8)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, self.mode, dir_fd=dfd)
            try:
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(stream, out, CHUNK)
                    n = out.tell()
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                with suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=dfd)
                raise
        finally:
            os.close(dfd)
        return n

    def open(self, key: str) -> IO[bytes]:
        dirs, name = self._split(key)
        try:
            dfd = self._dir(dirs)
            try:
                fd = localfs.open_file_at(dfd, name, self._shown(key))
            finally:
                os.close(dfd)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise ObjectNotFound(key) from e
        return os.fdopen(fd, "rb")

    def size(self, key: str) -> int:
        dirs, name = self._split(key)
        try:
            dfd = self._dir(dirs)
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            finally:
                os.close(dfd)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise ObjectNotFound(key) from e
        if not stat.S_ISREG(st.st_mode):
            raise localfs.not_regular(self._shown(key), st.st_mode)
        return st.st_size

    def delete(self, key: str) -> None:
        dirs, name = self._split(key)
        try:
            dfd = self._dir(dirs)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            os.unlink(name, dir_fd=dfd)  # a link itself, never its target
        except FileNotFoundError:
            pass
        finally:
            os.close(dfd)

    def list(self, prefix: str) -> list[str]:
        """The keys of the regular files under the root whose key starts with
        ``prefix`` (links, FIFOs and the like are never listed, nor walked into)."""
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        dirs = localfs.parts(head)
        if ".." in dirs:
            raise ValueError(f"invalid object key prefix {prefix!r}")
        try:
            top = self._dir(dirs)
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        try:
            for dirpath, _dirs, files, dfd in os.fwalk(".", dir_fd=top):
                rel = "/".join([*dirs, *localfs.parts(dirpath)])
                for name in files:
                    key = f"{rel}/{name}" if rel else name
                    if name.startswith(".tmp-") or not key.startswith(prefix):
                        continue
                    with suppress(FileNotFoundError):
                        if stat.S_ISREG(os.stat(name, dir_fd=dfd,
                                                follow_symlinks=False).st_mode):
                            out.append(key)
        finally:
            os.close(top)
        return sorted(out)


def read_full(stream: IO[bytes], n: int) -> bytes:
    """Read exactly ``n`` bytes unless the stream ends first (raw streams read short)."""
    buf = bytearray()
    while len(buf) < n:
        block = stream.read(n - len(buf))
        if not block:
            break
        buf += block
    return bytes(buf)


class _RawAdapter(io.RawIOBase):
    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.stream.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.stream.close()
        super().close()


def buffered(stream: IO[bytes], size: int = CHUNK) -> io.BufferedReader:
    """A buffered reader (readline with a limit) over any ``read(n)`` stream."""
    return io.BufferedReader(_RawAdapter(stream), size)


class ConcatReader(io.RawIOBase):
    """Reads a sequence of byte blocks as one stream (streamed concatenation)."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self.blocks = blocks
        self.buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self.buf:
            nxt = next(self.blocks, None)
            if nxt is None:
                return 0
            self.buf = nxt
        n = min(len(b), len(self.buf))
        b[:n] = self.buf[:n]
        self.buf = self.buf[n:]
        return n
