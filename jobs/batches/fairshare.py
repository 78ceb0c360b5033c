"""Fair share of the batch lanes: which waiting shard goes to the broker next.

Validation inserts shards *waiting* (``shards.dispatched_at`` NULL) instead of sending
them all. ``dispatch(ctx, lane)`` keeps the lane's broker queue (``batch``, ``flex``)
shallow: the shards dispatched and not finished (queued on the broker, or running)
are held at the lane's live worker slots (their heartbeats) plus
``INFERQ_DISPATCH_MARGIN``, and each free place goes to the next shard that
weighted deficit round robin picks:

- across projects, DRR (Shreedhar and Varghese): the projects with waiting shards
  form a round; the project whose turn it is gets ``quantum x weight`` rows of
  credit (``tenants.weight``) and sends shards while its credit covers the next
  one's rows, then goes to the back of the round; a project that runs out of
  waiting shards leaves it and its credit is dropped. The cost of a shard is its
  rows and the quantum is ``INFERQ_SHARD_ROWS``: one full shard per turn per unit
  of weight, the smallest quantum that still sends at least one shard per turn (so
  a turn costs O(1)), and the finest interleaving; a batch's smaller last shard
  costs what it holds.
- within a project, earliest deadline first (``batches.expires_at``), then the
  older batch, then shard order.

It runs after validation, whenever a shard task ends (the worker calls it before
acknowledging the message), and on every janitor sweep, so a lost trigger only
delays. Decisions are serialised per lane by a PostgreSQL advisory transaction
lock, and the round (each project's credit and place) lives in
``dispatch_deficits``, written in the same transaction as the shards'
``dispatched_at``: concurrent dispatchers (control workers, model workers) never
overfill a queue or hand out a turn twice, and a restart resumes the round.
Messages are sent after the commit; a send that fails marks its shards
``updated_at = 0`` so the janitor's next sweep sends them (as for its own sends).

With ``INFERQ_FAIR_DISPATCH=false`` every shard is sent at validation, oldest
batch first (FIFO), and ``dispatch`` only sends what is still waiting.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import delete, func, literal, select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from jobs.core import refs
from jobs.core.context import Context
from jobs.core.dispatch import shard_ref
from jobs.core.lanes import FLEX, FLEX_TIER, SHARD_LANES, lane_for
from jobs.core.schema import Batch, DispatchDeficit, Shard, Tenant
from jobs.core.status import BatchStatus, ShardStatus
from jobs.fleet import placement
from jobs.fleet.heartbeats import live_workers

log = logging.getLogger("inferq.fairshare")

# pg_advisory_xact_lock(class, id): one lock per lane serialises its decisions.
LOCK_CLASS = 7405
LOCK_IDS = {lane: i + 1 for i, lane in enumerate(SHARD_LANES)}
NO_DEADLINE = 2**62


# The choice: a pure function over the waiting shards and the round ------------------


@dataclass(frozen=True)
class Candidate:
    """A waiting shard as the choice sees it."""

    shard_id: str
    tenant_id: str
    rows: int
    deadline: int  # its batch's expires_at (epoch seconds)
    batch_id: str
    index: int


@dataclass(frozen=True)
class Turn:
    """A project's place in a lane's round: its unspent credit (rows) and its position
    (lower goes first; the project at the lowest position is the one whose turn it is)."""

    deficit: int
    position: int


@dataclass
class Selection:
    chosen: list[Candidate]
    round: dict[str, Turn]  # the projects still waiting, in their new order


def select_shards(candidates: Iterable[Candidate], round_: Mapping[str, Turn],
                  weights: Mapping[str, int], quantum: int, n: int) -> Selection:
    """Choose up to ``n`` shards by weighted deficit round robin across projects and
    earliest deadline first within one; returns them in sending order and the round
    after them.

    ``candidates`` must hold every project's waiting shards, or at least its first
    ``n + 1`` in deadline order: a project is taken out of the round (its credit
    dropped) when it has no candidate left. ``round_`` is the previous call's round;
    projects not in it join at the back, in the order of their first shard.
    A project whose turn is cut short by ``n`` keeps its credit and its turn."""
    if quantum < 1:
        raise ValueError("the quantum must be at least one row")
    queues: dict[str, deque[Candidate]] = {}
    for c in sorted(candidates, key=lambda c: (c.deadline, c.batch_id, c.index)):
        queues.setdefault(c.tenant_id, deque()).append(c)
    known = sorted((t for t in queues if t in round_), key=lambda t: round_[t].position)
    order = deque(known + [t for t in queues if t not in round_])
    credit = {t: round_[t].deficit if t in round_ else 0 for t in queues}
    chosen: list[Candidate] = []
    while order and len(chosen) < n:
        t = order[0]
        q = queues[t]
        if credit[t] < q[0].rows:  # a new turn: this project's quantum
            credit[t] += quantum * max(1, weights.get(t, 1))
        while q and len(chosen) < n and q[0].rows <= credit[t]:
            c = q.popleft()
            credit[t] -= c.rows
            chosen.append(c)
        if not q:  # nothing left waiting: out of the round, credit dropped
            order.popleft()
            del credit[t]
        elif q[0].rows > credit[t]:  # turn over: to the back of the round
            order.rotate(-1)
        # otherwise n cut the turn short: it goes on at the next call
    return Selection(chosen, {t: Turn(credit[t], i) for i, t in enumerate(order)})


# The database side ------------------------------------------------------------------


def lane_filter(lane: str) -> ColumnElement[bool]:
    return (Batch.service_tier == FLEX_TIER if lane == FLEX
            else Batch.service_tier != FLEX_TIER)


def slots(ctx: Context, lane: str) -> int:
    """Live worker slots consuming ``lane``: one per model worker process whose
    heartbeat is current and whose circuit breaker is not open."""
    return len(live_workers(ctx.redis, lane))


def in_flight(s: Session, lane: str) -> int:
    """Shards of the lane sent to the broker and not finished: waiting there (or held
    back by a retry's countdown) or running."""
    sent = (Shard.status == ShardStatus.RUNNING) | (
        (Shard.status == ShardStatus.QUEUED) & Shard.dispatched_at.is_not(None))
    return int(s.scalar(
        select(func.count()).select_from(Shard).join(Batch, Batch.id == Shard.batch_id)
        .where(sent, lane_filter(lane))) or 0)


def waiting(s: Session, lane: str, per_project: int | None) -> list[Candidate]:
    """The lane's waiting shards of batches in progress: each project's first
    ``per_project`` by deadline (all of them for None)."""
    deadline = func.coalesce(Batch.expires_at, literal(NO_DEADLINE))
    rank = func.row_number().over(partition_by=Batch.tenant_id,
                                  order_by=(deadline, Shard.batch_id, Shard.index))
    inner = (select(Shard.id, Batch.tenant_id, Shard.rows, deadline.label("deadline"),
                    Shard.batch_id, Shard.index, rank.label("rank"))
             .join(Batch, Batch.id == Shard.batch_id)
             .where(Shard.dispatched_at.is_(None), Shard.status == ShardStatus.QUEUED,
                    Batch.status == BatchStatus.IN_PROGRESS, Batch.expired_at.is_(None),
                    lane_filter(lane))
             .subquery())
    q = select(inner.c.id, inner.c.tenant_id, inner.c.rows, inner.c.deadline,
               inner.c.batch_id, inner.c.index)
    if per_project is not None:
        q = q.where(inner.c.rank <= per_project)
    return [Candidate(*row) for row in s.execute(q)]


def load_round(s: Session, lane: str) -> dict[str, Turn]:
    return {t: Turn(d, p) for t, d, p in s.execute(
        select(DispatchDeficit.tenant_id, DispatchDeficit.deficit, DispatchDeficit.position)
        .where(DispatchDeficit.lane == lane))}


def save_round(s: Session, lane: str, round_: Mapping[str, Turn]) -> None:
    s.execute(delete(DispatchDeficit).where(DispatchDeficit.lane == lane))
    s.add_all(DispatchDeficit(lane=lane, tenant_id=t, deficit=turn.deficit,
                              position=turn.position) for t, turn in round_.items())


def _lock(s: Session, lane: str) -> None:
    s.execute(select(func.pg_advisory_xact_lock(LOCK_CLASS, LOCK_IDS[lane])))


def _mark_dispatched(s: Session, ids: list[str], t: float) -> list[str]:
    if not ids:
        return []
    return list(s.scalars(update(Shard).where(
        Shard.id.in_(ids), Shard.dispatched_at.is_(None), Shard.status == ShardStatus.QUEUED)
        .values(dispatched_at=t, updated_at=t).returning(Shard.id)))


def dispatch(ctx: Context, lane: str) -> list[str]:
    """Send the lane's next shards, as many as its queue has room for; their ids."""
    st = ctx.settings
    t = time.time()
    if not st.fair_dispatch:
        with ctx.db.session() as s:
            _lock(s, lane)
            cands = sorted(waiting(s, lane, None), key=lambda c: (c.batch_id, c.index))
            ids = _mark_dispatched(s, [c.shard_id for c in cands], t)
    else:
        depth = slots(ctx, lane) + st.dispatch_margin  # read before taking the lock
        with ctx.db.session() as s:
            _lock(s, lane)
            room = depth - in_flight(s, lane)
            if room <= 0:
                return []
            cands = waiting(s, lane, room + 1)
            round_ = load_round(s, lane)
            tenants = {c.tenant_id for c in cands}
            weights = dict(s.execute(select(Tenant.id, Tenant.weight)
                                     .where(Tenant.id.in_(tenants))).tuples().all()
                           ) if tenants else {}
            sel = select_shards(cands, round_, weights, st.shard_rows, room)
            ids = _mark_dispatched(s, [c.shard_id for c in sel.chosen], t)
            if sel.round != round_:
                save_round(s, lane, sel.round)
        # keep the order of the choice (the update returns in any order)
        order = {c.shard_id: i for i, c in enumerate(sel.chosen)}
        ids.sort(key=order.__getitem__)
    if ids:
        try:
            enqueue_shards(ctx, ids)
        except Exception:
            # The broker is unreachable: the janitor's next sweep that reaches it sends
            # these at once (a dispatched, queued shard with updated_at 0).
            with ctx.db.session() as s:
                s.execute(update(Shard).where(Shard.id.in_(ids),
                                              Shard.status == ShardStatus.QUEUED)
                          .values(updated_at=0.0))
            raise
    return ids


def dispatch_all(ctx: Context) -> list[str]:
    """``dispatch`` on every shard lane (the janitor's sweep)."""
    out: list[str] = []
    for lane in SHARD_LANES:
        out += dispatch(ctx, lane)
    return out


def dispatch_quietly(ctx: Context, lane: str) -> None:
    """``dispatch`` where a failure must not fail the caller (a shard task that has
    done its work): the janitor's next sweep dispatches instead."""
    try:
        dispatch(ctx, lane)
    except Exception as e:  # noqa: BLE001 - only delays: the janitor dispatches too
        log.warning("dispatch on lane %s failed (the janitor will): %s", lane, e)


def new_shards_dispatched_at(ctx: Context) -> float | None:
    """``dispatched_at`` of the shards validation inserts: waiting (None) under fair
    dispatch, sent at once otherwise."""
    return None if ctx.settings.fair_dispatch else time.time()


def after_validation(ctx: Context, shard_ids: list[str], tier: str) -> None:
    """The sends validation's commit made valid: the lane's next shards under fair
    dispatch (a failure leaves them waiting for the janitor), all of them otherwise."""
    if ctx.settings.fair_dispatch:
        dispatch_quietly(ctx, lane_for(tier))
    else:
        enqueue_shards(ctx, shard_ids)


def enqueue_shards(ctx: Context, shard_ids: list[str]) -> None:
    """Send shards (in the order given) to the queues of their lane and pinned model
    version; a version that no live worker of the lane holds is placed on one first
    (jobs.fleet.placement), its shards waiting on its queue meanwhile. A version that cannot
    be placed (no worker has room, or its load failed) has its shards sent to the
    lane's common queue, where a worker answers each row with a 503
    ``model_not_loaded`` line."""
    with ctx.db.session() as s:
        rows = {sid: (tier, shard_ref(model, version)) for sid, tier, model, version in
                s.execute(select(Shard.id, Batch.service_tier, Batch.model,
                                 Batch.model_version)
                          .join(Batch, Batch.id == Shard.batch_id)
                          .where(Shard.id.in_(shard_ids)))}
    groups: dict[tuple[str, str | None], list[str]] = {}
    for sid in shard_ids:
        if sid in rows:
            groups.setdefault(rows[sid], []).append(sid)
    for (tier, model_ref), ids in groups.items():
        ctx.dispatcher.shards(ids, tier, model_ref if placeable(ctx, model_ref, tier) else None)


def placeable(ctx: Context, model_ref: str | None, tier: str) -> bool:
    """Whether a live worker of the tier's lane holds ``model_ref`` or will (placed)."""
    if model_ref is None or "@" not in model_ref:
        return False
    try:
        return placement.ensure(ctx, model_ref, lane_for(tier))
    except Exception as e:  # noqa: BLE001 - sent to the version's queue: the janitor retries
        log.warning("placement of %s failed: %s", model_ref, e)
        return True


def load_failed(ctx: Context, model_ref: str) -> None:
    """A worker could not load ``model_ref`` (``name@version``): its shards already sent
    to its queue are sent again, to their lane's common queue, where a worker refuses
    them with the batch's own error; the message left behind is a no-op."""
    name, version = refs.split_ref(model_ref)
    if version is None:
        return
    with ctx.db.session() as s:
        ids = list(s.scalars(select(Shard.id).join(Batch, Batch.id == Shard.batch_id).where(
            Batch.model == name, Batch.model_version == version,
            Shard.status == ShardStatus.QUEUED, Shard.dispatched_at.is_not(None))))
    if ids:
        enqueue_shards(ctx, ids)
