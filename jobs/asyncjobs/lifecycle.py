"""Single asynchronous requests (``POST /v1/jobs``): durable in PostgreSQL before they
are acknowledged, handed to workers through a Redis list, coalesced there with
other jobs into engine batches, and recovered if a worker dies holding them."""

from __future__ import annotations

import logging
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import or_, select, update

from jobs.core import lanes, redis_keys, refs
from jobs.core.context import Context
from jobs.core.errors import InvalidRequest, NotFound
from jobs.core.schema import Job, new_id, now
from jobs.core.status import JobStatus
from jobs.fleet import catalog, placement, rollout
from jobs.protocol.endpoints import EMBEDDINGS, ENDPOINTS, RESPONSES
from jobs.protocol.parsing import parse_embeddings, parse_generation, parse_responses
from jobs.tenants import limits, token_counts, usage
from jobs.webhooks import events as webhooks

log = logging.getLogger("inferq.jobs")

def job_ref(job: Job) -> str:
    return refs.model_ref(str(job.body.get("model", "")), job.model_version)


def push(ctx: Context, jobs: list[Job]) -> None:
    """Put jobs on their version's list; a version no live jobs worker holds is placed
    on one first (jobs.fleet.placement): its jobs wait on its list meanwhile. Jobs for a
    version that cannot be placed go on the common list (``redis_keys.JOBS_QUEUE``),
    which every jobs worker also takes from: it refuses them (503 ``model_not_loaded``)."""
    by_ref: dict[str, list[str]] = {}
    for j in jobs:
        by_ref.setdefault(job_ref(j), []).append(j.id)
    for ref, ids in by_ref.items():
        placed = "@" in ref and placement.ensure(ctx, ref, lanes.JOBS)
        ctx.redis.rpush(redis_keys.jobs_queue(ref) if placed else redis_keys.JOBS_QUEUE, *ids)


def place_waiting(ctx: Context) -> list[str]:
    """Decide again for every version whose list has jobs waiting (each janitor sweep):
    one no live jobs worker holds is placed (``jobs.fleet.placement.ensure``), and the jobs
    of one that cannot be had go to the common list, to be refused there. A job pushed
    while no jobs worker was live, placed on a worker that died before loading, or
    pushed just before its version's load failed is thus placed or refused within a
    sweep of a jobs worker being live. Returns the versions whose jobs went to the
    common list."""
    r = ctx.redis
    refused: list[str] = []
    for key in list(r.scan_iter(match=redis_keys.JOBS_QUEUE + ":*", count=100)):
        name = key.decode() if isinstance(key, bytes) else str(key)
        ref = redis_keys.queued_model(name)
        if "@" not in ref or placement.ensure(ctx, ref, lanes.JOBS):
            continue
        n = 0
        while r.lmove(name, redis_keys.JOBS_QUEUE, "LEFT", "RIGHT"):
            n += 1
        log.info("%d jobs for %s sent to the common list: it cannot be placed", n, ref)
        refused.append(ref)
    return refused


def queued_anywhere(ctx: Context) -> int:
    """Job ids waiting on any version's list."""
    common = redis_keys.JOBS_QUEUE
    keys = [common, *ctx.redis.scan_iter(match=common + ":*", count=100)]
    with ctx.redis.pipeline() as p:
        for k in keys:
            p.llen(k)
        return sum(int(n) for n in p.execute()) if keys else 0


class JobCreate(BaseModel):
    """The body of ``POST /v1/jobs``; ``body`` is judged by its endpoint's own model."""

    model_config = ConfigDict(strict=True, extra="forbid")

    endpoint: str = Field(max_length=64)
    body: dict[str, Any]
    callback_url: str | None = Field(default=None, max_length=2048)


def validate(ctx: Context, endpoint: str, body: Any) -> dict[str, Any]:
    if endpoint not in ENDPOINTS:
        raise InvalidRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}", param="endpoint")
    if endpoint == EMBEDDINGS:
        return parse_embeddings(body, ctx.settings.max_embedding_inputs,
                                catalog.cached(ctx)).model_dump(
            exclude_none=True)
    if endpoint == RESPONSES:  # run as a chat request (jobs.protocol.responses_request.chat_body)
        resp = parse_responses(body, catalog.cached(ctx))
        if resp.stream:
            raise InvalidRequest("a job is answered asynchronously; stream must be false",
                                 param="body.stream")
        return resp.model_dump(exclude_none=True)
    req = parse_generation(endpoint, body, catalog.cached(ctx))
    if req.stream:
        raise InvalidRequest("a job is answered asynchronously; stream must be false",
                             param="body.stream")
    return req.model_dump(exclude_none=True)


def create(ctx: Context, tenant_id: str, endpoint: str, body: Any,
           callback_url: str | None = None, api_key_id: str | None = None,
           job_id: str | None = None) -> Job:
    """Validate a job's body, store the job and push its id (``store``)."""
    return store(ctx, tenant_id, endpoint, validate(ctx, endpoint, body), callback_url,
                 api_key_id, job_id)


