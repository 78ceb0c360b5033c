"""Celery tasks: thin, named, idempotent; each delegates to a plain function."""

from __future__ import annotations

from typing import Any

from celery import Task

from jobs import errors, finalize, service
from jobs.dispatch import TASK_FINALIZE, TASK_SHARD, TASK_VALIDATE
from workers.batch_lane import run_shard
from workers.celery_app import app, draining, process
from workers.runtime.token_count import Counter

# A backend that is down for a moment (PostgreSQL restarting, a broker reconnect, the
# object store unreachable) must not lose a batch's control step: retried with backoff
# and jitter, and the janitor sends it again if even that runs out. The same list
# decides, inside validate and finalize, what is retried rather than failing the batch.
TRANSIENT = errors.TRANSIENT
RETRY: dict[str, Any] = {"autoretry_for": TRANSIENT, "retry_backoff": 2,
                         "retry_backoff_max": 60, "retry_jitter": True, "max_retries": 8}


@app.task(name=TASK_VALIDATE, **RETRY)
def validate_batch(batch_id: str) -> None:
    ctx = process.context()  # prompt tokens counted with the model's tokenizer
    service.validate_batch(ctx, batch_id, count_tokens=Counter(ctx))


@app.task(name=TASK_FINALIZE, **RETRY)
def finalize_batch(batch_id: str) -> None:
    finalize.finalize_batch(process.context(), batch_id)


@app.task(name=TASK_SHARD, bind=True, **RETRY)
def process_shard(self: Task, shard_id: str) -> str:
    rt = process.runtime()  # built by the pool child at start; this only looks it up
    process.shard_consumers.hostname = self.request.hostname
    return run_shard(rt, shard_id, stop_requested=draining)
