"""The Uploads API (``client.uploads``) through the official SDK in strict response
validation, against the app in this process (httpx's WSGI transport) on a database and
Redis DB of this module's own and the session's S3 server: parts out of order and
concurrent, completion into a File a batch can read, ``upload_file_chunked`` unchanged,
cancel, expiry, and every refusal in the OpenAI error shape with nothing created."""

from __future__ import annotations

import hashlib
import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import openai
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai import OpenAI
from sqlalchemy import func, select, update

from jobs.batches import janitor, uploads
from jobs.core.context import Context
from jobs.core.schema import File, now
from jobs.core.upload_tables import Upload, UploadPart
from storage import keys
from tests.helpers import WORLD_URL, api_error, emb_line, jsonl, world_http, world_sdk
from tests.integration.conftest import MAX_BYTES, PART_LIMIT, UPLOADS_MODEL

JSONL = "application/jsonl"


@pytest.fixture
def client(uploads_world: dict[str, Any]) -> OpenAI:
    return world_sdk(uploads_world)


@pytest.fixture
def ctx(uploads_world: dict[str, Any]) -> Context:
    c: Context = uploads_world["ctx"]
    return c


def dataset(n: int) -> bytes:
    return jsonl([emb_line(i, f"text number {i} " + "word " * (i % 7), model=UPLOADS_MODEL)
                  for i in range(n)])


def split(data: bytes, sizes: list[int]) -> list[bytes]:
    out, at = [], 0
    for n in sizes:
        out.append(data[at:at + n])
        at += n
    out.append(data[at:])
    return out


