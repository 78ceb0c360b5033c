"""Datasets where their owners keep them: objects named by a URI, listed and read in place.

A dataset URI is ``s3://bucket/key`` (the deployment's S3 endpoint and credentials:
``AWS_ENDPOINT_URL`` and boto3's usual chain) or ``file:///path`` (a directory the
service's processes share, for a single-machine deployment). It names one object, a
prefix (ending in ``/``: every object under it) or a glob over keys (``*`` and ``?``
within one path segment, ``**`` across segments). Objects whose name starts with ``_``
or ``.`` (``_SUCCESS``, ``.crc`` files, Spark's and Hive's markers) are skipped.

Every listed object carries its ETag (a local file: its modification time and size),
and ``open_pinned`` reads exactly that version: ranged reads with ``If-Match`` on S3,
so an object rewritten after it was listed raises ``SourceChanged`` instead of mixing
two versions' bytes. ``destination`` gives an ObjectStore rooted at a URI prefix, for
outputs written where the data team reads them. Listing a bucket that does not exist
raises ``NoBucket``, one the service's credentials may not list ``AccessDenied``.
Listings and pinned reads share one S3 client per process for the endpoint and
credentials the environment names (``s3_client``).

A file:// dataset never leaves its data location (storage.localfs): it is listed by
its real path below the location's, a symbolic link, FIFO, socket or device it names
is refused (never followed nor opened), and its files and output directories are
opened one component at a time without following links.
"""

from __future__ import annotations

import io
import os
import re
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

from storage import localfs
from storage.local_listing import glob_regex, hidden, list_local, local_etag, one_local
from storage.objects import CHUNK, LocalStore, ObjectStore
from storage.s3_store import S3Store

SCHEMES = ("s3", "file")
GLOB_CHARS = re.compile(r"[*?\[]")
READAHEAD = 4 * CHUNK  # the least one ranged GET asks for (a footer read is a few bytes)
# The environment that picks boto3's endpoint and credentials: a process makes one client
# for each combination it meets (boto3's clients are thread-safe).
CLIENT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID",
              "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
              "AWS_DEFAULT_REGION")
_clients: dict[tuple[Any, ...], Any] = {}
_clients_lock = threading.Lock()


class SourceChanged(Exception):
    """An object was rewritten or deleted after it was listed (its ETag pinned)."""


class BadLocation(ValueError):
    """A URI this module cannot read or write (its scheme, its form)."""


class NotFollowed(BadLocation):
    """A file:// URI that passes through a symbolic link below its data location, or
    names a link, a FIFO, a socket or a device: never followed, never opened."""


class NoBucket(Exception):
    """The bucket a URI names is not in the object store."""


class AccessDenied(Exception):
    """The service's object-store credentials may not list what a URI names."""


@dataclass(frozen=True)
class Location:
    """A parsed dataset URI: ``scheme``, ``bucket`` (empty for file://) and ``key``
    (the path within it, no leading slash for s3://, absolute for file://)."""

    scheme: str
    bucket: str
    key: str

    @property
    def uri(self) -> str:
        return (f"s3://{self.bucket}/{self.key}" if self.scheme == "s3"
                else f"file://{self.key}")

    @property
    def is_glob(self) -> bool:
        return bool(GLOB_CHARS.search(self.key))

    def within(self, prefix: Location) -> bool:
        """Whether every object this URI can name lies under ``prefix`` (a location a
        project may use): same scheme and bucket, and the key starts with the prefix's
        at a path boundary. ``..`` segments are refused before (``parse``)."""
        if (self.scheme, self.bucket) != (prefix.scheme, prefix.bucket):
            return False
        base = prefix.key
        if not base or base.endswith("/"):
            return self.key.startswith(base)
        return self.key == base or self.key.startswith(base + "/")


def parse(uri: str) -> Location:
    """A URI's Location; BadLocation saying what is wrong with it."""
    u = urlparse(uri)
    if u.scheme not in SCHEMES:
        raise BadLocation(f"a dataset URI starts with s3:// or file://, got {uri[:80]!r}")
    if u.query or u.fragment or u.params:
        raise BadLocation("a dataset URI has no query (?) or fragment (#)")
    if u.scheme == "s3":
        if not u.netloc:
            raise BadLocation(f"an S3 URI names its bucket: s3://bucket/key, got {uri[:80]!r}")
        key = u.path.lstrip("/")
    else:
        if u.netloc not in ("", "localhost"):
            raise BadLocation("a file:// URI names a local path: file:///path")
        key = u.path
        if not key.startswith("/"):
            raise BadLocation("a file:// URI names an absolute path: file:///path")
    if any(part in (".", "..") for part in key.split("/")):
        raise BadLocation("a dataset URI has no . or .. segments")
    if "\x00" in key:
        raise BadLocation("a dataset URI holds no NUL character")
    return Location(u.scheme, u.netloc if u.scheme == "s3" else "", key)


