"""Jobs are durable before they are acknowledged and survive a worker that dies
holding them: an expired lease sends them back to the queue, and a second claim
with another token runs them once more (attempt 2); the dead holder is fenced off."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import update

from jobs.asyncjobs import lifecycle as asyncjobs
from jobs.core import redis_keys
from jobs.core.context import Context
from jobs.core.schema import Job
from jobs.core.settings import Settings
from jobs.fleet import builtin_models
from jobs.tenants import auth


@pytest.fixture
def jctx(own_settings: Settings) -> Iterator[Context]:
    """A database and a Redis DB of its own: a running stack's workers and janitor
    must neither take these jobs from the queue nor recover them from the table."""
    c = Context(own_settings)
    yield c
    c.close()


@pytest.fixture
def tenant(jctx: Context) -> str:
    builtin_models.register_builtin_models(jctx)
    return auth.authenticate(jctx, auth.create_tenant(jctx, "jobs")[1]).tenant_id


def test_a_job_left_by_a_dead_worker_runs_again(jctx: Context, tenant: str) -> None:
    job = asyncjobs.create(jctx, tenant, "/v1/embeddings",
                           {"model": "all-MiniLM-L6-v2", "input": "hello"})
    with jctx.db.session() as s:
        assert s.get(Job, job.id).status == "queued"  # stored before acknowledged
    queue = redis_keys.jobs_queue(asyncjobs.job_ref(job))  # no live worker: its version's
    assert jctx.redis.lrem(queue, 0, job.id) == 1  # "worker A" pops it
    first = asyncjobs.claim(jctx, [job.id], "worker-a", "token-a", ttl_s=30)
    assert [j.id for j in first] == [job.id] and first[0].attempt == 1
    assert asyncjobs.claim(jctx, [job.id], "worker-b", "token-b", ttl_s=30) == []  # leased
    with jctx.db.session() as s:  # worker A died; its lease runs out
        s.execute(update(Job).where(Job.id == job.id).values(lease_expires_at=0))
    assert job.id in asyncjobs.recover(jctx)
    assert jctx.redis.lrange(queue, 0, -1) == [job.id.encode()]
    again = asyncjobs.claim(jctx, [job.id], "worker-b", "token-b", ttl_s=30)
    assert [j.attempt for j in again] == [2]
    assert not asyncjobs.complete(jctx, job.id, "token-a", {"late": True}, None)  # fenced
    assert asyncjobs.complete(jctx, job.id, "token-b", {"ok": True}, None)
    done = asyncjobs.get(jctx, tenant, job.id)
    assert (done.status, done.result) == ("completed", {"ok": True})


def test_a_lost_push_is_recovered_when_the_queue_is_empty(jctx: Context,
                                                          tenant: str) -> None:
    job = asyncjobs.create(jctx, tenant, "/v1/embeddings",
                           {"model": "all-MiniLM-L6-v2", "input": "lost"})
    jctx.redis.delete(redis_keys.jobs_queue(asyncjobs.job_ref(job)))  # e.g. Redis lost it
    assert asyncjobs.queued_anywhere(jctx) == 0
    assert job.id not in asyncjobs.recover(jctx, stale_queued_s=60)  # not old yet
    assert job.id in asyncjobs.recover(jctx, stale_queued_s=-1)
