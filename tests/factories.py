"""The one batch factory of the tests: a batch's rows written straight into the
database, as validation would leave them, for tests of what happens after; and what
such a test reads back (the messages sent to a queue, a shard's row)."""

from __future__ import annotations

import base64
import json
import secrets
import time
from typing import Any, TypeVar

from jobs.core import refs
from jobs.core.context import Context
from jobs.core.dispatch import TASK_SHARD
from jobs.core.schema import Batch, File, Shard, new_id
from jobs.core.status import BatchStatus
from jobs.tenants import auth

T = TypeVar("T")


def batch_rows(ctx: Context, shards: list[dict[str, Any]] | None = None, *,
               tenant_id: str | None = None, file_format: str = "jsonl",
               file_key: str = "x", **batch: Any) -> tuple[str, list[str]]:
    """A batch of a project (a new one unless ``tenant_id``), its input File and its
    shards; (batch id, shard ids). The batch is in progress on ``/v1/embeddings`` and
    expires in an hour unless ``batch`` says otherwise; each shard is ten rows of
    ``file_key`` with the columns its dict gives over those."""
    if tenant_id is None:
        tenant_id, _ = auth.create_tenant(ctx, f"factory-{secrets.token_hex(4)}")
    batch_id = batch.pop("id", None) or new_id("batch_")
    with ctx.db.session() as s:
        f = File(id=new_id("file-"), tenant_id=tenant_id, filename=f"in.{file_format}",
                 purpose="batch", format=file_format, bytes=1, object_key=file_key)
        s.add(f)
        s.flush()
        s.add(Batch(**{"id": batch_id, "tenant_id": tenant_id, "endpoint": "/v1/embeddings",
                       "input_file_id": f.id, "completion_window": "24h",
                       "status": BatchStatus.IN_PROGRESS,
                       "expires_at": int(time.time()) + 3600, **batch}))
        s.flush()
        ids = []
        for i, columns in enumerate(shards or []):
            sid = refs.shard_id(batch_id, i)
            s.add(Shard(**{"id": sid, "batch_id": batch_id, "index": i, "object_key": file_key,
                           "rows": 10, **columns}))
            ids.append(sid)
    return batch_id, ids


def make_batch(ctx: Context, shards: list[dict[str, object]],
               **batch: object) -> list[str]:
    """The shard ids of a new batch (its id when it has none); its shards sent to the
    broker unless a test says otherwise (dispatched_at None: waiting for the fair
    dispatcher)."""
    batch_id, ids = batch_rows(ctx, [{"dispatched_at": time.time(), **kw} for kw in shards],
                               **batch)
    return ids if shards else [batch_id]


def messages(ctx: Context, queue: str) -> list[tuple[str, str]]:
    """(task name, first argument) of the Celery messages waiting on a queue, oldest
    first (kombu pushes on the left), skipping anything that is not a task."""
    out = []
    for raw in reversed(ctx.redis.lrange(queue, 0, -1)):
        try:
            msg = json.loads(raw)
        except ValueError:
            continue
        args, _, _ = json.loads(base64.b64decode(msg["body"]))
        out.append((msg["headers"]["task"], args[0]))
    return out


def sent(ctx: Context, queue: str = "batch") -> list[str]:
    """Shard ids sent to a lane queue."""
    return [arg for task, arg in messages(ctx, queue) if task == TASK_SHARD]


def row(ctx: Context, table: type[T], key: str) -> T:
    """A row (of ``table``, by its primary key) as it is now, detached from its session."""
    with ctx.db.session() as s:
        found = s.get(table, key)
        assert found is not None, (table.__name__, key)
        s.expunge(found)
        return found


def shard_row(ctx: Context, sid: str) -> Shard:
    """A shard's row as it is now."""
    return row(ctx, Shard, sid)
