"""Finalize: assemble a batch's committed output parts into its output and error files.

Only parts a checkpoint committed are read, under the key of the attempt that
committed them (orphans of interrupted chunks and parts a fenced-off worker wrote
late are ignored), so the files hold each request exactly once; a committed part
that is missing fails the batch, naming it. Requests a stopped
shard never reached get an error line (``batch_cancelled`` or the shard's
failure). Safe to run twice: it locks the batch row and no-ops once terminal.

A finalize that fails for a reason that will not go away by trying again (its
results cannot be assembled) ends the batch ``failed`` with the reason in
``errors``; only a backend that is briefly unreachable (database, broker, object
store) is left to be retried.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from jobs.batches import done_rows, exports, lifecycle, outputs
from jobs.batches import queries as repo
from jobs.batches.datasets import Manifest
from jobs.core.context import Context
from jobs.core.errors import shown, transient
from jobs.core.schema import Batch, File, Shard, new_id, now
from jobs.core.status import TERMINAL, BatchStatus, ShardStatus
from storage import keys
from storage.objects import CHUNK, ConcatReader, ObjectNotFound, ObjectStore
from storage.parquet import write_rows

log = logging.getLogger("inferq.finalize")


def finalize_batch(ctx: Context, batch_id: str) -> None:
    """Assemble the batch's results; a deterministic failure fails the batch, once."""
    try:
        _finalize(ctx, batch_id)
    except Exception as e:
        if transient(e):
            raise  # the task retries, and the janitor sends it again if that runs out
        log.exception("batch %s: finalize failed", batch_id)
        _fail(ctx, batch_id, e)


def _fail(ctx: Context, batch_id: str, e: Exception) -> None:
    with ctx.db.session() as s:
        b = repo.get_batch(s, None, batch_id, lock=True)
        if b is None or b.status in TERMINAL:
            return
        lifecycle.move(ctx, s, b, BatchStatus.FAILED, errors=[*(b.errors or []), {
            "code": "finalize_failed", "line": None, "param": None,
            "message": f"the batch's results could not be assembled into its output files "
                       f"({type(e).__name__}: {shown(str(e), 300)})"}])


def _finalize(ctx: Context, batch_id: str) -> None:
    with ctx.db.session() as s:
        b = repo.get_batch(s, None, batch_id, lock=True)
        if b is None or b.status in TERMINAL:
            return
        if repo.unfinished_shards(s, batch_id):
            return  # the last shard to finish sends finalize again
        expired = b.expired_at is not None
        cancelling = b.status == BatchStatus.CANCELLING and not expired
        if not cancelling:
            lifecycle.move(ctx, s, b, BatchStatus.FINALIZING)
        shards = repo.shards_of(s, batch_id)
        reason = "batch_expired" if expired else "batch_cancelled"
        f = s.get(File, b.input_file_id)
        # A Parquet input's (and a dataset's) results are Parquet; the rest JSONL.
        fmt = "parquet" if f is not None and f.format in ("parquet", "dataset") else "jsonl"

        def write(kind: str, blocks: Iterator[bytes]) -> tuple[str, int, int]:
            key = keys.batch_output(batch_id, kind, fmt)
            if fmt == "parquet":
                return _write_parquet(ctx.store, key, b.endpoint, blocks)
            return _write(ctx.store, key, blocks)

        lost: list[dict[str, Any]] = []
        out = write("output", _parts(ctx.store, b, shards, "ok", lost))
        err = write("errors", _error_blocks(ctx.store, b, shards, reason, lost))
        b.output_file_id = _output_file(s, b, "output", fmt, out)
        b.error_file_id = _output_file(s, b, "errors", fmt, err)
        if f is not None and f.format == "dataset" and not lost:
            manifest = Manifest.from_json(ctx.store.get_bytes(f.object_key))
            if manifest.output is not None:
                exports.write(ctx.store, b, shards, manifest, reason)
        elif b.parent_batch_id is not None and not lost:  # a rerun: into its root's dataset
            exports.write_rerun(ctx.store, s, b, [out[0], err[0]])
        if lost:  # requests we cannot account for: the batch must not claim success
            lifecycle.move(ctx, s, b, BatchStatus.FAILED, errors=lost)
        elif expired:
            lifecycle.move(ctx, s, b, BatchStatus.EXPIRED)
        elif cancelling:
            lifecycle.move(ctx, s, b, BatchStatus.CANCELLED)
        else:
            lifecycle.move(ctx, s, b, BatchStatus.COMPLETED)


