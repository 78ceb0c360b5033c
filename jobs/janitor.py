"""The janitor: periodic repairs that make worker deaths and deadlines harmless.

Run by the control worker every few seconds (``sweep``). It
- hands back shards whose lease expired (their worker was killed or lost) so
  another worker resumes them from the checkpoint — much sooner than the
  broker's visibility timeout would redeliver them — and fails a shard that has
  used up its attempts with a clear error instead of letting it loop;
- expires batches whose completion window has passed: queued shards stop at
  once, running ones at their next chunk, finished results are kept and the rest
  become ``batch_expired`` error lines.
Every change is a conditional UPDATE, so two janitors (or a janitor racing a
worker) cannot both act on the same shard.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy import select, update

from jobs import repository as repo
from jobs.context import Context
from jobs.models import Batch, Shard, now
from jobs.status import BatchStatus, ShardStatus


@dataclass
class SweepReport:
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    finalize: set[str] = field(default_factory=set)


def sweep(ctx: Context) -> SweepReport:
    rep = SweepReport()
    _expire_batches(ctx, rep)
    _repair_leases(ctx, rep)
    _resend_stranded(ctx, rep)
    tiers: dict[str, list[str]] = {}
    if rep.requeued:
        with ctx.db.session() as s:
            rows = s.execute(select(Shard.id, Batch.service_tier).join(
                Batch, Batch.id == Shard.batch_id).where(Shard.id.in_(rep.requeued)))
            for sid, tier in rows:
                tiers.setdefault(tier, []).append(sid)
    for tier, ids in tiers.items():
        ctx.dispatcher.shards(ids, tier)
    for batch_id in sorted(rep.finalize):
        ctx.dispatcher.finalize(batch_id)
    return rep


def _repair_leases(ctx: Context, rep: SweepReport) -> None:
    t = time.time()
    cap = ctx.settings.max_shard_attempts
    with ctx.db.session() as s:
        stale = list(s.scalars(select(Shard).where(
            Shard.status == ShardStatus.RUNNING, Shard.lease_expires_at < t)
            .with_for_update(skip_locked=True).limit(1000)))
        for sh in stale:
            if sh.attempt >= cap:
                sh.status = ShardStatus.FAILED
                sh.error = (f"gave up after {sh.attempt} attempts: each ended without "
                            "finishing (worker killed, lost or out of memory)")
                rep.failed.append(sh.id)
            else:
                sh.status = ShardStatus.QUEUED
                rep.requeued.append(sh.id)
            sh.lease_token, sh.lease_expires_at, sh.updated_at = None, None, t
        s.flush()
        for batch_id in {sh.batch_id for sh in stale if sh.status == ShardStatus.FAILED}:
            if repo.unfinished_shards(s, batch_id) == 0:
                rep.finalize.add(batch_id)


def _resend_stranded(ctx: Context, rep: SweepReport) -> None:
    """Queued shards nobody has touched for a while, while their lane's queue is empty:
    their message was lost (e.g. reserved by a worker that then stopped). Sending one
    again is safe: a claim of a shard someone holds or finished does nothing."""
    stale = time.time() - ctx.settings.stranded_shard_s
    with ctx.db.session() as s:
        rows = s.execute(select(Shard.id, Batch.service_tier).join(
            Batch, Batch.id == Shard.batch_id).where(
            Shard.status == ShardStatus.QUEUED, Shard.updated_at < stale,
            Batch.status == BatchStatus.IN_PROGRESS).limit(1000)).all()
        for sid, tier in rows:
            queue = "flex" if tier == "flex" else "batch"
            if ctx.redis.llen(queue) == 0:
                s.execute(update(Shard).where(Shard.id == sid)
                          .values(updated_at=time.time()))
                rep.requeued.append(sid)


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