class Created:
    """What this module's project has in the database and under the store's files/."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.at = self.now()

    def now(self) -> tuple[int, int, int]:
        with self.ctx.db.session() as s:
            files = s.scalar(select(func.count()).select_from(File)) or 0
            parts = s.scalar(select(func.count()).select_from(UploadPart)) or 0
        return files, parts, len(self.ctx.store.list("files/"))

    def unchanged(self) -> bool:
        return self.now() == self.at


def part_objects(ctx: Context, upload_id: str) -> list[str]:
    """What the store holds of an upload's parts: objects of their own, or (S3) the
    parts of the multipart upload they went into in place."""
    found = ctx.store.list(keys.upload_prefix(upload_id))
    with ctx.db.session() as s:
        up = s.get(Upload, upload_id)
        in_place = up.store_upload_id if up is not None else None
    if in_place is not None:
        store: Any = ctx.store
        try:
            r = store.client.list_parts(Bucket=store.bucket, UploadId=in_place,
                                        Key=store._key(keys.upload_target(upload_id)))
        except store.client.exceptions.NoSuchUpload:
            return found
        found += [f"part {p['PartNumber']}" for p in r.get("Parts", [])]
    return found


def test_parts_out_of_order_and_concurrent_make_the_file(
        uploads_world: dict[str, Any], client: OpenAI, ctx: Context) -> None:
    data = dataset(400)
    chunks = split(data, [9000, 1, 12000, 7000, 20000, 3000, 5000])
    assert len(chunks) == 8 and all(chunks) and b"".join(chunks) == data
    up = client.uploads.create(bytes=len(data), filename="in.jsonl", mime_type=JSONL,
                               purpose="batch")
    assert up.id.startswith("upload_") and up.object == "upload"
    assert (up.status, up.bytes, up.filename, up.purpose, up.file) == (
        "pending", len(data), "in.jsonl", "batch", None)
    assert up.expires_at == up.created_at + 3600

    ids: dict[int, str] = {}
    for i in (6, 2):  # out of order, one by one
        p = client.uploads.parts.create(upload_id=up.id, data=chunks[i])
        assert p.object == "upload.part" and p.upload_id == up.id and p.id.startswith("part_")
        ids[i] = p.id
    rest = [i for i in range(len(chunks)) if i not in ids]
    with ThreadPoolExecutor(4) as pool:  # the rest at once, each on its own client
        made = pool.map(lambda i: (i, world_sdk(uploads_world).uploads.parts.create(upload_id=up.id,
                                                                      data=chunks[i])), rest)
        ids.update({i: p.id for i, p in made})
    assert len(set(ids.values())) == len(chunks)
    assert len(part_objects(ctx, up.id)) == len(chunks)

    md5 = hashlib.md5(data).hexdigest()
    done = client.uploads.complete(upload_id=up.id, part_ids=[ids[i] for i in range(8)],
                                   md5=md5.upper())
    assert done.id == up.id and done.status == "completed" and done.file is not None
    f = done.file
    assert (f.object, f.bytes, f.filename, f.purpose, f.status, f.expires_at) == (
        "file", len(data), "in.jsonl", "batch", "processed", None)
    assert client.files.retrieve(f.id).bytes == len(data)
    assert client.files.content(f.id).read() == data
    assert part_objects(ctx, up.id) == []  # the parts are gone, the file stays
    # Named in another order than they came: copied to the File's own object, and the
    # object they went into in place is gone.
    assert not ctx.store.exists(keys.upload_target(up.id))
    with ctx.db.session() as s:
        row = s.get(File, f.id)
        assert row is not None and row.format == "jsonl"
        u = s.get(Upload, up.id)
        assert u is not None and u.md5 == md5 and u.file_id == f.id

    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                                  completion_window="24h")
    assert batch.input_file_id == f.id and batch.status == "validating"

    # the same complete again (its answer lost): the same answer, no second file
    before = Created(ctx)
    again = client.uploads.complete(upload_id=up.id, part_ids=[ids[i] for i in range(8)])
    assert again.status == "completed" and again.file is not None and again.file.id == f.id
    with pytest.raises(openai.BadRequestError) as e:  # another order is not the same
        client.uploads.complete(upload_id=up.id, part_ids=[ids[i] for i in (1, 0, *range(2, 8))])
    assert api_error(e.value)["code"] == "upload_completed"
    with pytest.raises(openai.BadRequestError) as e:  # nor another md5
        client.uploads.complete(upload_id=up.id, part_ids=[ids[i] for i in range(8)],
                                md5="0" * 32)
    assert api_error(e.value)["param"] == "md5"
    with pytest.raises(openai.BadRequestError) as e:  # no part after completion
        client.uploads.parts.create(upload_id=up.id, data=b"more")
    assert api_error(e.value)["code"] == "upload_completed"
    with pytest.raises(openai.BadRequestError) as e:
        client.uploads.cancel(up.id)
    assert api_error(e.value)["code"] == "upload_completed"
    assert before.unchanged()


def test_concurrent_completes_make_one_file(uploads_world: dict[str, Any], ctx: Context) -> None:
    client = world_sdk(uploads_world)
    data = dataset(50)
    up = client.uploads.create(bytes=len(data), filename="x.jsonl", mime_type=JSONL,
                               purpose="batch")
    ids = [client.uploads.parts.create(upload_id=up.id, data=c).id
           for c in split(data, [len(data) // 2])]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda _: world_sdk(uploads_world).uploads.complete(upload_id=up.id,
                                                                  part_ids=ids), range(3)))
    assert {u.status for u in got} == {"completed"}
    assert len({u.file.id for u in got if u.file is not None}) == 1
    with ctx.db.session() as s:
        n = s.scalar(select(func.count()).select_from(File).where(File.filename == "x.jsonl"))
    assert n == 1


def test_upload_file_chunked_unchanged(client: OpenAI, ctx: Context, tmp_path: Path) -> None:
    data = dataset(1500)
    assert len(data) > 5 * 20_000
    path = tmp_path / "big.jsonl"
    path.write_bytes(data)
    up = client.uploads.upload_file_chunked(file=path, mime_type=JSONL, purpose="batch",
                                            part_size=20_000,
                                            md5=hashlib.md5(data).hexdigest())
    assert up.status == "completed" and up.filename == "big.jsonl" and up.file is not None
    assert client.files.content(up.file.id).read() == data
    with ctx.db.session() as s:
        parts = s.scalar(select(func.count()).select_from(UploadPart)
                         .where(UploadPart.upload_id == up.id))
    assert parts == -(-len(data) // 20_000)

    # in memory, a Parquet dataset: its format is told from its bytes, as for /v1/files
    buf = io.BytesIO()
    pq.write_table(pa.table({"input": [f"text {i}" for i in range(3000)]}), buf)
    table = buf.getvalue()
    pup = client.uploads.upload_file_chunked(file=table, filename="in.parquet",
                                             bytes=len(table), part_size=PART_LIMIT // 4,
                                             mime_type="application/vnd.apache.parquet",
                                             purpose="batch")
    assert pup.status == "completed" and pup.file is not None
    assert client.files.content(pup.file.id).read() == table
    with ctx.db.session() as s:
        f = s.get(File, pup.file.id)
        assert f is not None and f.format == "parquet"
    batch = client.batches.create(input_file_id=pup.file.id, endpoint="/v1/embeddings",
                                  completion_window="24h",
                                  extra_body={"body": {"model": UPLOADS_MODEL}})
    assert batch.status == "validating"


def test_format_is_told_from_the_first_bytes_across_parts(client: OpenAI, ctx: Context) -> None:
    """Parquet's magic split over parts shorter than itself is still Parquet."""
    buf = io.BytesIO()
    pq.write_table(pa.table({"input": ["a", "b"]}), buf)
    table = buf.getvalue()
    assert table[:4] == b"PAR1"
    up = client.uploads.create(bytes=len(table), filename="t.parquet",
                               mime_type="application/vnd.apache.parquet", purpose="batch")
    ids = [client.uploads.parts.create(upload_id=up.id, data=c).id
           for c in split(table, [2, 1])]
    done = client.uploads.complete(upload_id=up.id, part_ids=ids)
    assert done.file is not None
    with ctx.db.session() as s:
        f = s.get(File, done.file.id)
        assert f is not None and f.format == "parquet"