def store(ctx: Context, tenant_id: str, endpoint: str, clean: dict[str, Any],
          callback_url: str | None = None, api_key_id: str | None = None,
          job_id: str | None = None) -> Job:
    """Store a job whose body ``validate`` returned (with the key that created it: its
    usage is billed to it) and push its id. A body naming ``name@version`` is stored
    naming ``name``, routed to that version; otherwise a canary takes its share."""
    name, named = refs.split_ref(clean["model"])
    version = rollout.route(ctx, name, named).version
    clean = {**clean, "model": name}
    job = Job(id=job_id or new_id("job_"), tenant_id=tenant_id, api_key_id=api_key_id,
              endpoint=endpoint, body=clean, status=JobStatus.QUEUED,
              callback_url=callback_url, created_at=now(), model_version=version)
    with ctx.db.session() as s:
        s.add(job)
    push(ctx, [job])  # after the commit: a lost push is recovered by workers
    return job


def get(ctx: Context, tenant_id: str, job_id: str) -> Job:
    with ctx.db.session() as s:
        job = s.scalar(select(Job).where(Job.id == job_id, Job.tenant_id == tenant_id))
    if job is None:
        raise NotFound(f"No such job: {job_id}", param="job_id")
    return job


# Worker side -------------------------------------------------------------------------------


def claim(ctx: Context, job_ids: list[str], worker: str, token: str, ttl_s: float
          ) -> list[Job]:
    """Take queued jobs (or running ones whose lease expired); duplicates are skipped."""
    t = time.time()
    with ctx.db.session() as s:
        rows = s.scalars(
            update(Job)
            .where(Job.id.in_(job_ids),
                   or_(Job.status == JobStatus.QUEUED,
                       (Job.status == JobStatus.RUNNING) & (Job.lease_expires_at < t)))
            .values(status=JobStatus.RUNNING, attempt=Job.attempt + 1, lease_token=token,
                    lease_expires_at=t + ttl_s, worker=worker,
                    started_at=int(t))
            .returning(Job)
        ).all()
        return list(rows)


def complete(ctx: Context, job_id: str, token: str, result: dict[str, Any] | None,
             error: dict[str, Any] | None, bill: usage.Entry | None = None) -> bool:
    """Store the job's outcome if ``token`` still holds its lease; ``bill`` (its usage
    record) and its webhook event are written in the same transaction, only when the
    outcome was stored."""
    with ctx.db.session() as s:
        res = s.execute(update(Job).where(Job.id == job_id, Job.lease_token == token)
                        .values(status=JobStatus.FAILED if error else JobStatus.COMPLETED,
                                result=result, error=error, completed_at=now(), lease_token=None,
                                lease_expires_at=None)
                        .returning(Job.tenant_id, Job.body, Job.status, Job.callback_url))
        row = res.first()
        stored = row is not None
        if stored and bill is not None and error is None:
            usage.record(s, bill)
        if row is not None:
            webhooks.job_ended(ctx, s, row.tenant_id, job_id, row.status, row.callback_url)
    if row is not None:  # its tokens-per-minute reservation becomes what it really used
        real = token_counts.usage_tokens((result or {}).get("usage")) if error is None else 0
        if real is not None and isinstance(row.body.get("model"), str):
            limits.settle_member(ctx, row.tenant_id, row.body["model"], job_id, real)
    return stored


def renew(ctx: Context, token: str, ttl_s: float, job_ids: list[str]) -> int:
    """Extend the leases of ``job_ids``, the jobs a consumer still has in flight under
    ``token`` (a job it let go lapses and is recovered); returns how many."""
    if not job_ids:
        return 0
    with ctx.db.session() as s:
        res = s.execute(update(Job).where(Job.id.in_(job_ids), Job.lease_token == token,
                                          Job.status == JobStatus.RUNNING)
                        .values(lease_expires_at=time.time() + ttl_s))
        return int(res.rowcount)  # type: ignore[attr-defined]


def recover(ctx: Context, stale_queued_s: float = 30) -> list[str]:
    """Jobs to push again: running under an expired lease, or queued for too long
    (their push was lost, e.g. Redis restarted). Claims stay conditional, so a job
    pushed twice still runs once."""
    t = time.time()
    lost: Any = (Job.status == JobStatus.RUNNING) & (Job.lease_expires_at < t)
    if queued_anywhere(ctx) == 0:  # nothing in flight, so old queued jobs were dropped
        lost = or_(lost, (Job.status == JobStatus.QUEUED)
                   & (Job.created_at < int(t - stale_queued_s)))
    with ctx.db.session() as s:
        jobs = list(s.scalars(select(Job).where(lost).limit(1000)))
    if jobs:
        push(ctx, jobs)
    return [j.id for j in jobs]
