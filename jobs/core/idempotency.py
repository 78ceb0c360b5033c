"""Idempotency keys for creating POSTs: the same key and body give the same object,
the same key with another body is a 409, and a duplicate arriving while the first
is still running waits for its answer instead of creating a second object. Only a
success is kept: a refused request leaves its key unused."""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert

from jobs.core.context import Context
from jobs.core.errors import Conflict, InvalidRequest
from jobs.core.schema import IdempotencyKey, now
from jobs.core.status import IdempotencyState

MAX_KEY = 255


@dataclass
class Replay:
    status: int
    body: bytes


def begin(ctx: Context, tenant_id: str, key: str, request_hash: str,
          wait_s: float = 60.0) -> Replay | None:
    """None: this request owns the key and must run (then ``finish`` or ``abandon``).
    A Replay: the stored answer of an earlier identical request."""
    if not key or len(key) > MAX_KEY or not key.isprintable():
        raise InvalidRequest(f"Idempotency-Key must be 1 to {MAX_KEY} printable characters",
                             param="Idempotency-Key")
    deadline = time.monotonic() + wait_s
    while True:
        with ctx.db.session() as s:
            inserted = s.execute(
                insert(IdempotencyKey).values(tenant_id=tenant_id, key=key,
                                              request_hash=request_hash,
                                              status=IdempotencyState.PENDING,
                                              created_at=now())
                .on_conflict_do_nothing().returning(IdempotencyKey.key)).first()
            if inserted is not None:
                return None
            row = s.scalar(select(IdempotencyKey).where(IdempotencyKey.tenant_id == tenant_id,
                                                        IdempotencyKey.key == key))
        if row is None:
            continue  # abandoned between the two statements: try to take it
        if row.request_hash != request_hash:
            raise Conflict("this Idempotency-Key was used with a different request",
                           param="Idempotency-Key", code="idempotency_key_reused")
        if row.status == IdempotencyState.DONE:
            assert row.response_status is not None and row.response_body is not None
            return Replay(row.response_status, row.response_body)
        if time.monotonic() > deadline:
            raise Conflict("a request with this Idempotency-Key is still in progress",
                           param="Idempotency-Key", code="idempotency_key_in_use")
        time.sleep(0.05)


def finish(ctx: Context, tenant_id: str, key: str, status: int, body: bytes) -> None:
    with ctx.db.session() as s:
        row = s.get(IdempotencyKey, (tenant_id, key))
        if row is not None:
            row.status, row.response_status, row.response_body = IdempotencyState.DONE, status, body


def abandon(ctx: Context, tenant_id: str, key: str) -> None:
    """The request was refused or failed (it created nothing): a request with the same
    key runs again."""
    with ctx.db.session() as s:
        s.execute(delete(IdempotencyKey).where(IdempotencyKey.tenant_id == tenant_id,
                                               IdempotencyKey.key == key,
                                               IdempotencyKey.status == IdempotencyState.PENDING))