def test_expires_after_sets_the_files_expiry(client: OpenAI) -> None:
    up = client.uploads.create(bytes=3, filename="e.jsonl", mime_type="text/jsonl",
                               purpose="batch",
                               expires_after={"anchor": "created_at", "seconds": 7200})
    p = client.uploads.parts.create(upload_id=up.id, data=b"{}\n")
    done = client.uploads.complete(upload_id=up.id, part_ids=[p.id])
    assert done.file is not None and done.file.expires_at == done.file.created_at + 7200
    assert client.files.retrieve(done.file.id).expires_at == done.file.created_at + 7200


def test_cancel(client: OpenAI, ctx: Context) -> None:
    up = client.uploads.create(bytes=100, filename="c.jsonl", mime_type=JSONL,
                               purpose="batch")
    p = client.uploads.parts.create(upload_id=up.id, data=b"a" * 40)
    client.uploads.parts.create(upload_id=up.id, data=b"b" * 60)
    assert len(part_objects(ctx, up.id)) == 2
    before = Created(ctx)
    c = client.uploads.cancel(up.id)
    assert (c.id, c.status, c.file) == (up.id, "cancelled", None)
    assert part_objects(ctx, up.id) == []
    assert client.uploads.cancel(up.id).status == "cancelled"  # answered as it is
    with pytest.raises(openai.BadRequestError) as e:
        client.uploads.parts.create(upload_id=up.id, data=b"c")
    assert api_error(e.value)["code"] == "upload_cancelled"
    with pytest.raises(openai.BadRequestError) as e:
        client.uploads.complete(upload_id=up.id, part_ids=[p.id])
    assert api_error(e.value)["code"] == "upload_cancelled"
    files, _, objects = before.now()
    assert (files, objects) == before.at[::2]  # no file; (its 2 part rows are kept)


def test_expired_upload_is_refused_and_swept(client: OpenAI, ctx: Context) -> None:
    up = client.uploads.create(bytes=10, filename="x.jsonl", mime_type=JSONL, purpose="batch")
    p = client.uploads.parts.create(upload_id=up.id, data=b"0123456789")
    with ctx.db.session() as s:  # an hour later
        s.execute(update(Upload).where(Upload.id == up.id).values(expires_at=now() - 1))
    for call in (lambda: client.uploads.parts.create(upload_id=up.id, data=b"x"),
                 lambda: client.uploads.complete(upload_id=up.id, part_ids=[p.id]),
                 lambda: client.uploads.cancel(up.id)):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert api_error(e.value)["code"] == "upload_expired"
    assert len(part_objects(ctx, up.id)) == 1
    assert janitor.sweep(ctx).expired_uploads == [up.id]
    assert part_objects(ctx, up.id) == []
    with ctx.db.session() as s:
        u = s.get(Upload, up.id)
        assert u is not None and u.status == "expired"
    assert up.id not in uploads.expire(ctx)


