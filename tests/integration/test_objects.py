"""The ObjectStore contract, run identically against a local directory and moto's S3."""

from __future__ import annotations

import hashlib
import io
import os
import secrets
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage.objects import (
    ConcatReader,
    LocalStore,
    ObjectNotFound,
    ObjectStore,
    buffered,
)
from storage.s3_store import S3Store
from storage.stores import open_store

MiB = 1024 * 1024


class NonSeekable:
    """A plain ``read(n)`` stream (like a request body): no seek, no tell, no len."""

    def __init__(self, data: bytes) -> None:
        self._buf = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self._buf.read(n)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield open_store(f"file://{tmp_path / 'objects'}")
        return
    endpoint = request.getfixturevalue("s3_endpoint")
    s3 = S3Store("inferq-test", prefix=f"objtest-{secrets.token_hex(4)}", endpoint_url=endpoint)
    yield s3
    s3.delete_prefix("")


def test_open_store_picks_implementation(tmp_path: Path, s3_endpoint: str) -> None:
    local = open_store(f"file://{tmp_path}/x")
    assert isinstance(local, LocalStore)
    s3 = open_store("s3://inferq-test/some/prefix", endpoint_url=s3_endpoint)
    assert isinstance(s3, S3Store)
    assert s3.bucket == "inferq-test" and s3.prefix == "some/prefix/"
    with pytest.raises(ValueError):
        open_store("ftp://host/path")


def test_put_stream_get_bytes_roundtrip(store: ObjectStore) -> None:
    data = os.urandom(3000) + b"\n\x00tail"
    n = store.put_stream("a/b/c.bin", NonSeekable(data))
    assert n == len(data)
    assert store.get_bytes("a/b/c.bin") == data
    assert store.size("a/b/c.bin") == len(data)


def test_put_bytes_overwrites(store: ObjectStore) -> None:
    assert store.put_bytes("k", b"first version") == len(b"first version")
    assert store.put_bytes("k", b"2nd") == 3
    assert store.get_bytes("k") == b"2nd"
    assert store.size("k") == 3


def test_empty_object(store: ObjectStore) -> None:
    assert store.put_bytes("empty", b"") == 0
    assert store.exists("empty")
    assert store.size("empty") == 0
    assert store.get_bytes("empty") == b""
    assert list(store.iter_chunks("empty")) == []


def test_exists_and_delete(store: ObjectStore) -> None:
    assert not store.exists("d/x")
    store.put_bytes("d/x", b"1")
    assert store.exists("d/x")
    store.delete("d/x")
    assert not store.exists("d/x")
    store.delete("d/x")  # deleting a missing key is not an error
    assert store.list("d/") == []


