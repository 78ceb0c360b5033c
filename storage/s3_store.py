"""The S3 object store (boto3): ``s3://bucket/prefix`` behind the ObjectStore interface.

Calls that fail with a 5xx, a 429 or a lost connection are retried with backoff (on
top of botocore's own retries); a stream that cannot be rewound is never retried as a
whole. Objects above the part size go up as multipart uploads, one part in memory at a
time; ``compose`` and ``compose_ranges`` copy server-side where S3's part rules allow.
The parts of an upload may go straight into an object's multipart upload
(``PartsInPlace``).
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import IO, Any

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential

from storage.objects import (
    CHUNK,
    MAX_PART,
    MAX_PARTS,
    MIN_PART,
    ConcatReader,
    Digest,
    ObjectNotFound,
    ObjectStore,
    PartsGone,
    PartsInPlace,
    read_full,
)

SINGLE_PUT = 64 * CHUNK  # the most a rewindable stream sends as one PUT (S3Store)
COPIES = 8  # part copies in flight at once (S3Store.compose)


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


@contextmanager
def _parts_gone(key: str) -> Iterator[None]:
    """S3's ``NoSuchUpload`` (the multipart upload was completed or aborted) as
    ``PartsGone``; any other error as it is."""
    from botocore.exceptions import ClientError

    try:
        yield
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") == "NoSuchUpload":
            raise PartsGone(key) from e
        raise


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
        _retry(self._copy_into)(key, [(p, None) for p in part_keys])
        if digest is not None:
            for block in self.iter_chunks(key):
                digest.update(block)
        return sum(sizes)

    def _copy_into(self, key: str, sources: Sequence[tuple[str, str | None]]) -> None:
        """``key`` made of ``sources`` in order (an object's key, and a byte range of it,
        ``bytes=a-b``, or None for all of it) by server-side part copies, up to
        ``COPIES`` at once; the multipart upload is aborted on any failure."""
        k = self._key(key)
        upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=k)["UploadId"]

        def copy(n: int, source: tuple[str, str | None]) -> dict[str, Any]:
            src, byte_range = source
            r = self.client.upload_part_copy(
                Bucket=self.bucket, Key=k, UploadId=upload_id, PartNumber=n,
                CopySource={"Bucket": self.bucket, "Key": self._key(src)},
                **({"CopySourceRange": byte_range} if byte_range else {}))
            return {"PartNumber": n, "ETag": r["CopyPartResult"]["ETag"]}

        try:
            with ThreadPoolExecutor(min(COPIES, len(sources))) as pool:
                parts = list(pool.map(copy, range(1, len(sources) + 1), sources))
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
        start = stream.tell()

        def attempt() -> str:
            stream.seek(start)
            r = self.client.upload_part(Bucket=self.bucket, Key=self._key(key),
                                        UploadId=parts_id, PartNumber=number, Body=stream)
            return str(r["ETag"])

        with _parts_gone(key):
            return str(_retry(attempt)())

    def end_parts(self, key: str, parts_id: str, parts: Sequence[tuple[int, str]]) -> None:
        with _parts_gone(key):
            _retry(self.client.complete_multipart_upload)(
                Bucket=self.bucket, Key=self._key(key), UploadId=parts_id,
                MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in parts]})

    def abort_parts(self, key: str, parts_id: str) -> None:
        with suppress(PartsGone), _parts_gone(key):
            _retry(self.client.abort_multipart_upload)(Bucket=self.bucket, Key=self._key(key),
                                                       UploadId=parts_id)

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
            _retry(self._copy_into)(key, [(source, f"bytes={off}-{off + n - 1}")
                                          for source, off, n in pieces])
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
