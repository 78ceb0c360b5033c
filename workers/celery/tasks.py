"""Celery tasks: thin, named, idempotent; each delegates to a plain function."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Task
from opentelemetry.trace import SpanKind

from jobs.batches import finalize, service
from jobs.core import errors, logs, refs, tracing
from jobs.core.dispatch import TASK_FINALIZE, TASK_SHARD, TASK_VALIDATE
from workers.celery.app import app, draining, process
from workers.lanes.batch import run_shard
from workers.models.token_count import Counter

# A backend that is down for a moment (PostgreSQL restarting, a broker reconnect, the
# object store unreachable) must not lose a batch's control step: retried with backoff
# and jitter, and the janitor sends it again if even that runs out. The same list
# decides, inside validate and finalize, what is retried rather than failing the batch.
TRANSIENT = errors.TRANSIENT
RETRY: dict[str, Any] = {"autoretry_for": TRANSIENT, "retry_backoff": 2,
                         "retry_backoff_max": 60, "retry_jitter": True, "max_retries": 8}


@contextmanager
def traced(task: Task, batch_id: str, shard_id: str | None = None) -> Iterator[None]:
    """The task's span (CONSUMER, child of the span that sent the message: its
    ``traceparent`` header) and the ids its log lines carry."""
    req = task.request
    parent = getattr(req, tracing.TRACEPARENT, None) or (req.headers or {}).get(
        tracing.TRACEPARENT)
    with tracing.span(f"run {task.name}", SpanKind.CONSUMER,
                      parent={tracing.TRACEPARENT: parent},
                      attributes={"messaging.system": "celery",
                                  "messaging.message.id": req.id,
                                  "inferq.batch_id": batch_id, "inferq.shard_id": shard_id,
                                  "inferq.attempt": req.retries}), \
            logs.bound(batch_id=batch_id, shard_id=shard_id):
        yield


@app.task(name=TASK_VALIDATE, bind=True, **RETRY)
def validate_batch(self: Task, batch_id: str) -> None:
    ctx = process.context()  # prompt tokens counted with the model's tokenizer
    with traced(self, batch_id):
        service.validate_batch(ctx, batch_id, count_tokens=Counter(ctx))


@app.task(name=TASK_FINALIZE, bind=True, **RETRY)
def finalize_batch(self: Task, batch_id: str) -> None:
    with traced(self, batch_id):
        finalize.finalize_batch(process.context(), batch_id)


@app.task(name=TASK_SHARD, bind=True, **RETRY)
def process_shard(self: Task, shard_id: str) -> str:
    rt = process.runtime()  # built by the pool child at start; this only looks it up
    process.shard_consumers.hostname = self.request.hostname
    with traced(self, refs.batch_of(shard_id), shard_id):
        return run_shard(rt, shard_id, stop_requested=draining,
                         queue=(self.request.delivery_info or {}).get("routing_key"))
