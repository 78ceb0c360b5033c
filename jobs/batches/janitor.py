"""The janitor: periodic repairs that make worker deaths and deadlines harmless.

Run by the control worker every few seconds (``sweep``), beside the reaping of the
realtime requests dead workers had taken (``workers.lanes.control``). It
- hands back shards whose worker's heartbeat expired, or whose lease expired
  (their worker was killed or lost), so another worker resumes them from the
  checkpoint — much sooner than the broker's visibility timeout would redeliver
  them; the lease token fences off a holder that was only slow — and fails a shard whose
  last ``max_shard_attempts`` attempts all ended without committing a chunk, with
  a clear error instead of letting it loop (a shard that keeps moving is never
  given up on, however often its workers die);
- expires batches whose completion window has passed: queued shards stop at
  once, running ones at their next chunk, finished results are kept and the rest
  become ``batch_expired`` error lines;
- sends validate or finalize again for a batch whose control task was lost;
- dispatches the batch lanes' next waiting shards (``jobs.batches.fairshare``), so a
  dispatch trigger that was lost (a worker killed after its shard) only delays;
- decides again where jobs waiting on a version's list go (``jobs.asyncjobs.lifecycle
  .place_waiting``): a version no live jobs worker holds is placed, and the jobs of
  one that cannot be had are refused (``model_not_loaded``), so a job pushed while
  no jobs worker was live, or as its version's load failed, does not wait forever;
- marks pending uploads past their ``expires_at`` expired and deletes their parts
  (``jobs.batches.uploads.expire``);
- deletes expired files' objects, and webhook events and usage records past their
  retention (``jobs.batches.retention``).
Every change is a conditional UPDATE, so two janitors (or a janitor racing a
worker) cannot both act on the same shard.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy import and_, exists, func, select, update

from jobs.asyncjobs import lifecycle as asyncjobs
from jobs.batches import fairshare, retention, uploads
from jobs.batches import queries as repo
from jobs.core.context import Context
from jobs.core.lanes import CONTROL, lane_for
from jobs.core.redis_keys import WORKERS
from jobs.core.schema import Batch, Shard, now
from jobs.core.status import SHARD_FINISHED, BatchStatus, ShardStatus
from jobs.fleet import placement


@dataclass
class SweepReport:
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    finalize: set[str] = field(default_factory=set)
    validate: set[str] = field(default_factory=set)
    dispatched: list[str] = field(default_factory=list)
    placed: list[tuple[str, str, str]] = field(default_factory=list)  # warm pools' commands
    unplaceable: list[str] = field(default_factory=list)  # versions whose jobs were refused
    expired_uploads: list[str] = field(default_factory=list)
    pruned: retention.Pruned = field(default_factory=retention.Pruned)


def sweep(ctx: Context) -> SweepReport:
    rep = SweepReport()
    _expire_batches(ctx, rep)
    _repair_leases(ctx, rep)
    try:
        _resend_stranded(ctx, rep)
        _resume_control(ctx, rep)
        _send(ctx, rep)
        rep.dispatched = fairshare.dispatch_all(ctx)
        rep.unplaceable = asyncjobs.place_waiting(ctx)
        rep.placed = placement.reconcile(ctx)
    except Exception:
        # The broker is unreachable (e.g. restarting): shards handed back above are
        # queued in the DB with no message. Mark them so the next sweep that reaches
        # the broker sends them, instead of waiting out stranded_shard_s.
        with ctx.db.session() as s:
            s.execute(update(Shard).where(Shard.id.in_(rep.requeued),
                                          Shard.status == ShardStatus.QUEUED)
                      .values(updated_at=0.0))
        raise
    rep.expired_uploads = uploads.expire(ctx)
    rep.pruned = retention.prune(ctx)
    return rep


def _send(ctx: Context, rep: SweepReport) -> None:
    if rep.requeued:
        fairshare.enqueue_shards(ctx, rep.requeued)
    for batch_id in sorted(rep.validate):
        ctx.dispatcher.validate(batch_id)
    for batch_id in sorted(rep.finalize):
        ctx.dispatcher.finalize(batch_id)


def _repair_leases(ctx: Context, rep: SweepReport) -> None:
    """Hand back running shards whose lease lapsed, or whose worker is gone: its
    heartbeat expired (``gone_holders``), which comes well before the lease. Such a
    shard of a batch being cancelled (or past its window) is cancelled instead, and the
    batch finalized once nothing of it runs."""
    t = time.time()
    cap = ctx.settings.max_shard_attempts
    with ctx.db.session() as s:
        holders = {w for w in s.scalars(select(Shard.worker).distinct().where(
            Shard.status == ShardStatus.RUNNING)) if w}
    gone = gone_holders(ctx, holders)  # outside a transaction: Redis may be slow to answer
    # A claim younger than one heartbeat TTL is left alone whatever Redis says.
    orphaned = and_(Shard.worker.in_(gone), Shard.claimed_at < t - ctx.settings.heartbeat_ttl_s)
    with ctx.db.session() as s:
        stale = list(s.scalars(select(Shard).where(
            Shard.status == ShardStatus.RUNNING, (Shard.lease_expires_at < t) | orphaned)
            .with_for_update(skip_locked=True).limit(1000)))
        stopping = {batch_id for batch_id in {sh.batch_id for sh in stale}
                    if repo.batch_stopping(s, batch_id)}
        for sh in stale:
            stalls = repo.stalled_attempts(sh)
            if sh.batch_id in stopping:  # cancelled (or expired): its rows are not wanted
                sh.status = ShardStatus.CANCELLED
            elif stalls >= cap:
                sh.status = ShardStatus.FAILED
                sh.error = repo.give_up_message(stalls)
                rep.failed.append(sh.id)
            else:
                sh.status = ShardStatus.QUEUED
                rep.requeued.append(sh.id)
            sh.lease_token, sh.lease_expires_at, sh.updated_at = None, None, t
        s.flush()
        # A batch ends without waiting for a worker to come back for its shard.
        for batch_id in {sh.batch_id for sh in stale if sh.status in (
                ShardStatus.FAILED, ShardStatus.CANCELLED)}:
            if repo.unfinished_shards(s, batch_id) == 0:
                rep.finalize.add(batch_id)


def gone_holders(ctx: Context, workers: set[str]) -> set[str]:
    """The lease holders among ``workers`` (names as in heartbeats) whose heartbeat has
    expired: dead, or cut off from Redis for three beats. Empty when Redis has been up
    for less than a heartbeat TTL (its keys may have been lost or expired in a restart,
    while their workers are about to beat again) or cannot say how long."""
    if not workers:
        return set()
    names = sorted(workers)
    try:
        uptime = float(ctx.redis.info("server")["uptime_in_seconds"])
        found = ctx.redis.mget([WORKERS + n for n in names])
    except Exception:  # noqa: BLE001 - Redis down, or INFO refused: lapsed leases only
        return set()
    beating = {n for n, raw in zip(names, found, strict=True) if raw is not None}
    return holders_without_heartbeat(workers, beating, uptime, ctx.settings.heartbeat_ttl_s)


def holders_without_heartbeat(workers: set[str], beating: set[str], redis_uptime_s: float,
                              heartbeat_ttl_s: float) -> set[str]:
    """The decision of ``gone_holders``, given what Redis said."""
    if redis_uptime_s < heartbeat_ttl_s:
        return set()
    return workers - beating


def _resend_stranded(ctx: Context, rep: SweepReport) -> None:
    """Dispatched, queued shards nobody has touched for a while, while their lane's
    queue is empty: their message was lost (e.g. reserved by a worker that then
    stopped). Sending one again is safe: a claim of a shard someone holds or finished
    does nothing. Shards whose send failed (``updated_at`` 0, see ``sweep`` and
    ``fairshare.dispatch``) are sent at once. A shard still waiting for the fair
    dispatcher (``dispatched_at`` NULL) has no message to lose and is not stranded."""
    stale = time.time() - ctx.settings.stranded_shard_s
    with ctx.db.session() as s:
        rows = s.execute(select(Shard.id, Shard.updated_at, Batch.service_tier).join(
            Batch, Batch.id == Shard.batch_id).where(
            Shard.status == ShardStatus.QUEUED, Shard.updated_at < stale,
            Shard.dispatched_at.is_not(None),
            Batch.status == BatchStatus.IN_PROGRESS).limit(1000)).all()
        for sid, updated_at, tier in rows:
            queue = lane_for(tier)
            if updated_at == 0 or ctx.redis.llen(queue) == 0:
                s.execute(update(Shard).where(Shard.id == sid)
                          .values(updated_at=time.time()))
                rep.requeued.append(sid)


def _resume_control(ctx: Context, rep: SweepReport) -> None:
    """Batches whose control step (validate, finalize) was lost: its task died with a
    killed worker, or failed while PostgreSQL or the broker was down. Both tasks are
    idempotent, so they are sent again once the batch has sat still for
    ``stranded_shard_s`` while the control queue is empty (a control worker busy with
    a long validation holds its message unacked, so the copy waits and then no-ops)."""
    if ctx.redis.llen(CONTROL):
        return
    stale = time.time() - ctx.settings.stranded_shard_s
    with ctx.db.session() as s:
        rep.validate.update(s.scalars(select(Batch.id).where(
            Batch.status.in_([BatchStatus.VALIDATING, BatchStatus.CANCELLING]),
            Batch.created_at < stale, ~exists().where(Shard.batch_id == Batch.id))
            .limit(100)))
        last_move = (select(func.max(Shard.updated_at)).where(Shard.batch_id == Batch.id)
                     .scalar_subquery())
        rep.finalize.update(s.scalars(select(Batch.id).where(
            Batch.status.in_([BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING,
                              BatchStatus.CANCELLING]),
            exists().where(Shard.batch_id == Batch.id),
            ~exists().where(Shard.batch_id == Batch.id,
                            Shard.status.not_in(SHARD_FINISHED)),
            last_move < stale).limit(100)))


def _expire_batches(ctx: Context, rep: SweepReport) -> None:
    t = now()
    with ctx.db.session() as s:
        due = list(s.scalars(select(Batch).where(
            Batch.status.in_([BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS]),
            Batch.expires_at < t, Batch.expired_at.is_(None))
            .with_for_update(skip_locked=True).limit(100)))
        for b in due:
            b.expired_at = t  # shards stop at their next chunk; finalize marks it expired
            s.execute(update(Shard).where(Shard.batch_id == b.id,
                                          Shard.status == ShardStatus.QUEUED)
                      .values(status=ShardStatus.CANCELLED, updated_at=time.time()))
            rep.expired.append(b.id)
        s.flush()
        for b in due:
            if b.status == BatchStatus.VALIDATING or repo.unfinished_shards(s, b.id) == 0:
                rep.finalize.add(b.id)