def test_completion_refusals_create_nothing(client: OpenAI, ctx: Context) -> None:
    data = dataset(30)
    a, b = split(data, [len(data) // 3])
    up = client.uploads.create(bytes=len(data), filename="r.jsonl", mime_type=JSONL,
                               purpose="batch")
    pa_, pb = (client.uploads.parts.create(upload_id=up.id, data=x).id for x in (a, b))
    other = client.uploads.create(bytes=5, filename="o.jsonl", mime_type=JSONL,
                                  purpose="batch")
    po = client.uploads.parts.create(upload_id=other.id, data=b"12345").id
    before = Created(ctx)
    cases: list[tuple[dict[str, Any], str | None, str]] = [
        ({"part_ids": [pa_]}, "bytes_mismatch", "part_ids"),  # wrong total
        ({"part_ids": [pa_, pb], "md5": hashlib.md5(b + a).hexdigest()}, "md5_mismatch",
         "md5"),
        ({"part_ids": [pa_, "part_nosuchpart"]}, "unknown_part", "part_ids.1"),
        ({"part_ids": [pa_, po]}, "unknown_part", "part_ids.1"),  # another upload's
        ({"part_ids": [pa_, pb, pa_]}, None, "part_ids"),  # twice
        ({"part_ids": []}, None, "part_ids"),
        ({"part_ids": [pa_, pb], "md5": "not-a-checksum"}, None, "md5"),
        ({"part_ids": [pa_, pb], "extra_body": {"colour": "red"}}, None, "colour"),
    ]
    for kw, code, param in cases:
        extra = kw.pop("extra_body", None)
        with pytest.raises(openai.BadRequestError) as e:
            client.uploads.complete(upload_id=up.id, extra_body=extra, **kw)
        err = api_error(e.value)
        assert (err["code"], err["param"], err["type"]) == (code, param,
                                                           "invalid_request_error"), kw
        if param == "colour":
            assert "colour" in err["message"]
    assert before.unchanged()
    assert len(part_objects(ctx, up.id)) == 2
    # still pending: the right completion works after them
    done = client.uploads.complete(upload_id=up.id, part_ids=[pa_, pb],
                                   md5=hashlib.md5(data).hexdigest())
    assert done.file is not None and client.files.content(done.file.id).read() == data


def test_create_refusals(client: OpenAI, ctx: Context) -> None:
    good = {"bytes": 10, "filename": "f.jsonl", "mime_type": JSONL, "purpose": "batch"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"bytes": 0}, "bytes"), ({"bytes": -1}, "bytes"), ({"bytes": MAX_BYTES + 1}, "bytes"),
        ({"bytes": "10"}, "bytes"), ({"bytes": 1.5}, "bytes"),
        ({"purpose": "fine-tune"}, "purpose"), ({"mime_type": "image/png"}, "mime_type"),
        ({"filename": ""}, "filename"), ({"filename": "f" * 513}, "filename"),
        ({"expires_after": {"anchor": "created_at", "seconds": 3599}},
         "expires_after.seconds"),
        ({"expires_after": {"anchor": "created_at", "seconds": 2592001}},
         "expires_after.seconds"),
        ({"expires_after": {"anchor": "last_active_at", "seconds": 3600}},
         "expires_after.anchor"),
        ({"expires_after": {"anchor": "created_at", "seconds": 3600, "x": 1}},
         "expires_after.x"),
        ({"extra_body": {"colour": "red"}}, "colour"),
    ]
    with ctx.db.session() as s:
        count = s.scalar(select(func.count()).select_from(Upload))
    for change, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            client.uploads.create(**{**good, **change})  # type: ignore[arg-type]
        err = api_error(e.value)
        assert err["param"] == param, (change, err)
        assert param.split(".")[-1] in err["message"]
    with ctx.db.session() as s:
        assert s.scalar(select(func.count()).select_from(Upload)) == count
    # what is accepted: the listed types, with parameters, in any case; the largest size
    for mime in ("application/x-ndjson", "Application/JSONL; charset=utf-8",
                 "application/octet-stream"):
        ok = client.uploads.create(**{**good, "mime_type": mime, "bytes": MAX_BYTES})  # type: ignore[arg-type]
        assert ok.status == "pending"


