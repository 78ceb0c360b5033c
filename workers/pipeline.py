"""Shard processing, free of Celery: claim, read in chunks, run, write, checkpoint.

Called by the shard task. Chunk ``k`` is written to its deterministic part key
before the fenced checkpoint that commits it, so a redelivered or resumed shard
starts at the first uncommitted chunk and never duplicates a line. The next
chunk is queued on the engine before the current one is written out, so the
model never waits for I/O.
"""

from __future__ import annotations

import io
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from jobs import repository as repo
from jobs.context import Context
from jobs.models import Batch
from jobs.status import BatchStatus, ShardStatus
from storage import keys
from storage.parquet import read_rows
from workers.engine import PRIORITY_BY_TIER
from workers.runners import Runner

log = logging.getLogger("inferq.pipeline")


@dataclass
class ShardResult:
    outcome: str  # done | duplicate | fenced | cancelled | handed_back
    finalize: bool = False


def process_shard(ctx: Context, runner_for: Callable[[str], Runner], shard_id: str, worker: str,
                  stop_requested: Callable[[], bool] = lambda: False) -> ShardResult:
    st = ctx.settings
    token = secrets.token_hex(16)
    with ctx.db.session() as s:
        sh = repo.claim_shard(s, shard_id, token, worker, st.lease_seconds)
        if sh is None:
            return ShardResult("duplicate")
        b = s.get(Batch, sh.batch_id)
        assert b is not None
        batch_id, index, key, start_chunk = b.id, sh.index, sh.object_key, sh.chunks_done
        prio = PRIORITY_BY_TIER.get(b.service_tier, 2)
        runner = runner_for(b.endpoint)
    with ctx.store.open(key) as f:
        rows = read_rows(io.BytesIO(f.read()), start=start_chunk * st.chunk_rows)
    chunks = [rows[i: i + st.chunk_rows] for i in range(0, len(rows), st.chunk_rows)]
    nxt = runner.submit(chunks[0], prio) if chunks else None
    for n, _ in enumerate(chunks):
        assert nxt is not None
        cur = nxt
        c = start_chunk + n
        nxt = runner.submit(chunks[n + 1], prio) if n + 1 < len(chunks) else None
        ok, err, completed, failed, tokens = runner.collect(cur)
        ctx.store.put_bytes(keys.output_part(batch_id, index, c, "ok"), ok)
        ctx.store.put_bytes(keys.output_part(batch_id, index, c, "err"), err)
        with ctx.db.session() as s:
            if not repo.checkpoint(s, shard_id, token, c + 1, len(cur.rows), completed, failed,
                                   tokens, st.lease_seconds):
                runner.cancel(nxt)
                log.warning("shard %s: lease lost at chunk %d, stopping", shard_id, c)
                return ShardResult("fenced")
            status = repo.batch_status(s, batch_id)
        if status == BatchStatus.CANCELLING:
            runner.cancel(nxt)
            return _release(ctx, batch_id, shard_id, token, ShardStatus.CANCELLED, "cancelled")
        if nxt is not None and stop_requested():
            runner.cancel(nxt)
            return _release(ctx, batch_id, shard_id, token, ShardStatus.QUEUED, "handed_back")
    return _release(ctx, batch_id, shard_id, token, ShardStatus.DONE, "done")


def _release(ctx: Context, batch_id: str, shard_id: str, token: str, status: ShardStatus,
             outcome: str) -> ShardResult:
    """Give up the lease; the last shard of a batch to finish asks for finalize."""
    with ctx.db.session() as s:
        repo.get_batch(s, None, batch_id, lock=True)  # serialises "am I the last?" per batch
        if not repo.release_shard(s, shard_id, token, status):
            return ShardResult("fenced")
        last = status != ShardStatus.QUEUED and repo.unfinished_shards(s, batch_id) == 0
    return ShardResult(outcome, finalize=last)
