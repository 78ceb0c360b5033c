"""The only place that sends Celery messages, and the queue/lane layout.

The API and the control tasks send by task name, so they never import the
workers (and torch). Sends happen after the DB commit that makes them valid.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from jobs.core import logs, refs, tracing
from jobs.core.lanes import CELERY_LANES, CONTROL, REALTIME, lane_for
from jobs.core.settings import Settings

TASK_VALIDATE = "inferq.validate_batch"
TASK_SHARD = "inferq.process_shard"
TASK_FINALIZE = "inferq.finalize_batch"


def celery_config(settings: Settings, redis_url: str) -> dict[str, Any]:
    """Settings for long, redeliverable shard tasks (see docs/RELIABILITY.md)."""
    # Redis redelivers an unacked message after the visibility timeout even while its
    # task still runs (celery#5935): keep it far above any shard's run time, plus
    # kombu's ~100 s restore sweep. Faster recovery after a kill comes from the
    # janitor, which hands back shards whose (renewed) DB lease lapsed.
    visibility = 6 * 3600 + 100
    transport = {"visibility_timeout": visibility}
    return {
        "broker_url": redis_url,
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "visibility_timeout": visibility,
        # Status lives in PostgreSQL; Celery results are never read.
        "task_ignore_result": True,
        # Ack after the task returns; requeue if the pool child dies.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # One shard at a time per worker process, nothing reserved behind it.
        "worker_prefetch_multiplier": 1,
        # On a broker reconnect the running shard's message cannot be acked any more
        # and will be delivered again. Celery's remedy (True) kills the running task:
        # the pool child is replaced, reloads the model, and the chunk in flight is
        # lost. Here a second delivery is harmless (the DB lease makes it a no-op), so
        # shards keep running through a Redis restart; measured in
        # tests/integration/test_backend_restarts.py and docs/RELIABILITY.md.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "broker_connection_retry_on_startup": True,
        "task_queues": [Queue(q, Exchange(q, type="direct"), routing_key=q) for q in CELERY_LANES],
        "task_default_queue": CONTROL,
        "task_serializer": "json",
        "accept_content": ["json"],
        "worker_hijack_root_logger": False,
        # Model loading happens in the pool child before it takes work.
        "worker_proc_alive_timeout": 300,
    }


def lane_queues(lanes: set[str]) -> list[str]:
    """Celery queues behind lanes; realtime and jobs are Redis lists, not Celery queues
    (a worker serving only those consumes the otherwise unused realtime queue)."""
    queues: list[str] = [q for q in CELERY_LANES if q in lanes]
    return queues or [REALTIME]


def shard_queue(lane: str, model_ref: str | None) -> str:
    """The queue of a lane's shards for one model version (``name@version``): only
    workers holding that version consume it. The plain lane queue without one."""
    return f"{lane}.{model_ref}" if model_ref else lane


def shard_ref(model: str | None, version: str | None) -> str | None:
    """The version a batch's shards are routed by (its pinned ``model_version``)."""
    return refs.model_ref(model, version) if model else model


def broker_url(redis_url: str) -> str:
    """kombu spells unix sockets ``redis+socket://``."""
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url[len("unix://"):]
    return redis_url


def make_celery(settings: Settings, name: str = "inferq") -> Celery:
    app = Celery(name)
    app.conf.update(celery_config(settings, broker_url(settings.redis_url)))
    return app


class Dispatcher:
    """Sends work by task name onto the lane queues."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def validate(self, batch_id: str) -> None:
        self._send(TASK_VALIDATE, batch_id, batch_id, CONTROL)

    def shards(self, shard_ids: list[str], tier: str, model_ref: str | None,
               countdown: float = 0) -> None:
        """Send shards of one lane and model version to its queue."""
        queue = shard_queue(lane_for(tier), model_ref)
        for sid in shard_ids:
            self._send(TASK_SHARD, sid, refs.batch_of(sid), queue, countdown)

    def finalize(self, batch_id: str) -> None:
        self._send(TASK_FINALIZE, batch_id, batch_id, CONTROL)

    def _send(self, task: str, arg: str, batch_id: str, queue: str,
              countdown: float = 0) -> None:
        """One message. With tracing on, it carries the trace context (``traceparent``
        header) of the batch's trace: that of the current span when this code works for
        the same batch (its create request, its validation, one of its shards); a send
        for another batch (fair dispatch picks any project's shard) carries none, and
        its task starts a trace of its own."""
        headers: dict[str, str] = {}
        if tracing.enabled() and logs.current("batch_id") in (None, batch_id):
            with tracing.producer(f"send {task}", headers,
                                  {"messaging.system": "celery",
                                   "messaging.destination.name": queue,
                                   "inferq.batch_id": batch_id, "inferq.task_arg": arg}):
                self.app.send_task(task, args=[arg], queue=queue,
                                   countdown=countdown or None, headers=headers)
            return
        self.app.send_task(task, args=[arg], queue=queue, countdown=countdown or None)
