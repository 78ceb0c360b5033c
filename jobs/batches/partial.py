"""Partial results: the output lines of a batch's committed chunks while it runs.

A chunk's parts never change once its checkpoint committed them (finalize reads the
same parts, under the attempt that committed each), so "what a client has read" is,
per shard, how many of its chunks: the cursor. A download returns the lines of the
chunks committed since the cursor, in shard and chunk order, and the cursor of the
snapshot it read; a client that always passes the last cursor back reads every
committed request once, and once the batch is terminal the union of its downloads is
the batch's output file, line for line (partial lines are JSONL, whatever the input's
format).

The cursor is opaque to clients: the per-shard chunk counts, zlib-compressed and
base64url-encoded (a batch's shards run roughly in order, so long runs of done and
untouched shards compress to a few bytes, which keeps the cursor short enough for a
query string even for thousands of shards).
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from jobs.batches import queries as repo
from jobs.batches.finalize import committed_parts
from jobs.core.context import Context
from jobs.core.errors import Conflict, InvalidRequest, NotFound
from jobs.core.schema import Batch
from jobs.core.status import TERMINAL
from storage.objects import CHUNK, ObjectNotFound

PREFIX = "pc1."
MAX_CURSOR_CHARS = 3000  # well inside a request line (gunicorn's limit is 4094 bytes)
KINDS = {"output": "ok", "errors": "err"}


class PartMissing(RuntimeError):
    """A committed part is gone from the object store (the download is cut short)."""


@dataclass(frozen=True)
class PartialOutput:
    batch: Batch
    next_cursor: str  # pass it as ``after`` to get what commits next
    chunks: int  # committed chunks whose lines this download holds
    complete: bool  # the batch is terminal: nothing more will ever commit
    blocks: Iterator[bytes]  # the lines, read from the object store as they are sent


def encode_cursor(batch_id: str, counts: list[int]) -> str:
    raw = f"{batch_id}|{','.join(map(str, counts))}".encode()
    return PREFIX + base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")


def decode_cursor(cursor: str, batch_id: str, shards: int) -> list[int]:
    """Per-shard chunk counts of a cursor of batch ``batch_id``, which has ``shards``
    shards; a cursor taken before the batch was sharded has none (all start at 0)."""
    bad = InvalidRequest("after: not a cursor of this batch's partial output (pass the "
                         "inferq-next-cursor of the previous download, or none to start)",
                         param="after", code="invalid_cursor")
    if not cursor.startswith(PREFIX) or len(cursor) > MAX_CURSOR_CHARS:
        raise bad
    body = cursor[len(PREFIX):]
    try:
        packed = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        d = zlib.decompressobj()  # bounded: a small cursor cannot inflate to gigabytes
        raw = d.decompress(packed, len(batch_id) + 12 * shards + 16)  # 11 digits + ","
        if d.unconsumed_tail or not d.eof:
            raise bad
        owner, _, listed = raw.decode("ascii").partition("|")
        counts = [int(x) for x in listed.split(",")] if listed else []
    except (binascii.Error, zlib.error, UnicodeDecodeError, ValueError):
        raise bad from None
    if owner != batch_id or len(counts) > shards or any(c < 0 for c in counts):
        raise bad
    return counts


def partial_output(ctx: Context, tenant_id: str, batch_id: str, partial: str | None,
                   after: str | None, kind: str | None) -> PartialOutput:
    """The lines of ``kind`` ("output", the default: the output file's; "errors": the
    failed requests of committed chunks) committed since the cursor ``after`` (None:
    since the start). ``partial`` must be "true": the route serves partial downloads
    only (the final files are the batch's output_file_id and error_file_id)."""
    with ctx.db.session() as s:
        b = repo.get_batch(s, tenant_id, batch_id)
        if b is None:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
        complete = b.status in TERMINAL
        gone = repo.results_gone(s, b) if complete else None
        shards = repo.shards_of(s, batch_id)  # one snapshot: counts and attempts together
    if gone is not None:
        raise Conflict(f"the results of batch {batch_id} are gone (its file {gone} expired "
                       "or was deleted)", code="results_expired")
    if (partial or "").lower() != "true":
        raise InvalidRequest("partial: must be true: this route serves the lines committed "
                             "so far; the final output is the file named by the batch's "
                             "output_file_id", param="partial", code="invalid_value")
    kind = kind or "output"
    if kind not in KINDS:
        raise InvalidRequest(f"kind: must be one of {', '.join(KINDS)}", param="kind",
                             code="invalid_value")
    since = decode_cursor(after, batch_id, len(shards)) if after else []
    for sh, seen in zip(shards, since, strict=False):
        if seen > sh.chunks_done:
            raise InvalidRequest("after: the cursor is ahead of this batch's committed "
                                 "chunks: it is not one of this batch", param="after",
                                 code="invalid_cursor")
    parts = list(committed_parts(b, shards, KINDS[kind], since))
    return PartialOutput(batch=b, chunks=len(parts), complete=complete,
                         next_cursor=encode_cursor(batch_id, [sh.chunks_done for sh in shards]),
                         blocks=_read(ctx, [key for _sh, _chunk, key in parts]))


def _read(ctx: Context, part_keys: list[str]) -> Iterator[bytes]:
    for key in part_keys:
        try:
            yield from ctx.store.iter_chunks(key, CHUNK)
        except ObjectNotFound:
            raise PartMissing(f"a committed part is missing from the object store: {key}"
                              ) from None
