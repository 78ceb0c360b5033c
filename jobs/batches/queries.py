"""Queries over the schema of files, batches and shards. Functions take a Session and
never commit: the caller's unit of work decides. Conditional updates here are what
make shard execution safe under redelivery (see docs/RELIABILITY.md)."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from sqlalchemy import and_, case, func, literal, select, update
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from jobs.batches.outputs import Tokens
from jobs.core.errors import InvalidRequest
from jobs.core.schema import (
    Batch,
    File,
    Shard,
    now,
)
from jobs.core.status import SHARD_FINISHED, TERMINAL, BatchStatus, ShardStatus
from jobs.tenants import usage


def file_exists(at: int | None = None) -> Any:
    """The condition of a file that is there: not deleted, not past its expiry (an
    expired file is gone at once, before the janitor deletes its object)."""
    t = now() if at is None else at
    return File.deleted.is_(False) & (File.expires_at.is_(None) | (File.expires_at > t))


def get_file(s: Session, tenant_id: str, file_id: str, lock: bool = False) -> File | None:
    """``lock``: its row locked (a batch created from it and its deletion serialize)."""
    q = select(File).where(File.id == file_id, File.tenant_id == tenant_id, file_exists())
    return s.scalar(q.with_for_update() if lock else q)


def results_gone(s: Session, b: Batch) -> str | None:
    """The id of an output or error file of ``b`` that has expired or was deleted (its
    results, and the parts they were made of, are gone), if one has."""
    for file_id in (b.output_file_id, b.error_file_id):
        if file_id is not None and get_file(s, b.tenant_id, file_id) is None:
            return file_id
    return None


def get_batch(s: Session, tenant_id: str | None, batch_id: str, lock: bool = False) -> Batch | None:
    q = select(Batch).where(Batch.id == batch_id)
    if tenant_id is not None:
        q = q.where(Batch.tenant_id == tenant_id)
    if lock:
        q = q.with_for_update()
    return s.scalar(q)


def get_batches(s: Session, batch_ids: list[str]) -> list[Batch]:
    return list(s.scalars(select(Batch).where(Batch.id.in_(batch_ids)))) if batch_ids else []


def page(s: Session, model: type[Batch] | type[File], tenant_id: str, after: str | None,
         limit: int, extra: list[Any] | None = None) -> tuple[list[Any], bool]:
    """Newest first; ids are time-ordered so ``after`` is a plain id comparison.
    ``after`` must be one of the tenant's own ids (a cursor from an earlier page)."""
    q = select(model).where(model.tenant_id == tenant_id, *(extra or []))
    if after:
        known = s.scalar(select(model.id).where(model.id == after, model.tenant_id == tenant_id))
        if known is None:
            raise InvalidRequest(f"after: no such object {after!r}; pass the id of an item "
                                 "from a previous page", param="after")
        q = q.where(model.id < after)
    rows = list(s.scalars(q.order_by(model.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


class ShardSums(NamedTuple):
    """A batch's counts, summed over its shards (all zero before it has shards)."""

    completed: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def shard_sums(s: Session, batch_ids: list[str]) -> dict[str, ShardSums]:
    """Request counts and token usage per batch, summed over its shards."""
    if not batch_ids:
        return {}
    q = (select(Shard.batch_id, func.sum(Shard.completed), func.sum(Shard.failed),
                func.sum(Shard.prompt_tokens), func.sum(Shard.completion_tokens))
         .where(Shard.batch_id.in_(batch_ids)).group_by(Shard.batch_id))
    return {b: ShardSums(*(int(v or 0) for v in sums)) for b, *sums in s.execute(q)}


def claim_shard(s: Session, shard_id: str, token: str, worker: str, ttl_s: float) -> Shard | None:
    """Take the shard's lease if it is free (never held, or expired) and not finished.

    Returns None for a duplicate delivery of a shard someone else holds or finished.
    ``stalls`` becomes the number of attempts in a row before this one that committed
    no chunk (the previous attempt started at ``claimed_chunks``).
    """
    now = time.time()
    stalled = and_(Shard.attempt > 0, Shard.chunks_done == Shard.claimed_chunks)
    return s.scalar(
        update(Shard)
        .where(Shard.id == shard_id, Shard.status.not_in(SHARD_FINISHED),
               (Shard.lease_expires_at.is_(None)) | (Shard.lease_expires_at < now))
        .values(attempt=Shard.attempt + 1, stalls=case((stalled, Shard.stalls + 1), else_=0),
                claimed_chunks=Shard.chunks_done, lease_token=token,
                lease_expires_at=now + ttl_s, worker=worker, status=ShardStatus.RUNNING,
                claimed_at=now, updated_at=now)
        .returning(Shard)
    )


def stalled_attempts(sh: Shard) -> int:
    """Attempts in a row, this one included, that committed nothing so far."""
    return sh.stalls + (1 if sh.chunks_done == sh.claimed_chunks else 0)


def give_up_message(stalls: int) -> str:
    return (f"gave up after {stalls} attempts in a row that committed nothing: each ended "
            "early (worker killed, lost or out of memory)")


def checkpoint(s: Session, shard_id: str, token: str, attempt: int, chunks_done: int,
               rows: int, completed: int, failed: int, tokens: Tokens, ttl_s: float,
               bill: usage.Entry | None = None, done: list[list[int]] | None = None
               ) -> bool:
    """Commit chunk ``chunks_done - 1``, written by ``attempt`` (its parts are keyed by
    it), and renew the lease; False if fenced off.

    ``tokens``: the usage of the chunk's output lines. The attempt is recorded in
    ``part_attempts`` by the same conditional UPDATE, so finalize reads the parts of
    the attempt that committed the chunk, never those a fenced worker wrote later.
    ``bill``, the chunk's usage record, is inserted only when the UPDATE committed the
    chunk, in the same transaction: a fenced-off writer never counts. ``done``: every
    committed row's position, this chunk's included (jobs/batches/done_rows.py), for
    rows committed out of order."""
    now = time.time()
    extra: dict[str, Any] = {} if done is None else {"done_rows": done}
    res = s.execute(
        update(Shard)
        .where(Shard.id == shard_id, Shard.lease_token == token, Shard.attempt == attempt,
               Shard.chunks_done == chunks_done - 1)
        .values(**extra, chunks_done=chunks_done, rows_done=Shard.rows_done + rows,
                part_attempts=Shard.part_attempts.op("||")(
                    literal({str(chunks_done - 1): attempt}, JSONB)),
                completed=Shard.completed + completed, failed=Shard.failed + failed,
                prompt_tokens=Shard.prompt_tokens + tokens.prompt,
                completion_tokens=Shard.completion_tokens + tokens.completion,
                lease_expires_at=now + ttl_s,
                updated_at=now)
    )
    committed = bool(res.rowcount)  # type: ignore[attr-defined]
    if committed and bill is not None:
        usage.record(s, bill, now)
    return committed


def part_attempt(sh: Shard, chunk: int) -> int | None:
    """The attempt whose parts the checkpoint committed for ``chunk``; None for a chunk
    committed before attempts were recorded (its parts use the key without one)."""
    attempt = (sh.part_attempts or {}).get(str(chunk))
    return None if attempt is None else int(attempt)


def count_rows(s: Session, shard_id: str, started: int, computed: int) -> None:
    """Work accounting, unfenced: every attempt's work counts, committed or not."""
    s.execute(update(Shard).where(Shard.id == shard_id).values(
        rows_started=Shard.rows_started + started, rows_computed=Shard.rows_computed + computed))


def renew_lease(s: Session, shard_id: str, token: str, ttl_s: float) -> bool:
    res = s.execute(update(Shard).where(Shard.id == shard_id, Shard.lease_token == token)
                    .values(lease_expires_at=time.time() + ttl_s))
    return bool(res.rowcount)  # type: ignore[attr-defined]


def release_shard(s: Session, shard_id: str, token: str, status: ShardStatus,
                  error: str | None = None, not_its_fault: bool = False) -> bool:
    """End this holder's lease with a final (or, for QUEUED, handed-back) status.

    ``not_its_fault``: the worker gave the shard up for reasons of its own (its model
    is failing), so this attempt does not count as a stall of the shard."""
    values: dict[str, Any] = {"status": status, "error": error, "lease_token": None,
                              "lease_expires_at": None, "updated_at": time.time()}
    if not_its_fault:
        values["claimed_chunks"] = -1
    res = s.execute(
        update(Shard).where(Shard.id == shard_id, Shard.lease_token == token).values(**values)
    )
    return bool(res.rowcount)  # type: ignore[attr-defined]


def unfinished_shards(s: Session, batch_id: str) -> int:
    return int(s.scalar(select(func.count()).select_from(Shard).where(
        Shard.batch_id == batch_id, Shard.status.not_in(SHARD_FINISHED))) or 0)


def cancel_queued_shards(s: Session, batch_id: str) -> None:
    s.execute(update(Shard).where(Shard.batch_id == batch_id, Shard.status == ShardStatus.QUEUED)
              .values(status=ShardStatus.CANCELLED, updated_at=time.time()))


def shards_of(s: Session, batch_id: str) -> list[Shard]:
    return list(s.scalars(select(Shard).where(Shard.batch_id == batch_id).order_by(Shard.index)))


def batch_stopping(s: Session, batch_id: str) -> bool:
    """Whether a running shard of this batch should stop at its next chunk."""
    row = s.execute(select(Batch.status, Batch.expired_at).where(Batch.id == batch_id)).first()
    return row is None or row[0] == BatchStatus.CANCELLING or row[1] is not None


def recent_batches(s: Session, tenant_id: str | None, since: int, limit: int) -> list[Batch]:
    """The project's batches (every project's: ``tenant_id`` None) that have not ended or
    were created at ``since`` or later, newest first."""
    q = select(Batch).where((Batch.status.not_in(TERMINAL)) | (Batch.created_at >= since))
    if tenant_id is not None:
        q = q.where(Batch.tenant_id == tenant_id)
    return list(s.scalars(q.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(limit)))
