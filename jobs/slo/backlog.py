"""The batch lanes' scaling signal (``inferq_desired_workers{lane="batch"}`` and
``{lane="flex"}``): the fewest workers that finish the rows waiting and running in a
lane's shards before their batches' deadlines.

- **The work.** Each batch in progress on the lane (``batch``: every service tier but
  flex; ``flex``) has rows not yet committed in its queued and running shards
  (``rows - rows_done``) and a deadline, its ``expires_at`` (created + completion
  window). A batch whose deadline has passed is left out: the janitor expires it.
- **The rate.** A model worker runs one shard at a time, so a shard's rows committed
  by the attempt that holds it, over the time since that attempt claimed it
  (``rows_done / (updated_at - claimed_at)``; ``updated_at`` is its last checkpoint),
  is that worker's rows per second on that model, reading the shard, loading the
  model and writing the parts included. Per model, the lane's rate is the rows of
  every such shard over their seconds: shards of the lane's batches in progress,
  running or done, whose current attempt started from the beginning
  (``claimed_chunks = 0``) and has committed a chunk. A model none of whose shards has
  committed yet is assumed to run at ``INFERQ_BATCH_ROWS_PER_S`` per worker.
- **The count.** A batch's rows take ``rows / rate`` worker-seconds. With n workers
  taking the earliest deadline first (as fair dispatch does within a project),
  every deadline is met when, for each deadline d, the work due by d fits in
  n·(d - now): n is the largest ceil(work due by d / (d - now)) over the deadlines,
  and at least 1 while any row waits (rows of a batch without a deadline count
  there only). The work is treated as divisible among workers, as shards are many
  and small next to a batch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from jobs.batches.fairshare import lane_filter
from jobs.core.context import Context
from jobs.core.lanes import SHARD_LANES
from jobs.core.schema import Batch, Shard
from jobs.core.status import BatchStatus, ShardStatus


@dataclass(frozen=True)
class Due:
    """Rows of one batch not committed yet, and when they are due."""

    model: str
    rows: int
    deadline: float | None  # epoch seconds (the batch's expires_at); None: none


@dataclass(frozen=True)
class Rate:
    """Rows committed by shard attempts of one model, over the seconds they ran."""

    rows: int
    seconds: float

    @property
    def per_s(self) -> float:
        return self.rows / self.seconds


def workers_needed(due: Iterable[Due], rates: Mapping[str, float], default_rate: float,
                   now: float) -> int:
    """The fewest workers that commit every row in ``due`` by its deadline, each
    committing ``rates[model]`` rows per second (``default_rate`` for a model not in
    ``rates``), earliest deadline first; 0 when nothing is due."""
    work: list[tuple[float, float]] = []  # (deadline, worker-seconds)
    pending = False
    for d in due:
        if d.rows <= 0:
            continue
        pending = True
        if d.deadline is not None:
            work.append((d.deadline, d.rows / (rates.get(d.model) or default_rate)))
    if not pending:
        return 0
    need, total = 1, 0.0
    for deadline, seconds in sorted(work):
        total += seconds
        left = max(deadline - now, 1.0)
        need = max(need, math.ceil(total / left - 1e-9))
    return need


def _lane(lane: str) -> ColumnElement[bool]:
    if lane not in SHARD_LANES:
        raise ValueError(f"not a batch lane: {lane!r} (one of {', '.join(SHARD_LANES)})")
    return lane_filter(lane)


def backlog(s: Session, lane: str, now: float) -> list[Due]:
    """The rows waiting and running in ``lane``'s shards, per batch in progress whose
    deadline is still ahead."""
    q = (select(Batch.model, Batch.expires_at, func.sum(Shard.rows - Shard.rows_done))
         .join(Batch, Batch.id == Shard.batch_id)
         .where(Batch.status == BatchStatus.IN_PROGRESS, Batch.expired_at.is_(None),
                Batch.expires_at.is_(None) | (Batch.expires_at > now), _lane(lane),
                Shard.status.in_((ShardStatus.QUEUED, ShardStatus.RUNNING)))
         .group_by(Batch.id, Batch.model, Batch.expires_at))
    return [Due(model or "", int(rows or 0), None if expires is None else float(expires))
            for model, expires, rows in s.execute(q)]


def measured_rates(s: Session, lane: str) -> dict[str, Rate]:
    """Per model, the rows the lane's shard attempts committed and the seconds they
    took: attempts that started at a shard's first row and committed a chunk, in the
    lane's batches in progress."""
    q = (select(Batch.model, func.sum(Shard.rows_done),
                func.sum(Shard.updated_at - Shard.claimed_at))
         .join(Batch, Batch.id == Shard.batch_id)
         .where(Batch.status == BatchStatus.IN_PROGRESS, _lane(lane),
                Shard.status.in_((ShardStatus.RUNNING, ShardStatus.DONE)),
                Shard.claimed_chunks == 0, Shard.chunks_done > 0,
                Shard.claimed_at.is_not(None), Shard.updated_at > Shard.claimed_at)
         .group_by(Batch.model))
    return {model or "": Rate(int(rows), float(seconds)) for model, rows, seconds in s.execute(q)
            if rows and seconds}


@dataclass(frozen=True)
class Desired:
    lane: str
    workers: int
    due: list[Due]
    rates: dict[str, Rate]


def desired_workers(s: Session, lane: str, default_rate: float,
                    now: float | None = None) -> Desired:
    """The workers ``lane`` needs to meet its batches' deadlines at the measured rates."""
    t = time.time() if now is None else now
    due = backlog(s, lane, t)
    rates = measured_rates(s, lane)
    n = workers_needed(due, {m: r.per_s for m, r in rates.items()}, default_rate, t)
    return Desired(lane, n, due, rates)


def desired(ctx: Context) -> dict[str, int]:
    """Workers each batch lane needs now (``ctx``: the API process's Context)."""
    with ctx.db.session() as s:
        return {lane: desired_workers(s, lane, ctx.settings.batch_rows_per_s).workers
                for lane in SHARD_LANES}