@dataclass(frozen=True)
class SourceObject:
    """One object of a dataset, as listed: read back only in this version."""

    uri: str
    size: int
    etag: str


def s3_client() -> Any:
    """This process's S3 client for the endpoint and credentials the environment names:
    made on first use, then shared by every listing and pinned read (a client per call
    is slow)."""
    key = (os.getpid(), *(os.environ.get(name) for name in CLIENT_ENV))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = _new_s3_client()
    return client


def _new_s3_client() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(retries={"mode": "standard", "max_attempts": 5},
                                            connect_timeout=10, read_timeout=60))


@contextmanager
def _refusals(loc: Location) -> Iterator[None]:
    """S3's refusals of a listing as this module's: ``NoBucket``, ``AccessDenied``."""
    from botocore.exceptions import ClientError

    try:
        yield
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code")
        if code == "NoSuchBucket":
            raise NoBucket(loc.bucket) from e
        if code in ("AccessDenied", "403"):
            raise AccessDenied(loc.uri) from e
        raise


def local_real(loc: Location, root: Location | None = None) -> Location:
    """A file:// location as its real path below ``root`` (the project's data location
    it lies in; without one, the directory its listing starts from): ``root``'s own
    links are resolved, and BadLocation names any existing component below it that
    is a symbolic link (storage.localfs.real_under). An S3 location as it is."""
    if loc.scheme != "file":
        return loc
    base = root.key if root is not None else _base(loc)
    try:
        return Location("file", "", localfs.real_under(base or "/", loc.key))
    except localfs.UnsafePath as e:
        raise NotFollowed(f"{loc.uri}: {e}") from None


def _base(loc: Location) -> str:
    """The key a listing of ``loc`` starts from: the part before a glob's first wildcard
    up to its last ``/``; a prefix itself; one object's directory."""
    head = GLOB_CHARS.split(loc.key, 1)[0] if loc.is_glob else loc.key
    return head if head.endswith("/") and not loc.is_glob else head[:head.rfind("/") + 1]


def list_objects(loc: Location, limit: int, root: Location | None = None) -> list[SourceObject]:
    """The objects ``loc`` names, sorted by key, at most ``limit`` (BadLocation past it).
    None found is an empty list (the caller says so in its terms); NoBucket and
    AccessDenied when S3 refuses the listing. A file:// location is listed by its real
    path below ``root`` (``local_real``), and the objects carry their real paths; a
    symbolic link, a FIFO, a socket or a device among what it names is refused
    (NotFollowed naming it), never followed or opened."""
    if loc.scheme == "file":
        loc = local_real(loc, root)
    if loc.is_glob:
        head = GLOB_CHARS.split(loc.key, 1)[0]
        base = head[:head.rfind("/") + 1]
        match = glob_regex(loc.key)
    else:
        base, match = loc.key, None
    prefix_listing = match is not None or loc.key.endswith("/") or not loc.key
    if loc.scheme == "s3":
        with _refusals(loc):
            found = _list_s3(loc.bucket, base, limit)
    else:
        try:
            found = (list_local(base, loc.key if match is not None else None, limit)
                     if prefix_listing else one_local(loc.key))
        except localfs.UnsafePath as e:
            raise NotFollowed(str(e)) from None
    out: list[SourceObject] = []
    for key, size, etag in found:
        if match is not None:
            if not match.fullmatch(key) or hidden(key, base):
                continue
        elif prefix_listing:
            if hidden(key, base):
                continue
        elif key != loc.key:  # one object: a prefix match is not it
            continue
        if size == 0 and key.endswith("/"):
            continue  # a "directory" marker object
        out.append(SourceObject(Location(loc.scheme, loc.bucket, key).uri, size, etag))
        if len(out) > limit:
            raise BadLocation(f"{loc.uri} names more than {limit} objects; name fewer "
                              "(a narrower prefix or glob)")
    return out


