"""What the dashboard shows (``GET /v1/dashboard/...``, ``inferq top``, the web page):
queue depths, live workers, the latency history and the batches of a project (a
project key) or of every project (the admin key), with their rate and time left.

Read only: queue depths and workers from Redis (the lists and heartbeats the API
routes by), latencies from the per-minute history (``jobs.slo.stats``), batches and
shards from PostgreSQL.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Literal, NamedTuple

import redis

from jobs.batches import queries as repo
from jobs.core import redis_keys, refs
from jobs.core.context import Context
from jobs.core.errors import InvalidRequest, NotFound, Unauthorized
from jobs.core.lanes import CELERY_LANES, JOBS, REALTIME
from jobs.core.schema import Batch, Shard
from jobs.core.status import BatchStatus, BreakerState
from jobs.fleet import heartbeats
from jobs.slo import stats
from jobs.tenants import auth
from jobs.tenants import queries as tenant_queries

WINDOW_DEFAULT_S, WINDOW_MIN_S, WINDOW_MAX_S = 3600, 60, 86400
MAX_BATCHES = 50
_DIGITS = re.compile(r"[0-9]{1,6}")


class Viewer(NamedTuple):
    """Who looks: one project (a project key) or the organization (the admin key)."""

    scope: Literal["project", "organization"]
    project_id: str | None


def viewer(ctx: Context, key: str | None) -> Viewer:
    """The viewer behind ``key``: a live project key, else an admin key, else 401."""
    try:
        return Viewer("project", auth.authenticate(ctx, key).tenant_id)
    except Unauthorized:
        if not key:
            raise
    with ctx.db.session() as s:
        admin = tenant_queries.admin_key_id(s, auth.hash_key(key))
    if admin is None:
        raise Unauthorized("Incorrect API key provided: use a project API key or the "
                           "admin key")
    return Viewer("organization", None)


def parse_window(raw: str | None) -> int:
    """The ``window`` query parameter: whole seconds, 60 to 86400 (default 3600)."""
    if raw is None:
        return WINDOW_DEFAULT_S
    if not _DIGITS.fullmatch(raw) or not WINDOW_MIN_S <= int(raw) <= WINDOW_MAX_S:
        raise InvalidRequest(f"window must be whole seconds from {WINDOW_MIN_S} to "
                             f"{WINDOW_MAX_S}", param="window")
    return int(raw)


class QueueDepth(NamedTuple):
    lane: str
    model: str | None  # the realtime lane has a list per model
    depth: int


def _keys(r: redis.Redis, pattern: str) -> set[str]:
    return {k.decode() if isinstance(k, bytes) else str(k)
            for k in r.scan_iter(match=pattern, count=200)}


def queue_depths(r: redis.Redis) -> list[QueueDepth]:
    """Messages waiting on each lane's Redis lists: the Celery queues of control, batch
    and flex (every priority, every model version's queue of a lane summed), the jobs
    lists (summed) and the realtime lists of each model (its versions' summed; those
    live workers hold are listed even when empty). One pipeline of LLENs and a few
    SCANs."""
    rt_keys = sorted(_keys(r, redis_keys.REALTIME_QUEUE + ":*")
                     | {redis_keys.realtime_queue(m) for w in heartbeats.live_workers(r, REALTIME)
                        for m in w.get("resident", w.get("models", []))})
    lane_keys = {q: sorted({*redis_keys.celery_lists(q)} | _keys(r, q + ".*"))
                 for q in CELERY_LANES}
    job_keys = sorted({redis_keys.JOBS_QUEUE} | _keys(r, redis_keys.JOBS_QUEUE + ":*"))
    with r.pipeline(transaction=False) as p:
        for q in CELERY_LANES:
            for k in lane_keys[q]:
                p.llen(k)
        for k in job_keys:
            p.llen(k)
        for k in rt_keys:
            p.llen(k)
        lengths = list(p.execute())
    out = []
    for q in CELERY_LANES:
        n = len(lane_keys[q])
        out.append(QueueDepth(q, None, sum(lengths[:n])))
        del lengths[:n]
    out.append(QueueDepth(JOBS, None, sum(lengths[:len(job_keys)])))
    del lengths[:len(job_keys)]
    by_model: dict[str, int] = {}  # a model's versions' lists and its name's, summed
    for k, length in zip(rt_keys, lengths, strict=True):
        name = refs.split_ref(k[len(redis_keys.REALTIME_QUEUE) + 1:])[0]
        by_model[name] = by_model.get(name, 0) + int(length)
    out += [QueueDepth(REALTIME, name, n) for name, n in by_model.items()]
    return sorted(out, key=lambda d: (stats.LANE_ORDER.index(d.lane), d.model or ""))


@dataclass(frozen=True)
class Worker:
    name: str
    lanes: list[str]
    models: list[str]
    breaker: str  # a control worker has no breaker: closed
    metrics_url: str | None
    seen_s_ago: float


def workers(r: redis.Redis, now: float) -> list[Worker]:
    """Every worker with a current heartbeat, by name."""
    out = [Worker(str(h.get("name", "")), sorted(h.get("lanes", [])), list(h.get("models", [])),
                  str(h.get("breaker") or BreakerState.CLOSED), h.get("metrics_url"),
                  round(max(0.0, now - float(h.get("at", now))), 1))
           for h in heartbeats.current(r)]
    return sorted(out, key=lambda w: w.name)


@dataclass(frozen=True)
class BatchProgress:
    """A batch with its counts (``sums``: its shards'), and, while it runs, its rate
    (requests done ÷ seconds since in_progress) and the seconds left at that rate."""

    batch: Batch
    sums: repo.ShardSums
    rate_per_s: float | None
    eta_s: float | None


def progress_of(b: Batch, sums: repo.ShardSums, now: float) -> BatchProgress:
    done = sums.completed + sums.failed
    rate = eta = None
    if b.status == BatchStatus.IN_PROGRESS and b.in_progress_at is not None:
        elapsed = now - b.in_progress_at
        if elapsed > 0:
            rate = round(done / elapsed, 3)
            left = max(0, b.total - done - b.invalid)
            eta = round(left / rate, 1) if rate > 0 else None
    return BatchProgress(b, sums, rate, eta)


@dataclass(frozen=True)
class Overview:
    viewer: Viewer
    generated_at: int
    window_s: int
    lanes: list[QueueDepth]
    workers: list[Worker]
    latency: list[stats.Series]
    batches: list[BatchProgress]


def overview(ctx: Context, who: Viewer, window_s: int, now: float | None = None) -> Overview:
    """The dashboard's front page: queues, workers, latencies over ``window_s``, and the
    viewer's batches that are running or were created within the window (newest first,
    at most ``MAX_BATCHES``)."""
    now = time.time() if now is None else now
    r = ctx.redis
    lanes, live, latency = queue_depths(r), workers(r, now), stats.history(r, window_s, now)
    with ctx.db.session() as s:
        rows = repo.recent_batches(s, who.project_id, int(now) - window_s, MAX_BATCHES)
        sums = repo.shard_sums(s, [b.id for b in rows])
    batches = [progress_of(b, sums.get(b.id, repo.ShardSums()), now) for b in rows]
    return Overview(who, int(now), window_s, lanes, live, latency, batches)


def batch_detail(ctx: Context, who: Viewer, batch_id: str,
                 now: float | None = None) -> tuple[BatchProgress, list[Shard]]:
    """One batch and its shards, in order; another project's batch is not found."""
    now = time.time() if now is None else now
    with ctx.db.session() as s:
        b = repo.get_batch(s, who.project_id, batch_id)
        if b is None:
            raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
        sums = repo.shard_sums(s, [b.id]).get(b.id, repo.ShardSums())
        shards = repo.shards_of(s, b.id)
    return progress_of(b, sums, now), shards
