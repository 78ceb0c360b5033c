"""The one batch factory of the tests: a batch's rows written straight into the
database, as validation would leave them, for tests of what happens after."""

from __future__ import annotations

import secrets
import time
from typing import Any

from jobs.core import refs
from jobs.core.context import Context
from jobs.core.schema import Batch, File, Shard, new_id
from jobs.core.status import BatchStatus
from jobs.tenants import auth


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
