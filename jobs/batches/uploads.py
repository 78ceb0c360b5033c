"""Uploads (``/v1/uploads``): a file sent in parts, as OpenAI's Uploads API.

An upload declares its size, name, purpose and MIME type and is ``pending`` for an
hour. Each part (at most ``max_upload_part_bytes``) is streamed into the object store
as an object of its own; parts may arrive concurrently and in any order. Completing
names the parts in the file's order: their sizes must add up to the declared size;
the store composes them into the File's object (``ObjectStore.compose``: server-side
on S3 where it can), an ``md5``, if given, is checked against the composed bytes, and
the File is recorded in the same transaction that marks the upload ``completed``.
On S3 the parts go in place: each is a part, numbered as it comes, of one multipart
upload of the upload's own object, and completing ends that upload; when the parts
are named in the order they came (a client that sends them one after another) that
object is the File's, and nothing is copied (else their ranges are copied in the
order named: jobs/batches/upload_objects.py).
Nothing is created when a check fails. The parts' objects are deleted once the upload
is completed, cancelled or expired (the janitor's ``expire``).

Completing holds the upload's row locked from its checks to its commit: a second
complete of the same upload waits and then answers the completed upload (the same
``part_ids``; other ``part_ids`` are a 400), a part or a cancel that arrives meanwhile
waits and is then refused, and a complete cut short (a process killed) leaves the
upload pending, as it was.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
from typing import IO, Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from jobs.batches.service import UPLOAD_PURPOSES
from jobs.batches.upload_objects import abort, assemble, delete_parts
from jobs.core.context import Context
from jobs.core.errors import InvalidRequest, NotFound, PayloadTooLarge, shown
from jobs.core.schema import File, new_id, now
from jobs.core.status import UploadStatus
from jobs.core.upload_tables import Upload, UploadPart
from jobs.protocol.batch import ExpiresAfter
from jobs.protocol.validation import one_of
from storage import keys
from storage.objects import MAX_PARTS, MIN_PART, PartsGone, PartsInPlace
from storage.parquet import is_parquet

log = logging.getLogger("inferq.uploads")

EXPIRES_S = 3600  # an upload is pending this long after it is created
# What a batch input may be declared as: JSONL (under any of its names) or Parquet. The
# format is still told from the content (Parquet's magic bytes, else JSONL), as for
# POST /v1/files; the type only has to be one a batch input can have.
MIME_TYPES = ("application/jsonl", "application/x-jsonlines", "application/x-ndjson",
              "application/json", "text/jsonl", "application/vnd.apache.parquet",
              "application/x-parquet", "application/octet-stream")
_MD5 = re.compile(r"[0-9a-fA-F]{32}")
STRICT = ConfigDict(strict=True, extra="forbid")
PartId = Annotated[str, Field(max_length=64)]


class UploadCreate(BaseModel):
    """The body of ``POST /v1/uploads``."""

    model_config = STRICT

    bytes: int = Field(gt=0, lt=2**63)
    filename: str = Field(min_length=1, max_length=512)
    mime_type: str = Field(min_length=1, max_length=128, description=(
        "one of " + ", ".join(MIME_TYPES) + " (parameters such as '; charset=utf-8' "
        "are ignored)"))
    purpose: Annotated[str, one_of("purpose", UPLOAD_PURPOSES)] = Field(
        max_length=64, json_schema_extra={"enum": list(UPLOAD_PURPOSES)})
    expires_after: ExpiresAfter | None = None

    @field_validator("mime_type")
    @classmethod
    def _mime_type(cls, v: str) -> str:
        if v.split(";", 1)[0].strip().lower() not in MIME_TYPES:
            raise ValueError(f"mime_type {shown(v)} is not one a batch input can have: "
                             f"use one of {', '.join(MIME_TYPES)}")
        return v


class UploadComplete(BaseModel):
    """The body of ``POST /v1/uploads/{upload_id}/complete``."""

    model_config = STRICT

    part_ids: list[PartId] = Field(min_length=1, max_length=MAX_PARTS)
    md5: str | None = Field(default=None, description="32 hexadecimal digits")

    @field_validator("part_ids")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        seen: set[str] = set()
        for p in v:
            if p in seen:
                raise ValueError(f"part_ids names the part {shown(p)} twice")
            seen.add(p)
        return v

    @field_validator("md5")
    @classmethod
    def _md5(cls, v: str | None) -> str | None:
        if v is not None and not _MD5.fullmatch(v):
            raise ValueError("md5 must be 32 hexadecimal digits (the checksum's hex form)")
        return v.lower() if v is not None else None


def status_of(up: Upload, at: int | None = None) -> UploadStatus:
    """Its status as answered: a pending upload past ``expires_at`` is expired."""
    if up.status == UploadStatus.PENDING and (now() if at is None else at) >= up.expires_at:
        return UploadStatus.EXPIRED
    return UploadStatus(up.status)


def _get(s: Session, tenant_id: str, upload_id: str, lock: bool = False,
         share: bool = False) -> Upload:
    q = select(Upload).where(Upload.id == upload_id, Upload.tenant_id == tenant_id)
    if lock or share:
        q = q.with_for_update(read=share and not lock)
    up = s.scalar(q)
    if up is None:
        raise NotFound(f"No such Upload object: {upload_id}", param="upload_id")
    return up


def _require_pending(up: Upload, doing: str) -> None:
    status = status_of(up)
    if status == UploadStatus.PENDING:
        return
    why = {UploadStatus.COMPLETED: "it is already completed",
           UploadStatus.CANCELLED: "it was cancelled",
           UploadStatus.EXPIRED: f"it expired at {up.expires_at}: create another"}[status]
    raise InvalidRequest(f"Cannot {doing} the upload {up.id}: {why}", param="upload_id",
                         code=f"upload_{status.value}")


def create(ctx: Context, tenant_id: str, req: UploadCreate) -> Upload:
    limit = ctx.settings.max_upload_bytes
    if req.bytes > limit:
        raise InvalidRequest(f"bytes: an upload is at most {limit} bytes, got {req.bytes}",
                             param="bytes")
    t = now()
    up = Upload(id=new_id("upload_"), tenant_id=tenant_id, filename=req.filename,
                purpose=req.purpose, mime_type=req.mime_type, bytes=req.bytes,
                status=UploadStatus.PENDING, created_at=t, expires_at=t + EXPIRES_S,
                file_expires_after=req.expires_after.seconds if req.expires_after else None)
    if isinstance(ctx.store, PartsInPlace):
        up.store_upload_id = ctx.store.begin_parts(keys.upload_target(up.id))
    try:
        with ctx.db.session() as s:
            s.add(up)
    except BaseException:
        if up.store_upload_id is not None:
            abort(ctx, up)
        raise
    return up


def check_exists(ctx: Context, tenant_id: str, upload_id: str) -> None:
    """404 unless the project has the upload (before its request's body is looked at)."""
    with ctx.db.session() as s:
        _get(s, tenant_id, upload_id)


def check_pending(ctx: Context, tenant_id: str, upload_id: str) -> None:
    """404 or 400 before a part's body is read: the upload must take parts."""
    with ctx.db.session() as s:
        _require_pending(_get(s, tenant_id, upload_id), "add a part to")


def add_part(ctx: Context, tenant_id: str, upload_id: str, data: IO[bytes]) -> UploadPart:
    """Stream ``data`` (a seekable stream: a spooled request body) into the store as a
    part. A part larger than the upload's whole size is refused early; the sizes are
    added up at completion, over the parts it names (a part sent again by a client
    that did not get the first answer is one it leaves out)."""
    size = data.seek(0, io.SEEK_END)
    data.seek(0)
    limit = ctx.settings.max_upload_part_bytes
    if size > limit:
        raise PayloadTooLarge(f"a part is at most {limit} bytes, got {size}", param="data")
    if size == 0:
        raise InvalidRequest("the part is empty", param="data", code="empty_part")
    with ctx.db.session() as s:
        up = _get(s, tenant_id, upload_id)
        _require_pending(up, "add a part to")
        if size > up.bytes:
            raise InvalidRequest(f"the part's {size} bytes are more than the upload's "
                                 f"{up.bytes}", param="data")
        in_place = up.store_upload_id
    head = data.read(4)
    data.seek(0)
    part_id = new_id("part_")
    number = etag = None
    # A part of S3's minimum part size goes in place; a smaller one (the last of a file,
    # say) is an object of its own until completion.
    if in_place is not None and isinstance(ctx.store, PartsInPlace) and size >= MIN_PART:
        key, number = keys.upload_target(upload_id), _next_number(ctx, upload_id)
        try:
            etag = ctx.store.put_part(key, in_place, number, data)
        except PartsGone:
            raise InvalidRequest(f"the upload {upload_id} takes no more parts: a completion "
                                 "that failed its checks put them together already; complete "
                                 "it with the parts it has", param="data",
                                 code="upload_assembled") from None
        stored = size
    else:
        key = keys.upload_part(upload_id, part_id)
        stored = ctx.store.put_stream(key, data)
    try:
        # FOR SHARE: parts go in side by side; a complete or a cancel (FOR UPDATE)
        # waits for them, and they for it
        with ctx.db.session() as s:
            up = _get(s, tenant_id, upload_id, share=True)
            _require_pending(up, "add a part to")
            part = UploadPart(id=part_id, upload_id=upload_id, bytes=stored, head=head,
                              object_key=key, created_at=now(), number=number, etag=etag)
            s.add(part)
    except BaseException:
        if number is None:
            ctx.store.delete(key)  # a part in place goes with its upload
        raise
    return part


def _next_number(ctx: Context, upload_id: str) -> int:
    """The next part number of an upload in place (S3 takes 1 to 10,000)."""
    with ctx.db.session() as s:
        n = s.execute(update(Upload).where(Upload.id == upload_id,
                                           Upload.status == UploadStatus.PENDING)
                      .values(parts_started=Upload.parts_started + 1)
                      .returning(Upload.parts_started)).scalar_one_or_none()
        if n is None:  # completed or cancelled meanwhile
            up = s.get(Upload, upload_id)
            assert up is not None
            _require_pending(up, "add a part to")
    if n is None or n > MAX_PARTS:
        raise InvalidRequest(f"an upload has at most {MAX_PARTS} parts", param="data",
                             code="too_many_parts")
    return int(n)


def complete(ctx: Context, tenant_id: str, upload_id: str,
             req: UploadComplete) -> tuple[Upload, File]:
    """The upload completed and its File (see the module's docstring)."""
    composed: str | None = None
    try:
        with ctx.db.session() as s:
            up = _get(s, tenant_id, upload_id, lock=True)
            if up.status == UploadStatus.COMPLETED:
                return up, _completed_again(s, up, req)
            _require_pending(up, "complete")
            parts = _named_parts(s, up, req.part_ids)
            total = sum(p.bytes for p in parts)
            if total != up.bytes:
                raise InvalidRequest(f"the parts hold {total} bytes; the upload was created "
                                     f"with bytes={up.bytes}", param="part_ids",
                                     code="bytes_mismatch")
            file_id = new_id("file-")
            digest = hashlib.md5() if req.md5 is not None else None
            if up.store_upload_id is not None:
                key, size = assemble(ctx, s, up, parts, file_id, digest)
                composed = key if key != keys.upload_target(up.id) else None
            else:
                composed = key = keys.file_object(file_id)
                size = ctx.store.compose(key, [p.object_key for p in parts], digest)
            if size != total:
                raise RuntimeError(f"upload {up.id}: composed {size} bytes of {total}")
            if digest is not None and digest.hexdigest() != req.md5:
                raise InvalidRequest(f"md5 {req.md5} does not match the parts' bytes "
                                     f"(their md5 is {digest.hexdigest()})", param="md5",
                                     code="md5_mismatch")
            head = b"".join(p.head for p in parts)[:4]  # the file's first bytes
            t = now()
            f = File(id=file_id, tenant_id=tenant_id, filename=up.filename,
                     purpose=up.purpose, format="parquet" if is_parquet(head) else "jsonl",
                     bytes=size, object_key=key, created_at=t,
                     expires_at=None if up.file_expires_after is None
                     else t + up.file_expires_after)
            s.add(f)
            s.flush()  # the upload refers to it
            up.status, up.file_id, up.completed_at = UploadStatus.COMPLETED, f.id, t
            up.part_ids, up.md5 = list(req.part_ids), req.md5
        composed = None  # committed: the File's now
    finally:
        if composed is not None:  # refused, or cut short: no object without its File
            try:
                ctx.store.delete(composed)
            except Exception:  # noqa: BLE001 - the error that got here is the answer
                log.exception("upload %s: could not delete %s", upload_id, composed)
    delete_parts(ctx, up, key)
    return up, f


def _completed_again(s: Session, up: Upload, req: UploadComplete) -> File:
    """A complete repeated (its answer lost, say): the same answer, if it asks the same."""
    if list(req.part_ids) != up.part_ids:
        raise InvalidRequest(f"The upload {up.id} is already completed, with other part_ids",
                             param="part_ids", code="upload_completed")
    if req.md5 is not None and req.md5 != up.md5:
        raise InvalidRequest(f"The upload {up.id} is already completed, with "
                             f"{'no md5' if up.md5 is None else 'another md5'}",
                             param="md5", code="upload_completed")
    f = s.get(File, up.file_id)
    assert f is not None
    return f


def _named_parts(s: Session, up: Upload, part_ids: list[str]) -> list[UploadPart]:
    found = {p.id: p for p in s.scalars(select(UploadPart).where(
        UploadPart.upload_id == up.id, UploadPart.id.in_(part_ids)))}
    for i, pid in enumerate(part_ids):
        if pid not in found:
            raise InvalidRequest(f"part_ids.{i}: the upload {up.id} has no part {shown(pid)}",
                                 param=f"part_ids.{i}", code="unknown_part")
    return [found[pid] for pid in part_ids]


def cancel(ctx: Context, tenant_id: str, upload_id: str) -> Upload:
    """Cancelled, its parts deleted (a cancelled upload is answered as it is)."""
    with ctx.db.session() as s:
        up = _get(s, tenant_id, upload_id, lock=True)
        if up.status == UploadStatus.CANCELLED:
            return up
        _require_pending(up, "cancel")
        # under the lock: a failed delete leaves the upload pending, to be cancelled again
        abort(ctx, up)
        up.status, up.cancelled_at = UploadStatus.CANCELLED, now()
    return up


def expire(ctx: Context, at: int | None = None, limit: int = 100) -> list[str]:
    """The janitor's: pending uploads past ``expires_at`` marked expired and their parts
    deleted (those a complete holds are skipped: it either completes them or leaves
    them pending for the next sweep). Their ids."""
    t = now() if at is None else at
    with ctx.db.session() as s:
        ups = list(s.scalars(select(Upload).where(
            Upload.status == UploadStatus.PENDING, Upload.expires_at <= t)
            .order_by(Upload.expires_at).limit(limit).with_for_update(skip_locked=True)))
        for up in ups:  # a failed delete rolls back: the next sweep tries again
            abort(ctx, up)
            up.status = UploadStatus.EXPIRED
        return [up.id for up in ups]