def test_part_refusals(uploads_world: dict[str, Any], client: OpenAI, ctx: Context) -> None:
    up = client.uploads.create(bytes=PART_LIMIT * 3, filename="p.jsonl", mime_type=JSONL,
                               purpose="batch")
    small = client.uploads.create(bytes=10, filename="s.jsonl", mime_type=JSONL,
                                  purpose="batch")
    before = Created(ctx)
    with pytest.raises(openai.APIStatusError) as e:  # one byte over the limit
        client.uploads.parts.create(upload_id=up.id, data=b"x" * (PART_LIMIT + 1))
    assert e.value.status_code == 413 and api_error(e.value)["code"] == "payload_too_large"
    with pytest.raises(openai.APIStatusError) as e:  # past the form's slack too
        client.uploads.parts.create(upload_id=up.id, data=b"x" * (PART_LIMIT * 3))
    assert e.value.status_code == 413 and api_error(e.value)["code"] == "payload_too_large"
    with pytest.raises(openai.BadRequestError) as e:  # more than the whole upload
        client.uploads.parts.create(upload_id=small.id, data=b"x" * 11)
    assert api_error(e.value)["param"] == "data"
    with pytest.raises(openai.BadRequestError) as e:
        client.uploads.parts.create(upload_id=up.id, data=b"")
    assert api_error(e.value)["code"] == "empty_part"
    http = world_http(uploads_world)
    r = http.post(f"/v1/uploads/{up.id}/parts", data={"colour": "red"},
                  files={"data": ("blob", b"abc")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "colour"
    assert "colour" in r.json()["error"]["message"]
    r = http.post(f"/v1/uploads/{up.id}/parts", files={"blob": ("blob", b"abc")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "blob"
    r = http.post(f"/v1/uploads/{up.id}/parts", data={"data": "abc"})  # not a file
    assert r.status_code == 400 and r.json()["error"]["param"] == "data"
    good = (b'--XyZ\r\nContent-Disposition: form-data; name="data"; filename="b"\r\n\r\n'
            b"abc\r\n--XyZ--\r\n")
    for content, ctype in ((good[:-12], "multipart/form-data; boundary=XyZ"),  # truncated
                           (b"\x00\xff" * 100, "multipart/form-data; boundary=XyZ"),
                           (good, "multipart/form-data"),  # no boundary
                           (b'{"data": "abc"}', "application/json")):
        r = http.post(f"/v1/uploads/{up.id}/parts", content=content,
                      headers={"Content-Type": ctype})
        assert r.status_code == 400, (content[:20], r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert before.unchanged()
    assert part_objects(ctx, up.id) == []
    # exactly the limit is a part
    p = client.uploads.parts.create(upload_id=up.id, data=b"x" * PART_LIMIT)
    assert p.upload_id == up.id and len(part_objects(ctx, up.id)) == 1


def test_another_projects_upload_is_not_found(uploads_world: dict[str, Any], client: OpenAI,
                                              ctx: Context) -> None:
    up = client.uploads.create(bytes=4, filename="mine.jsonl", mime_type=JSONL,
                               purpose="batch")
    p = client.uploads.parts.create(upload_id=up.id, data=b"{}\n\n")
    them = world_sdk(uploads_world, uploads_world["other"])
    before = Created(ctx)
    for call in (lambda: them.uploads.parts.create(upload_id=up.id, data=b"x"),
                 lambda: them.uploads.complete(upload_id=up.id, part_ids=[p.id]),
                 lambda: them.uploads.cancel(up.id),
                 lambda: them.uploads.cancel("upload_nosuchupload"),
                 lambda: them.uploads.cancel("no such id!")):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        err = api_error(e.value)
        assert err["message"].startswith("No such Upload object: ")
        assert err["param"] == "upload_id"
    assert before.unchanged()
    # and theirs is untouched: still pending, its part still there
    assert client.uploads.complete(upload_id=up.id, part_ids=[p.id]).status == "completed"


def test_a_part_sent_again_with_its_idempotency_key_is_stored_once(
        uploads_world: dict[str, Any], client: OpenAI, ctx: Context) -> None:
    up = client.uploads.create(bytes=6, filename="i.jsonl", mime_type=JSONL, purpose="batch")
    http = world_http(uploads_world)
    sent = [http.post(f"/v1/uploads/{up.id}/parts", files={"data": ("blob", b"abcdef")},
                      headers={"Idempotency-Key": "part-1"}) for _ in range(2)]
    assert [r.status_code for r in sent] == [200, 200]
    assert sent[1].headers.get("Idempotent-Replayed") == "true"
    assert sent[0].json()["id"] == sent[1].json()["id"]
    assert len(part_objects(ctx, up.id)) == 1
    done = client.uploads.complete(upload_id=up.id, part_ids=[sent[0].json()["id"]])
    assert done.file is not None and client.files.content(done.file.id).read() == b"abcdef"


def test_unauthenticated_requests_are_refused(uploads_world: dict[str, Any]) -> None:
    app = uploads_world["app"]
    http = httpx2.Client(transport=httpx2.WSGITransport(app=app), base_url=WORLD_URL)
    r = http.post("/v1/uploads", json={"bytes": 1, "filename": "a", "mime_type": JSONL,
                                       "purpose": "batch"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_large_parts_go_in_place_and_complete_without_a_copy(
        client: OpenAI, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    """On S3, parts of at least 5 MiB are parts of the upload's own multipart upload:
    named in the order they came, completing ends it and that object is the File's (no
    copy); named in another order, or with an md5 to check, the File is composed of
    their ranges. A small last part (an object of its own) is copied in server-side."""
    mib = 1024 * 1024
    monkeypatch.setattr(ctx.settings, "max_upload_part_bytes", 6 * mib)
    monkeypatch.setattr(ctx.settings, "max_upload_bytes", 16 * mib)
    data = dataset(76_000)
    assert len(data) > 10 * mib + 1000
    chunks = split(data, [5 * mib, 5 * mib])  # two parts in place, a small last one

    up = client.uploads.create(bytes=len(data), filename="big.jsonl", mime_type=JSONL,
                               purpose="batch")
    ids = [client.uploads.parts.create(upload_id=up.id, data=c).id for c in chunks]
    with ctx.db.session() as s:
        numbers = [s.get(UploadPart, i).number for i in ids]  # type: ignore[union-attr]
    assert numbers == [1, 2, None]
    assert len(part_objects(ctx, up.id)) == 3  # two in place, one object
    done = client.uploads.complete(upload_id=up.id, part_ids=ids)
    assert done.status == "completed" and done.file is not None
    with ctx.db.session() as s:
        row = s.get(File, done.file.id)
        assert row is not None and row.object_key == keys.upload_target(up.id)  # no copy
    assert client.files.content(done.file.id).read() == data
    assert part_objects(ctx, up.id) == []

    # Sent in another order than the file's, and checked against an md5 (a wrong one
    # first: refused, the upload still pending, then completed with the right one).
    up = client.uploads.create(bytes=len(data), filename="big.jsonl", mime_type=JSONL,
                               purpose="batch")
    sent = {i: client.uploads.parts.create(upload_id=up.id, data=chunks[i]).id
            for i in (1, 0, 2)}
    part_ids = [sent[i] for i in range(3)]
    with pytest.raises(openai.BadRequestError) as e:
        client.uploads.complete(upload_id=up.id, part_ids=part_ids, md5="0" * 32)
    assert e.value.body["code"] == "md5_mismatch"  # type: ignore[index]
    done = client.uploads.complete(upload_id=up.id, part_ids=part_ids,
                                   md5=hashlib.md5(data).hexdigest())
    assert done.status == "completed" and done.file is not None
    with ctx.db.session() as s:
        row = s.get(File, done.file.id)
        assert row is not None and row.object_key == keys.file_object(done.file.id)
    assert client.files.content(done.file.id).read() == data
    assert part_objects(ctx, up.id) == [] and not ctx.store.exists(keys.upload_target(up.id))

    # Cancelled with parts in place: nothing is left.
    up = client.uploads.create(bytes=len(data), filename="big.jsonl", mime_type=JSONL,
                               purpose="batch")
    client.uploads.parts.create(upload_id=up.id, data=chunks[0])
    assert len(part_objects(ctx, up.id)) == 1
    client.uploads.cancel(upload_id=up.id)
    assert part_objects(ctx, up.id) == [] and not ctx.store.exists(keys.upload_target(up.id))
