"""One object-store interface with two implementations: S3 (boto3) and a local directory.

Writes take a readable binary stream and never hold a whole object in memory
(S3 uses multipart uploads above ``multipart_threshold``); reads are streamed.
A write is atomic: readers see the old object or the new one, never a part.
``compose`` writes one object as the concatenation of others (an upload's parts):
server-side on S3 where its multipart rules allow, streamed otherwise.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path
from typing import IO, Any, Protocol
from urllib.parse import urlparse

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

CHUNK = 1024 * 1024
# S3's multipart rules: every part but the last at least 5 MiB, at most 5 GiB each, at
# most 10,000 parts.
MIN_PART, MAX_PART, MAX_PARTS = 5 * CHUNK, 5 * 1024**3, 10_000
SINGLE_PUT = 64 * CHUNK  # the most a rewindable stream sends as one PUT (S3Store)
COPIES = 8  # part copies in flight at once (S3Store.compose)


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
    """A directory; writes go to a temp file in the same directory, then rename."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        p = (self.root / key).resolve()
        if self.root.resolve() not in p.parents:
            raise ValueError(f"invalid object key {key!r}")
        return p

    def put_stream(self, key: str, stream: IO[bytes]) -> int:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(stream, out, CHUNK)
                n = out.tell()
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return n

    def open(self, key: str) -> IO[bytes]:
        try:
            return open(self._path(key), "rb")
        except FileNotFoundError as e:
            raise ObjectNotFound(key) from e

    def size(self, key: str) -> int:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError as e:
            raise ObjectNotFound(key) from e

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list(self, prefix: str) -> list[str]:
        base = self.root.resolve()
        out = []
        for p in base.rglob("*"):
            if p.is_file() and not p.name.startswith(".tmp-"):
                rel = p.relative_to(base).as_posix()
                if rel.startswith(prefix):
                    out.append(rel)
        return sorted(out)


def _transient(exc: BaseException) -> bool:
    from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

    if isinstance(exc, ConnectionError | HTTPClientError):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or status == 429
    return False


_retry = retry(
    retry=retry_if_exception(_transient),
    wait=wait_random_exponential(multiplier=0.2, max=5),
    stop=stop_after_attempt(5),
    reraise=True,
)


