"""Celery tasks: thin, named, idempotent; each delegates to a plain function."""

from __future__ import annotations

from typing import Any

import redis
from celery import Task
from sqlalchemy.exc import InterfaceError, OperationalError

from jobs import finalize, service
from jobs.dispatch import TASK_FINALIZE, TASK_SHARD, TASK_VALIDATE
from workers.celery_app import app, draining, settings, start_model_runtime, state

# A backend that is down for a moment (PostgreSQL restarting, a broker reconnect)
# must not lose a batch's control step: retried with backoff and jitter, and the
# janitor sends it again if even that runs out.
TRANSIENT = (OperationalError, InterfaceError, redis.ConnectionError, redis.TimeoutError)
RETRY: dict[str, Any] = {"autoretry_for": TRANSIENT, "retry_backoff": 2,
                         "retry_backoff_max": 60, "retry_jitter": True, "max_retries": 8}


@app.task(name=TASK_VALIDATE, **RETRY)
def validate_batch(batch_id: str) -> None:
    service.validate_batch(state.context(), batch_id)


@app.task(name=TASK_FINALIZE, **RETRY)
def finalize_batch(batch_id: str) -> None:
    finalize.finalize_batch(state.context(), batch_id)


@app.task(name=TASK_SHARD, bind=True, **RETRY)
def process_shard(self: Task, shard_id: str) -> str:
    from workers import lanes, pipeline

    start_model_runtime(settings)  # no-op once the pool child has loaded it
    state.hostname = self.request.hostname
    ctx = state.context()
    result = pipeline.process_shard(ctx, state.runner_for, shard_id, lanes.worker_name(),
                                    stop_requested=draining, healthy=state.breaker.allow)
    batch_id = shard_id.rsplit(".", 1)[0]
    if result.finalize:
        ctx.dispatcher.finalize(batch_id)
    elif result.outcome in ("handed_back", "retry"):  # another worker resumes it
        ctx.dispatcher.shards([shard_id], state.tier(batch_id), countdown=result.retry_in_s)
    return result.outcome
