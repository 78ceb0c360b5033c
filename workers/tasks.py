"""Celery tasks: thin, named, idempotent; each delegates to a plain function."""

from __future__ import annotations

from jobs import finalize, service
from jobs.dispatch import TASK_FINALIZE, TASK_SHARD, TASK_VALIDATE
from workers.celery_app import app, settings, start_model_runtime, state


@app.task(name=TASK_VALIDATE)
def validate_batch(batch_id: str) -> None:
    service.validate_batch(state.context(), batch_id)


@app.task(name=TASK_FINALIZE)
def finalize_batch(batch_id: str) -> None:
    finalize.finalize_batch(state.context(), batch_id)


@app.task(name=TASK_SHARD)
def process_shard(shard_id: str) -> str:
    from workers import lanes, pipeline

    start_model_runtime(settings)  # no-op once the pool child has loaded it
    ctx = state.context()
    result = pipeline.process_shard(ctx, state.runner_for, shard_id, lanes.worker_name())
    if result.finalize:
        ctx.dispatcher.finalize(shard_id.rsplit(".", 1)[0])
    return result.outcome
