"""An upload's objects in the store: its parts put together as its File's, and removed.

On S3 an upload's large parts go in place, as the parts of one multipart upload of
its own object (``keys.upload_target``); ``assemble`` ends that upload and makes the
File's object of it (copying ranges only when the parts are not named in the order
they came, or an md5 is to be checked). ``abort`` removes everything an upload that
will not complete wrote; ``delete_parts`` what a completed one leaves over.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.core.context import Context
from jobs.core.errors import InvalidRequest
from jobs.core.upload_tables import Upload, UploadPart
from storage import keys
from storage.objects import MAX_PARTS, Digest, ObjectStore, PartsGone, PartsInPlace

log = logging.getLogger("inferq.uploads")


def assemble(ctx: Context, s: Session, up: Upload, parts: list[UploadPart], file_id: str,
             digest: Digest | None) -> tuple[str, int]:
    """The File's object of an upload whose large parts went in place, and its size.

    Named in the order they came (the large ones by ascending number, a small one, an
    object of its own, only last: a client that sends its parts one after another),
    without an md5 to check: the multipart upload is ended with them (the small last
    one copied in server-side first), and its object is the File's; nothing else is
    copied. Otherwise it is ended with every large part, by number, and the File is
    composed of the ranges of that object and the small parts' objects, in the order
    named. An upload ended before (a completion that failed its checks, or was cut
    short) is read as it was ended, if it holds what is asked."""
    store = ctx.store
    assert isinstance(store, PartsInPlace) and up.store_upload_id is not None
    target = keys.upload_target(up.id)
    total = sum(p.bytes for p in parts)
    if digest is None and _as_they_came(parts):
        chosen = [(p.number or 0, p.etag or "") for p in parts if p.number is not None]
        try:
            if parts[-1].number is None:  # a small last part: copied in, server-side
                n = _take_number(s, up)
                chosen.append((n, store.copy_part(target, up.store_upload_id, n,
                                                  parts[-1].object_key)))
            store.end_parts(target, up.store_upload_id, chosen)
        except PartsGone:
            _check_ended(store, up, target, total)
        return target, store.size(target)
    every = sorted((p for p in s.scalars(select(UploadPart).where(
        UploadPart.upload_id == up.id)) if p.number is not None), key=lambda p: p.number or 0)
    offsets, at = {}, 0
    for p in every:
        offsets[p.id] = at
        at += p.bytes
    if every:
        try:
            store.end_parts(target, up.store_upload_id,
                            [(p.number or 0, p.etag or "") for p in every])
        except PartsGone:
            _check_ended(store, up, target, at)
    key = keys.file_object(file_id)
    pieces = [(target, offsets[p.id], p.bytes) if p.number is not None
              else (p.object_key, 0, p.bytes) for p in parts]
    return key, store.compose_ranges(key, pieces, digest)


def _as_they_came(parts: list[UploadPart]) -> bool:
    """Parts in place by ascending number, and at most one other (a small one) last."""
    numbers = [p.number for p in parts[:-1]]
    last = parts[-1].number
    if last is not None:
        numbers.append(last)
    known = [n for n in numbers if n is not None]
    return len(known) == len(numbers) and all(a < b for a, b in zip(known, known[1:],
                                                                     strict=False))


def _take_number(s: Session, up: Upload) -> int:
    """The next part number, under the upload's row lock ``s`` holds."""
    up.parts_started += 1
    s.flush()
    if up.parts_started > MAX_PARTS:
        raise InvalidRequest(f"an upload has at most {MAX_PARTS} parts", param="part_ids",
                             code="too_many_parts")
    return up.parts_started


def _check_ended(store: ObjectStore, up: Upload, target: str, size: int) -> None:
    """An upload whose parts were ended before: its object must be what is asked for."""
    if not store.exists(target) or store.size(target) != size:
        raise InvalidRequest(f"the upload {up.id} was put together by an earlier completion "
                             "with other parts: complete it with the same part_ids, or upload "
                             "the file again", param="part_ids", code="upload_assembled")


def abort(ctx: Context, up: Upload) -> None:
    """Everything an upload that will not complete wrote: its parts, in place or not,
    and the target a failed completion put them together in."""
    if up.store_upload_id is not None and isinstance(ctx.store, PartsInPlace):
        ctx.store.abort_parts(keys.upload_target(up.id), up.store_upload_id)
        ctx.store.delete(keys.upload_target(up.id))
    ctx.store.delete_prefix(keys.upload_prefix(up.id))


def delete_parts(ctx: Context, up: Upload, file_key: str) -> None:
    """After completion: the parts' objects, the parts in place no completion took, and
    the object the File's ranges were copied from (one that is the File's, whose object
    is ``file_key``, stays)."""
    try:
        if up.store_upload_id is not None and isinstance(ctx.store, PartsInPlace):
            target = keys.upload_target(up.id)
            if file_key != target:
                ctx.store.abort_parts(target, up.store_upload_id)
                ctx.store.delete(target)
        ctx.store.delete_prefix(keys.upload_prefix(up.id))
    except Exception:  # noqa: BLE001 - the File is made; its parts are only left over
        log.exception("upload %s: could not delete its parts", up.id)