def test_missing_key_raises_object_not_found(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        store.open("nope/missing")
    with pytest.raises(ObjectNotFound):
        store.size("nope/missing")
    with pytest.raises(ObjectNotFound):
        store.get_bytes("nope/missing")
    with pytest.raises(KeyError):  # ObjectNotFound is a KeyError
        store.size("nope/missing")


def test_list_with_prefix(store: ObjectStore) -> None:
    for k in ["p/a/1", "p/a/2", "p/b/1", "p/ab", "q/a/1"]:
        store.put_bytes(k, k.encode())
    assert store.list("p/a/") == ["p/a/1", "p/a/2"]
    assert store.list("p/a") == ["p/a/1", "p/a/2", "p/ab"]
    assert store.list("p/") == ["p/a/1", "p/a/2", "p/ab", "p/b/1"]
    assert store.list("q/") == ["q/a/1"]
    assert store.list("zzz/") == []
    assert store.list("") == ["p/a/1", "p/a/2", "p/ab", "p/b/1", "q/a/1"]


def test_delete_prefix(store: ObjectStore) -> None:
    for k in ["batches/b1/shards/0", "batches/b1/shards/1", "batches/b1/err.jsonl",
              "batches/b10/shards/0", "batches/b2/shards/0"]:
        store.put_bytes(k, b"x")
    store.delete_prefix("batches/b1/")
    assert store.list("batches/") == ["batches/b10/shards/0", "batches/b2/shards/0"]
    assert not store.exists("batches/b1/shards/0")
    assert store.exists("batches/b10/shards/0")


def test_iter_chunks_streams_in_order(store: ObjectStore) -> None:
    data = os.urandom(10_000)
    store.put_bytes("chunks", data)
    chunks = list(store.iter_chunks("chunks", chunk_size=4096))
    assert b"".join(chunks) == data
    assert len(chunks) >= 3
    assert all(len(c) <= 4096 for c in chunks)


def test_open_is_a_streamed_reader(store: ObjectStore) -> None:
    data = b"".join(f"line {i}\n".encode() for i in range(1000))
    store.put_bytes("lines.txt", data)
    f = store.open("lines.txt")
    try:
        assert f.read(7) == b"line 0\n"
        rest = f.read()
    finally:
        f.close()
    assert rest == data[7:]


def test_download(store: ObjectStore, tmp_path: Path) -> None:
    data = os.urandom(5000)
    store.put_bytes("dl", data)
    dst = tmp_path / "downloaded.bin"
    store.download("dl", dst)
    assert dst.read_bytes() == data


def test_buffered_readline_over_store_stream(store: ObjectStore) -> None:
    data = b"short\n" + b"x" * 100 + b"\nlast-no-newline"
    store.put_bytes("buf", data)
    with store.open("buf") as raw:
        r = buffered(raw, size=16)
        assert r.readline() == b"short\n"
        first = r.readline(10)
        assert first == b"x" * 10
        assert r.readline() == b"x" * 90 + b"\n"
        assert r.readline() == b"last-no-newline"
        assert r.readline() == b""


def test_s3_multipart_upload_roundtrips(s3_endpoint: str) -> None:
    s3 = S3Store("inferq-test", prefix=f"multipart-{secrets.token_hex(4)}",
                 endpoint_url=s3_endpoint, multipart_threshold=5 * MiB)
    data = os.urandom(12 * MiB + 12345)
    try:
        n = s3.put_stream("big.bin", NonSeekable(data))
        assert n == len(data)
        assert s3.size("big.bin") == len(data)
        head = s3.client.head_object(Bucket="inferq-test", Key=s3._key("big.bin"))
        # A multipart upload's ETag is "<md5 of part md5s>-<parts>".
        assert "-" in head["ETag"].strip('"')
        got = hashlib.sha256()
        total = 0
        for chunk in s3.iter_chunks("big.bin"):
            got.update(chunk)
            total += len(chunk)
        assert total == len(data)
        assert got.hexdigest() == hashlib.sha256(data).hexdigest()
    finally:
        s3.delete_prefix("")
    assert s3.list("") == []


def test_s3_prefix_isolates_stores(s3_endpoint: str) -> None:
    a = S3Store("inferq-test", prefix=f"iso-{secrets.token_hex(4)}/", endpoint_url=s3_endpoint)
    b = S3Store("inferq-test", prefix=f"iso-{secrets.token_hex(4)}", endpoint_url=s3_endpoint)
    try:
        a.put_bytes("k", b"A")
        b.put_bytes("k", b"B")
        assert a.get_bytes("k") == b"A" and b.get_bytes("k") == b"B"
        assert a.list("") == ["k"] and b.list("") == ["k"]
        a.delete_prefix("")
        assert b.get_bytes("k") == b"B"
    finally:
        a.delete_prefix("")
        b.delete_prefix("")


def test_concat_reader_uploads_as_one_object(store: ObjectStore) -> None:
    parts = [os.urandom(1000) for _ in range(5)]
    n = store.put_stream("concat", buffered(ConcatReader(iter(parts))))
    assert n == 5000
    assert store.get_bytes("concat") == b"".join(parts)


def test_short_reads_are_not_taken_for_the_end(s3_endpoint: str) -> None:
    """A raw stream may return fewer bytes than asked; uploads must keep reading."""
    import secrets as _secrets

    from storage.objects import ConcatReader
    from storage.s3_store import S3Store

    store = S3Store("inferq-test", prefix=f"short-{_secrets.token_hex(4)}",
                    endpoint_url=s3_endpoint, multipart_threshold=5 * 1024 * 1024)
    blocks = [bytes([i % 251]) * 700_000 for i in range(12)]  # 8.4 MB in short blocks
    n = store.put_stream("k", ConcatReader(iter(blocks)))  # type: ignore[arg-type]
    assert n == sum(map(len, blocks))
    assert store.get_bytes("k") == b"".join(blocks)


# compose: an object made of others, in order (an upload's parts) ------------------------


class Recording:
    """A boto3 client whose calls are counted by name (what crossed this process)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return call


@pytest.fixture
def recorded_s3(s3_endpoint: str) -> Iterator[tuple[S3Store, Recording]]:
    import boto3

    rec = Recording(boto3.client("s3", endpoint_url=s3_endpoint))
    s3 = S3Store("inferq-test", prefix=f"compose-{secrets.token_hex(4)}", client=rec)
    yield s3, rec
    s3.delete_prefix("")


def test_s3_rewindable_stream_goes_up_in_one_put(recorded_s3: tuple[S3Store, Recording]
                                                 ) -> None:
    """A seekable stream from its start (a spooled body, a part) of at most SINGLE_PUT
    bytes: one PUT read from it; read from elsewhere, the multipart upload as before."""
    s3, rec = recorded_s3
    data = os.urandom(12 * MiB + 5)
    assert s3.put_stream("one", io.BytesIO(data)) == len(data)
    assert rec.calls["put_object"] == 1 and rec.calls["upload_part"] == 0
    assert s3.get_bytes("one") == data
    rec.calls.clear()
    stream = io.BytesIO(data)
    stream.seek(MiB)
    assert s3.put_stream("rest", stream) == len(data) - MiB
    assert rec.calls["put_object"] == 0 and rec.calls["upload_part"] == 2  # 8 MiB parts
    assert s3.get_bytes("rest") == data[MiB:]


def test_compose_streams_small_parts_in_order(store: ObjectStore) -> None:
    """Parts under S3's 5 MiB minimum (and any parts on a local store): streamed."""
    parts = [os.urandom(1000), b"x", os.urandom(2 * MiB + 7), os.urandom(4096)]
    for i, p in enumerate(parts):
        store.put_bytes(f"parts/{i}", p)
    order = [2, 0, 3, 1]
    digest = hashlib.md5()
    n = store.compose("whole", [f"parts/{i}" for i in order], digest)
    whole = b"".join(parts[i] for i in order)
    assert n == len(whole)
    assert store.get_bytes("whole") == whole
    assert digest.hexdigest() == hashlib.md5(whole).hexdigest()
    assert [store.get_bytes(f"parts/{i}") for i in range(4)] == parts  # left as they were


def test_compose_of_a_missing_part_writes_nothing(store: ObjectStore) -> None:
    store.put_bytes("p0", b"a" * 100)
    with pytest.raises(ObjectNotFound):
        store.compose("whole", ["p0", "gone"])
    assert not store.exists("whole")


def test_s3_compose_copies_server_side(recorded_s3: tuple[S3Store, Recording]) -> None:
    """Every part but the last at least 5 MiB: one multipart upload of part copies, no
    byte of the parts read or sent by this process (unless a digest asks for them)."""
    s3, rec = recorded_s3
    parts = [os.urandom(5 * MiB), os.urandom(6 * MiB + 3), os.urandom(100)]
    for i, p in enumerate(parts):
        s3.put_bytes(f"p{i}", p)
    rec.calls.clear()
    n = s3.compose("whole", ["p1", "p0", "p2"])
    whole = parts[1] + parts[0] + parts[2]
    assert n == len(whole)
    assert rec.calls["upload_part_copy"] == 3
    assert rec.calls["complete_multipart_upload"] == 1
    assert rec.calls["get_object"] == rec.calls["upload_part"] == rec.calls["put_object"] == 0
    assert s3.get_bytes("whole") == whole
    head = rec.client.head_object(Bucket="inferq-test", Key=s3._key("whole"))
    assert head["ETag"].strip('"').endswith("-3")  # the three parts, as they were

    rec.calls.clear()
    digest = hashlib.md5()
    assert s3.compose("again", ["p0", "p2"], digest) == len(parts[0]) + 100
    assert digest.hexdigest() == hashlib.md5(parts[0] + parts[2]).hexdigest()
    assert rec.calls["upload_part_copy"] == 2
    assert rec.calls["get_object"] == 1  # read back once, for the digest
    assert rec.calls["upload_part"] == rec.calls["put_object"] == 0


def test_s3_compose_streams_when_a_part_is_too_small_to_copy(
        recorded_s3: tuple[S3Store, Recording]) -> None:
    s3, rec = recorded_s3
    parts = [os.urandom(5 * MiB), os.urandom(MiB), os.urandom(5 * MiB)]
    for i, p in enumerate(parts):
        s3.put_bytes(f"p{i}", p)
    rec.calls.clear()
    digest = hashlib.md5()
    n = s3.compose("whole", ["p0", "p1", "p2"], digest)  # the middle part is under 5 MiB
    whole = b"".join(parts)
    assert n == len(whole)
    assert rec.calls["upload_part_copy"] == 0
    assert rec.calls["get_object"] == 3  # each part read once, streamed
    assert s3.get_bytes("whole") == whole
    assert digest.hexdigest() == hashlib.md5(whole).hexdigest()


def test_s3_compose_aborts_a_failed_copy(recorded_s3: tuple[S3Store, Recording]) -> None:
    """A part deleted between the sizes and its copy: the multipart upload is aborted
    and no object is left under the key."""
    s3, rec = recorded_s3
    s3.put_bytes("p0", os.urandom(5 * MiB))
    s3.put_bytes("p1", b"tail")
    real = rec.client.upload_part_copy

    def vanish_then_copy(**kw: Any) -> Any:
        if kw["PartNumber"] == 2:
            rec.client.delete_object(Bucket="inferq-test", Key=s3._key("p1"))
        return real(**kw)

    rec.client.upload_part_copy = vanish_then_copy
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError):
        s3.compose("whole", ["p0", "p1"])
    assert rec.calls["abort_multipart_upload"] >= 1
    assert not s3.exists("whole")
    uploads = rec.client.list_multipart_uploads(Bucket="inferq-test", Prefix=s3._key(""))
    assert uploads.get("Uploads", []) == []
