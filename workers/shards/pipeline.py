"""Shard processing, free of Celery: claim, read in chunks, run, write, checkpoint.

Called by the shard task. Chunk ``k`` is written to its part key, which names this
claim's attempt, before the fenced checkpoint that commits it and records that
attempt, so a redelivered or resumed shard starts at the first uncommitted chunk
and never duplicates a line, and a worker whose lease lapsed can write late but
never over a part another attempt committed (finalize reads only committed
parts). The next chunk is queued on the engine before the current one is written
out, so the model never waits for I/O.

A chunk with lines that failed on the server's side (``Chunk.faults``: a 5xx from
the engine, through no fault of the line) is not committed: the attempt ends as a
failed one, and the shard is run again from its checkpoint, with backoff, as many
times as a failed attempt is (``max_shard_attempts`` in a row without progress).
Lines whose own input is at fault (4xx) are committed as error lines.

This is the chunked policy of embeddings, whose chunk's rows finish together;
generation shards commit rows as they finish (workers/shards/rows.py).
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections.abc import Callable
from typing import Any

from jobs.batches import queries as repo
from jobs.batches.views import read_shard
from jobs.core.context import Context
from jobs.core.lanes import PRIORITY, lane_for
from jobs.core.schema import Batch, Shard
from jobs.core.status import ShardOutcome, ShardStatus
from jobs.tenants import usage
from storage import keys
from workers.process import metrics
from workers.shards.fencing import (
    LeaseKeeper,
    Payer,
    ServerFaults,
    ShardResult,
    count_rows,
    release,
)
from workers.shards.rows import commits_rows, run_rows
from workers.shards.runners import Runner

log = logging.getLogger("inferq.pipeline")


def process_shard(ctx: Context, runner_for: Callable[[str, str | None], Runner], shard_id: str,
                  worker: str,
                  stop_requested: Callable[[], bool] = lambda: False,
                  healthy: Callable[[], bool] = lambda: True) -> ShardResult:
    """Claim the shard and run it from its checkpoint; every exit releases the lease.

    ``stop_requested`` (shutdown) hands the shard back after committing the chunk in
    flight; ``healthy`` false (the circuit breaker opened) hands it back without
    committing the chunk, whose results came from a failing model."""
    st = ctx.settings
    if not healthy():
        return ShardResult(ShardOutcome.HANDED_BACK, retry_in_s=st.breaker_cooldown_s)
    token = secrets.token_hex(16)
    with ctx.db.session() as s:
        sh = repo.claim_shard(s, shard_id, token, worker, st.lease_seconds)
        if sh is None:
            return ShardResult(ShardOutcome.DUPLICATE)
        b = s.get(Batch, sh.batch_id)
        assert b is not None
        batch_id, attempt, stalls = b.id, sh.attempt, sh.stalls
        endpoint, tier, version = b.endpoint, b.service_tier, b.model_version
        if sh.dispatched_at is not None and sh.claimed_at is not None:
            metrics.observe_queue(lane_for(tier), b.model or "", sh.claimed_at - sh.dispatched_at)
        payer = Payer(b.tenant_id, b.api_key_id, usage.kind_of(endpoint), b.model or "", tier)
    if stalls >= st.max_shard_attempts:  # the previous attempts all died without a commit
        return release(ctx, batch_id, shard_id, token, ShardStatus.FAILED, ShardOutcome.FAILED,
                        repo.give_up_message(stalls))
    keeper = LeaseKeeper(ctx, shard_id, token)
    keeper.start()
    try:
        runner = runner_for(endpoint, version)
        prio = PRIORITY[lane_for(tier)]
        if commits_rows(runner):
            return run_rows(ctx, runner, sh, token, prio, stop_requested, healthy, keeper,
                            payer)
        return _run(ctx, runner, sh, token, prio, stop_requested, healthy, keeper, payer)
    except Exception as e:  # noqa: BLE001 - recorded on the shard, retried with backoff
        log.exception("shard %s attempt %d failed", shard_id, attempt)
        with ctx.db.session() as s:
            now = s.get(Shard, shard_id)
            in_a_row = repo.stalled_attempts(now) if now is not None else stalls
        if in_a_row >= st.max_shard_attempts:
            return release(ctx, batch_id, shard_id, token, ShardStatus.FAILED,
                            ShardOutcome.FAILED,
                            f"failed {in_a_row} times in a row without progress: {e}")
        res = release(ctx, batch_id, shard_id, token, ShardStatus.QUEUED, ShardOutcome.RETRY,
                       str(e))
        res.retry_in_s = min(60.0, 2.0 ** (stalls + 1)) * (0.5 + random.random())
        return res
    finally:
        keeper.done.set()


def _run(ctx: Context, runner: Runner, sh: Shard, token: str, prio: int,
         stop_requested: Callable[[], bool], healthy: Callable[[], bool],
         keeper: LeaseKeeper, payer: Payer) -> ShardResult:
    st = ctx.settings
    batch_id, index, shard_id, start_chunk = sh.batch_id, sh.index, sh.id, sh.chunks_done
    attempt = sh.attempt  # this claim's: its part keys are its own
    # Resume after the committed rows, not chunks_done x chunk_rows: the chunk size is
    # this worker's setting and may differ from the one that committed the chunks.
    rows = read_shard(ctx.store, sh, start=sh.rows_done)
    chunks = [rows[i: i + st.chunk_rows] for i in range(0, len(rows), st.chunk_rows)]

    def submit(n: int) -> Any:
        return runner.submit(chunks[n], prio) if n < len(chunks) else None

    nxt = submit(0)
    if chunks:
        count_rows(ctx, shard_id, len(chunks[0]), 0)
    for n, _ in enumerate(chunks):
        assert nxt is not None
        cur = nxt
        c = start_chunk + n
        nxt = submit(n + 1)
        why = _interrupted(ctx, runner, cur, batch_id, stop_requested)
        if why is not None:  # the chunk's rows leave the engine; never committed
            runner.cancel(cur)
            runner.cancel(nxt)
            if why is ShardOutcome.CANCELLED:
                return release(ctx, batch_id, shard_id, token, ShardStatus.CANCELLED,
                                ShardOutcome.CANCELLED)
            log.info("shard %s: chunk %d not done %.0f s after the stop: handed back from "
                     "its checkpoint", shard_id, c, st.drain_s)
            return release(ctx, batch_id, shard_id, token, ShardStatus.QUEUED,
                            ShardOutcome.HANDED_BACK)
        ok, err, completed, failed, tokens = runner.collect(cur)
        lane = lane_for(payer.service_tier)
        metrics.BATCH_ROWS.labels(lane, payer.model, "ok").inc(completed)
        metrics.BATCH_ROWS.labels(lane, payer.model, "error").inc(failed)
        metrics.ACCEL_SECONDS.labels(lane, payer.model).inc(cur.seconds)
        count_rows(ctx, shard_id, len(nxt.rows) if nxt is not None else 0, len(cur.rows))
        if not healthy():
            runner.cancel(nxt)
            return release(ctx, batch_id, shard_id, token, ShardStatus.QUEUED,
                            ShardOutcome.HANDED_BACK,
                            "handed back: this worker's model keeps failing",
                            not_its_fault=True)
        if cur.faults:  # computed again by the next attempt, from this chunk
            runner.cancel(nxt)
            raise ServerFaults(c, cur.faults)
        ctx.store.put_bytes(keys.output_part(batch_id, index, c, "ok", attempt), ok)
        ctx.store.put_bytes(keys.output_part(batch_id, index, c, "err", attempt), err)
        bill = payer.bill(ctx, shard_id, batch_id, c, completed, tokens, cur.seconds)
        with ctx.db.session() as s:
            committed = not keeper.lost and repo.checkpoint(
                s, shard_id, token, attempt, c + 1, len(cur.rows), completed, failed, tokens,
                st.lease_seconds, bill)
            stopping = committed and repo.batch_stopping(s, batch_id)
        if not committed:
            runner.cancel(nxt)
            log.warning("shard %s: lease lost at chunk %d, stopping", shard_id, c)
            return ShardResult(ShardOutcome.FENCED)
        if stopping:  # cancelled, or its completion window passed
            runner.cancel(nxt)
            return release(ctx, batch_id, shard_id, token, ShardStatus.CANCELLED,
                            ShardOutcome.CANCELLED)
        if nxt is not None and stop_requested():
            runner.cancel(nxt)
            return release(ctx, batch_id, shard_id, token, ShardStatus.QUEUED,
                            ShardOutcome.HANDED_BACK)
    return release(ctx, batch_id, shard_id, token, ShardStatus.DONE, ShardOutcome.DONE)


# How often a chunk being computed looks up whether its batch was cancelled (or its
# window passed) and whether the worker is stopping.
CHECK_S = 1.0


def _interrupted(ctx: Context, runner: Runner, chunk: Any, batch_id: str,
                 stop_requested: Callable[[], bool]) -> ShardOutcome | None:
    """Wait for ``chunk``; None once it is computed. CANCELLED as soon as its batch is
    stopping (cancelled, or its completion window passed: its rows are not wanted);
    HANDED_BACK when the worker was asked to stop and the chunk is still not done
    ``drain_s`` later (it is computed again from the checkpoint elsewhere)."""
    drain_by: float | None = None
    while not runner.done(chunk, CHECK_S):
        with ctx.db.session() as s:
            if repo.batch_stopping(s, batch_id):
                return ShardOutcome.CANCELLED
        if stop_requested():
            now = time.monotonic()
            drain_by = drain_by if drain_by is not None else now + ctx.settings.drain_s
            if now >= drain_by:
                return ShardOutcome.HANDED_BACK
    return None


