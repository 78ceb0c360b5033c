"""Finalize: assemble a batch's committed output parts into its output and error files.

Only parts a checkpoint committed are read (orphans of interrupted chunks are
ignored), so the files hold each request exactly once. Requests a stopped
shard never reached get an error line (``batch_cancelled`` or the shard's
failure). Safe to run twice: it locks the batch row and no-ops once terminal.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy.orm import Session

from jobs import repository as repo
from jobs.context import Context
from jobs.models import Batch, File, Shard, new_id, now
from jobs.status import TERMINAL, BatchStatus, ShardStatus
from storage import keys
from storage.objects import CHUNK, ConcatReader, ObjectNotFound, ObjectStore
from storage.parquet import jsonl_to_parquet, read_rows


def finalize_batch(ctx: Context, batch_id: str) -> None:
    with ctx.db.session() as s:
        b = repo.get_batch(s, None, batch_id, lock=True)
        if b is None or b.status in TERMINAL:
            return
        if repo.unfinished_shards(s, batch_id):
            return  # the last shard to finish sends finalize again
        expired = b.expired_at is not None
        cancelling = b.status == BatchStatus.CANCELLING and not expired
        if not cancelling:
            b.status, b.finalizing_at = BatchStatus.FINALIZING, b.finalizing_at or now()
        shards = repo.shards_of(s, batch_id)
        reason = "batch_expired" if expired else "batch_cancelled"
        f = s.get(File, b.input_file_id)
        fmt = f.format if f is not None else "jsonl"
        write = _write_parquet if fmt == "parquet" else _write
        out = write(ctx.store, keys.batch_output(batch_id, "output", fmt),
                    _parts(ctx.store, b, shards, "ok"))
        lost: list[dict[str, Any]] = []
        err = write(ctx.store, keys.batch_output(batch_id, "errors", fmt),
                    _error_blocks(ctx.store, b, shards, reason, lost))
        b.output_file_id = _output_file(s, b, "output", fmt, out)
        b.error_file_id = _output_file(s, b, "errors", fmt, err)
        b.prompt_tokens = sum(sh.prompt_tokens for sh in shards)
        if lost:  # requests we cannot account for: the batch must not claim success
            b.status, b.failed_at, b.errors = BatchStatus.FAILED, now(), lost
        elif expired:
            b.status = BatchStatus.EXPIRED
        elif cancelling:
            b.status, b.cancelled_at = BatchStatus.CANCELLED, now()
        else:
            b.status, b.completed_at = BatchStatus.COMPLETED, now()


def _write(store: ObjectStore, key: str, blocks: Iterator[bytes]) -> tuple[str, int, int]:
    size = store.put_stream(key, ConcatReader(blocks))  # type: ignore[arg-type]
    return key, size, size


def _write_parquet(store: ObjectStore, key: str, blocks: Iterator[bytes]
                   ) -> tuple[str, int, int]:
    """Outputs of a Parquet dataset are Parquet too (one row per request)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.parquet"
        rows = jsonl_to_parquet(blocks, path)
        with path.open("rb") as fh:
            size = store.put_stream(key, fh)
    return key, size, rows


def _output_file(s: Session, b: Batch, kind: str, fmt: str, written: tuple[str, int, int]
                 ) -> str | None:
    key, size, rows = written
    if rows == 0:
        return None
    f = File(id=new_id("file-"), tenant_id=b.tenant_id, filename=f"{b.id}_{kind}.{fmt}",
             purpose="batch_output", format=fmt, bytes=size, object_key=key,
             created_at=now())
    s.add(f)
    return f.id


def _parts(store: ObjectStore, b: Batch, shards: list[Shard], kind: str) -> Iterator[bytes]:
    for sh in shards:
        for chunk in range(sh.chunks_done):
            try:
                yield from store.iter_chunks(keys.output_part(b.id, sh.index, chunk, kind), CHUNK)
            except ObjectNotFound:
                continue


def _error_blocks(store: ObjectStore, b: Batch, shards: list[Shard], reason: str,
                  lost: list[dict[str, Any]]) -> Iterator[bytes]:
    """Error lines: validation errors, failed requests, then requests that never ran
    (their custom_ids read back from the shard; if that fails, ``lost`` says so)."""
    try:
        yield from store.iter_chunks(keys.validation_errors(b.id))
    except ObjectNotFound:
        pass
    yield from _parts(store, b, shards, "err")
    for sh in shards:
        if sh.status == ShardStatus.DONE or sh.rows_done >= sh.rows:
            continue
        stopped = "expired" if reason == "batch_expired" else "was cancelled"
        code, message = ((reason, f"the batch {stopped} before this request ran")
                         if sh.status == ShardStatus.CANCELLED else
                         ("shard_failed", sh.error or "the request could not be processed"))
        sh.failed += sh.rows - sh.rows_done  # these requests get error lines
        try:
            with store.open(sh.object_key) as f:
                rows = read_rows(io.BytesIO(f.read()), start=sh.rows_done)
        except Exception as e:  # noqa: BLE001 - reported on the batch instead
            lost.append({"code": "shard_unreadable", "line": None, "param": None,
                         "message": f"{sh.rows - sh.rows_done} requests of shard {sh.index} "
                                    f"could not be read back to report them: {e}"})
            continue
        yield b"".join(_unrun_line(r["custom_id"], code, message) for r in rows)


def _unrun_line(custom_id: str, code: str, message: str) -> bytes:
    return orjson.dumps({"id": new_id("batch_req_"), "custom_id": custom_id, "response": None,
                         "error": {"code": code, "message": message}}) + b"\n"