def _write(store: ObjectStore, key: str, blocks: Iterator[bytes]) -> tuple[str, int, int]:
    size = store.put_stream(key, ConcatReader(blocks))  # type: ignore[arg-type]
    return key, size, size


def _write_parquet(store: ObjectStore, key: str, endpoint: str, blocks: Iterator[bytes]
                   ) -> tuple[str, int, int]:
    """Outputs of a Parquet dataset are Parquet too (one row per request)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.parquet"
        rows = write_rows(path, outputs.parquet_schema(endpoint),
                          outputs.parquet_rows(endpoint, blocks))
        with path.open("rb") as fh:
            size = store.put_stream(key, fh)
    return key, size, rows


def _output_file(s: Session, b: Batch, kind: str, fmt: str, written: tuple[str, int, int]
                 ) -> str | None:
    key, size, rows = written
    if rows == 0:
        return None
    t = now()
    f = File(id=new_id("file-"), tenant_id=b.tenant_id, filename=f"{b.id}_{kind}.{fmt}",
             purpose="batch_output", format=fmt, bytes=size, object_key=key, created_at=t,
             expires_at=None if b.output_expires_after is None else t + b.output_expires_after)
    s.add(f)
    return f.id


def committed_parts(b: Batch, shards: list[Shard], kind: str, since: Sequence[int] = ()
                    ) -> Iterator[tuple[Shard, int, str]]:
    """(shard, chunk, key) of each part the checkpoints committed, in shard and chunk
    order, under the key of the attempt that committed it (parts other attempts wrote,
    late or never committed, are ignored). A committed part never changes: ``since[i]``
    chunks of ``shards[i]`` already read are skipped (partial downloads,
    jobs/batches/partial.py)."""
    for i, sh in enumerate(shards):
        for chunk in range(since[i] if i < len(since) else 0, sh.chunks_done):
            yield sh, chunk, keys.output_part(b.id, sh.index, chunk, kind,
                                              repo.part_attempt(sh, chunk))


def _parts(store: ObjectStore, b: Batch, shards: list[Shard], kind: str,
           lost: list[dict[str, Any]]) -> Iterator[bytes]:
    """The parts the checkpoints committed (see :func:`committed_parts`). A committed
    part that is gone is reported in ``lost``: its requests are counted but have no
    lines."""
    for sh, chunk, key in committed_parts(b, shards, kind):
        try:
            yield from store.iter_chunks(key, CHUNK)
        except ObjectNotFound:
            lost.append({"code": "output_part_missing", "line": None, "param": None,
                         "message": f"the committed {'output' if kind == 'ok' else 'error'}"
                                    f" lines of chunk {chunk} of shard {sh.index} are "
                                    f"missing from the object store ({key})"})


def _error_blocks(store: ObjectStore, b: Batch, shards: list[Shard], reason: str,
                  lost: list[dict[str, Any]]) -> Iterator[bytes]:
    """Error lines: validation errors, failed requests, then requests that never ran
    (their custom_ids read back from the shard; if that fails, ``lost`` says so)."""
    try:
        yield from store.iter_chunks(keys.validation_errors(b.id))
    except ObjectNotFound:
        pass
    yield from _parts(store, b, shards, "err", lost)
    for sh in shards:
        if sh.status == ShardStatus.DONE or sh.rows_done >= sh.rows:
            continue
        stopped = "expired" if reason == "batch_expired" else "was cancelled"
        code, message = ((reason, f"the batch {stopped} before this request ran")
                         if sh.status == ShardStatus.CANCELLED else
                         ("shard_failed", sh.error or "the request could not be processed"))
        sh.failed += sh.rows - sh.rows_done  # these requests get error lines
        try:
            rows = done_rows.unrun(store, sh)
        except Exception as e:  # noqa: BLE001 - reported on the batch instead
            lost.append({"code": "shard_unreadable", "line": None, "param": None,
                         "message": f"{sh.rows - sh.rows_done} requests of shard {sh.index} "
                                    f"could not be read back to report them: {e}"})
            continue
        yield b"".join(outputs.unrun_line(r["custom_id"], code, message) for r in rows)