def holds_objects(loc: Location) -> bool:
    """Whether anything lies under the prefix ``loc`` names (markers, links, FIFOs
    included; a local directory's links are not walked into); NoBucket and
    AccessDenied when S3 refuses the listing."""
    if loc.scheme == "s3":
        with _refusals(loc):
            r = s3_client().list_objects_v2(Bucket=loc.bucket, Prefix=loc.key, MaxKeys=1)
        return bool(r.get("KeyCount") or r.get("Contents"))
    try:
        st = os.lstat(loc.key)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if not stat.S_ISDIR(st.st_mode):
        return True  # a link or a file where the prefix's directory would be
    for dirpath, dirs, files in os.walk(loc.key):  # links to directories: not followed
        if files or any(os.path.islink(os.path.join(dirpath, d)) for d in dirs):
            return True
    return False


def _list_s3(bucket: str, prefix: str, limit: int) -> list[tuple[str, int, str]]:
    out: list[tuple[str, int, str]] = []
    pages = s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    for page in pages:
        for o in page.get("Contents", []):
            out.append((o["Key"], int(o["Size"]), o["ETag"]))
        if len(out) > 10 * limit + 1000:  # enough to know the limit is passed
            break
    return sorted(out)


class _PinnedS3(io.RawIOBase):
    """A seekable reader of one S3 object version: every read is a ranged GET with
    ``If-Match`` (and the reply's ETag is checked too), read ahead ``READAHEAD`` bytes."""

    def __init__(self, obj: SourceObject, client: Any) -> None:
        loc = parse(obj.uri)
        self.bucket, self.key, self.etag, self.size = loc.bucket, loc.key, obj.etag, obj.size
        self.client, self.pos = client, 0
        self.buf, self.buf_at = b"", 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _fetch(self, start: int, n: int) -> bytes:
        from botocore.exceptions import ClientError

        end = min(self.size, start + max(n, READAHEAD)) - 1
        try:
            r = self.client.get_object(Bucket=self.bucket, Key=self.key, IfMatch=self.etag,
                                       Range=f"bytes={start}-{end}")
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code")
            if code in ("PreconditionFailed", "412", "NoSuchKey", "404"):
                raise SourceChanged(f"s3://{self.bucket}/{self.key} changed after it was "
                                    "listed") from None
            raise
        if r.get("ETag") not in (None, self.etag):
            raise SourceChanged(f"s3://{self.bucket}/{self.key} changed after it was listed")
        data: bytes = r["Body"].read()
        return data

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self.size - self.pos
        n = min(n, self.size - self.pos)
        if n <= 0:
            return b""
        off = self.pos - self.buf_at
        if not (0 <= off and off + n <= len(self.buf)):
            self.buf, self.buf_at, off = self._fetch(self.pos, n), self.pos, 0
        data = self.buf[off:off + n]
        self.pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


class _PinnedLocal(io.FileIO):
    """A local file, checked against its listed modification time and size on open
    and on close (a rewrite in between is SourceChanged). Its listed path is a real
    one: it is opened from ``/`` without following a link, and only if it is still a
    regular file (a link or a FIFO put in its place is SourceChanged, never read)."""

    def __init__(self, obj: SourceObject) -> None:
        self.obj = obj
        self.path = parse(obj.uri).key
        try:
            fd = localfs.open_file(self.path)
        except (FileNotFoundError, NotADirectoryError):
            raise SourceChanged(f"{obj.uri} was deleted after it was listed") from None
        except localfs.UnsafePath as e:
            raise SourceChanged(f"{obj.uri} changed after it was listed: {e}") from None
        super().__init__(fd, "rb", closefd=True)
        self._check()

    def _check(self) -> None:
        if local_etag(os.fstat(self.fileno())) != self.obj.etag:
            raise SourceChanged(f"{self.obj.uri} changed after it was listed")

    def close(self) -> None:
        if not self.closed:
            try:
                self._check()
            finally:
                super().close()


def open_pinned(obj: SourceObject, client: Any = None) -> IO[bytes]:
    """A seekable binary reader of ``obj`` in its listed version (close it when done)."""
    loc = parse(obj.uri)
    if loc.scheme == "s3":
        return _PinnedS3(obj, client or s3_client())  # type: ignore[return-value]
    return _PinnedLocal(obj)


def destination(loc: Location) -> ObjectStore:
    """An ObjectStore whose keys are relative to the prefix ``loc`` names. A file://
    prefix is a real path (``local_real`` made it so at the batch's creation): its
    directories are created and opened without following a link (a link put in its
    path since is refused: ``localfs.UnsafePath``), and its files are readable by the
    team's other users (0644 under the usual umask), as any file its writer makes."""
    if loc.is_glob:
        raise BadLocation("an output URI is a prefix, not a glob")
    if loc.scheme == "s3":
        return S3Store(loc.bucket, loc.key)
    return LocalStore(Path(loc.key), mode=0o666, exact=True)