class S3Store(ObjectStore, PartsInPlace):
    """``s3://bucket/prefix``; the endpoint comes from ``AWS_ENDPOINT_URL`` or ``endpoint_url``."""

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None,
                 client: Any = None, multipart_threshold: int = 8 * CHUNK) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.client = client or boto3.client(
            "s3", endpoint_url=endpoint_url,
            config=Config(retries={"mode": "standard", "max_attempts": 5},
                          connect_timeout=10, read_timeout=60),
        )
        # Objects of at least part_size go up as multipart uploads of part_size parts.
        self.part_size = max(5 * CHUNK, multipart_threshold)

    def _key(self, key: str) -> str:
        return self.prefix + key

    def put_stream(self, key: str, stream: IO[bytes]) -> int:
        """Retried as a whole only when the stream can be rewound; otherwise botocore's
        per-part retries are all there is (a retry must never upload a truncated rest).
        A rewindable stream read from its start and of at most ``SINGLE_PUT`` bytes (a
        spooled request body, an upload's part) goes up as one PUT that botocore reads
        from it in blocks."""
        if not (hasattr(stream, "seekable") and stream.seekable()):
            return self._upload(key, stream)
        start = stream.tell()
        size = stream.seek(0, io.SEEK_END) - start
        stream.seek(start)

        def attempt() -> int:
            stream.seek(start)
            if start == 0 and size <= SINGLE_PUT:  # botocore rewinds a body to 0
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=stream)
                return size
            return self._upload(key, stream)

        return int(_retry(attempt)())

    def _upload(self, key: str, stream: IO[bytes]) -> int:
        """Sequential multipart upload: one part in memory at a time, whatever the size."""
        k = self._key(key)
        data = read_full(stream, self.part_size)
        if len(data) < self.part_size:
            self.client.put_object(Bucket=self.bucket, Key=k, Body=data)
            return len(data)
        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=k)["UploadId"]
        parts: list[dict[str, Any]] = []
        total = 0
        try:
            while data:
                n = len(parts) + 1
                r = self.client.upload_part(Bucket=self.bucket, Key=k, UploadId=upload_id,
                                            PartNumber=n, Body=data)
                parts.append({"PartNumber": n, "ETag": r["ETag"]})
                total += len(data)
                data = read_full(stream, self.part_size)
            self.client.complete_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})
        except BaseException:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id)
            raise
        return total

    def compose(self, key: str, part_keys: Sequence[str], digest: Digest | None = None) -> int:
        """A server-side copy when S3 can make the parts those of one multipart upload
        (every part but the last at least 5 MiB): ``upload_part_copy`` per part, up to
        ``COPIES`` at once, no byte through this process (but those ``digest`` reads
        back, once, when given); otherwise the streamed default."""
        sizes = [self.size(k) for k in part_keys]
        if not (0 < len(sizes) <= MAX_PARTS and all(n >= MIN_PART for n in sizes[:-1])
                and all(n <= MAX_PART for n in sizes)):
            return super().compose(key, part_keys, digest)
        _retry(self._copy_parts)(key, part_keys)
        if digest is not None:
            for block in self.iter_chunks(key):
                digest.update(block)
        return sum(sizes)

    def _copy_parts(self, key: str, part_keys: Sequence[str]) -> None:
        k = self._key(key)
        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=k)["UploadId"]

        def copy(n: int, part: str) -> dict[str, Any]:
            r = self.client.upload_part_copy(
                Bucket=self.bucket, Key=k, UploadId=upload_id, PartNumber=n,
                CopySource={"Bucket": self.bucket, "Key": self._key(part)})
            return {"PartNumber": n, "ETag": r["CopyPartResult"]["ETag"]}

        try:
            with ThreadPoolExecutor(min(COPIES, len(part_keys))) as pool:
                parts = list(pool.map(copy, range(1, len(part_keys) + 1), part_keys))
            self.client.complete_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})
        except BaseException:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id)
            raise

    # Parts in place (an upload's parts as the parts of its object's multipart upload)

    @_retry
    def begin_parts(self, key: str) -> str:
        r = self.client.create_multipart_upload(Bucket=self.bucket, Key=self._key(key))
        return str(r["UploadId"])

    def put_part(self, key: str, parts_id: str, number: int, stream: IO[bytes]) -> str:
        from botocore.exceptions import ClientError

        start = stream.tell()

        def attempt() -> str:
            stream.seek(start)
            r = self.client.upload_part(Bucket=self.bucket, Key=self._key(key),
                                        UploadId=parts_id, PartNumber=number, Body=stream)
            return str(r["ETag"])

        try:
            return str(_retry(attempt)())
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "NoSuchUpload":
                raise PartsGone(key) from e
            raise

    def end_parts(self, key: str, parts_id: str, parts: Sequence[tuple[int, str]]) -> None:
        from botocore.exceptions import ClientError

        try:
            _retry(self.client.complete_multipart_upload)(
                Bucket=self.bucket, Key=self._key(key), UploadId=parts_id,
                MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in parts]})
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "NoSuchUpload":
                raise PartsGone(key) from e
            raise

    def abort_parts(self, key: str, parts_id: str) -> None:
        from botocore.exceptions import ClientError

        try:
            _retry(self.client.abort_multipart_upload)(Bucket=self.bucket, Key=self._key(key),
                                                       UploadId=parts_id)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "NoSuchUpload":
                raise

    def copy_part(self, key: str, parts_id: str, number: int, source: str) -> str:
        r = _retry(self.client.upload_part_copy)(
            Bucket=self.bucket, Key=self._key(key), UploadId=parts_id, PartNumber=number,
            CopySource={"Bucket": self.bucket, "Key": self._key(source)})
        return str(r["CopyPartResult"]["ETag"])

    def compose_ranges(self, key: str, pieces: Sequence[tuple[str, int, int]],
                       digest: Digest | None = None) -> int:
        """Server-side ranged part copies where S3's part rules allow (every piece but
        the last at least 5 MiB), else the pieces streamed through this process."""
        total = sum(n for _, _, n in pieces)
        if (0 < len(pieces) <= MAX_PARTS and all(n >= MIN_PART for _, _, n in pieces[:-1])
                and all(0 < n <= MAX_PART for _, _, n in pieces)):
            _retry(self._copy_ranges)(key, pieces)
            if digest is not None:
                for block in self.iter_chunks(key):
                    digest.update(block)
            return total

        def blocks() -> Iterator[bytes]:
            for source, off, n in pieces:
                body = self.client.get_object(Bucket=self.bucket, Key=self._key(source),
                                              Range=f"bytes={off}-{off + n - 1}")["Body"]
                while block := body.read(CHUNK):
                    if digest is not None:
                        digest.update(block)
                    yield block

        return self.put_stream(key, io.BufferedReader(ConcatReader(blocks()), CHUNK))

    def _copy_ranges(self, key: str, pieces: Sequence[tuple[str, int, int]]) -> None:
        k = self._key(key)
        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=k)["UploadId"]

        def copy(n: int, piece: tuple[str, int, int]) -> dict[str, Any]:
            source, off, size = piece
            r = self.client.upload_part_copy(
                Bucket=self.bucket, Key=k, UploadId=upload_id, PartNumber=n,
                CopySource={"Bucket": self.bucket, "Key": self._key(source)},
                CopySourceRange=f"bytes={off}-{off + size - 1}")
            return {"PartNumber": n, "ETag": r["CopyPartResult"]["ETag"]}

        try:
            with ThreadPoolExecutor(min(COPIES, len(pieces))) as pool:
                parts = list(pool.map(copy, range(1, len(pieces) + 1), pieces))
            self.client.complete_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id,
                                                  MultipartUpload={"Parts": parts})
        except BaseException:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id)
            raise

    @_retry
    def open(self, key: str) -> IO[bytes]:
        from botocore.exceptions import ClientError

        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise ObjectNotFound(key) from e
            raise
        return obj["Body"]

    @_retry
    def size(self, key: str) -> int:
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise ObjectNotFound(key) from e
            raise
        return int(head["ContentLength"])

    @_retry
    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))

    @_retry
    def list(self, prefix: str) -> list[str]:
        out: list[str] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self._key(prefix))
        for page in pages:
            out.extend(o["Key"][len(self.prefix):] for o in page.get("Contents", []))
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


def open_store(url: str, endpoint_url: str | None = None) -> ObjectStore:
    """``file:///path`` or ``s3://bucket/prefix``."""
    u = urlparse(url)
    if u.scheme == "file":
        return LocalStore(Path(u.path))
    if u.scheme == "s3":
        return S3Store(u.netloc, u.path, endpoint_url=endpoint_url)
    raise ValueError(f"unsupported object store URL {url!r} (use file:// or s3://)")


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
