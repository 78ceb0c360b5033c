"""Celery tasks: thin, named, idempotent; each delegates to a plain function."""

from __future__ import annotations

from celery import Task

from jobs import finalize, service
from jobs.dispatch import TASK_FINALIZE, TASK_SHARD, TASK_VALIDATE
from workers.celery_app import app, draining, settings, start_model_runtime, state


@app.task(name=TASK_VALIDATE)
def validate_batch(batch_id: str) -> None:
    service.validate_batch(state.context(), batch_id)


@app.task(name=TASK_FINALIZE)
def finalize_batch(batch_id: str) -> None:
    finalize.finalize_batch(state.context(), batch_id)


@app.task(name=TASK_SHARD, bind=True)
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
