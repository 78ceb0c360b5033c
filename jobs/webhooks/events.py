"""Webhook events: those a project's batches and jobs cause, written to the outbox.

An event is written to the outbox (``webhook_events``, one ``webhook_deliveries`` row
per target) by :func:`emit`, in the transaction of the status change that causes it:
the change and its event commit together or not at all. ``jobs/webhooks/deliveries.py`` sends
them. Targets are the project's endpoints subscribed to the event's type and, for a
job or batch created with ``callback_url``, that URL (signed with the project's
callback secret). Deliveries are signed by ``jobs.webhooks.signing``; the endpoints
themselves are managed in ``jobs.webhooks.endpoints``.
"""

from __future__ import annotations

import time

import orjson
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.core.context import Context
from jobs.core.schema import Batch, new_id
from jobs.core.status import BatchStatus, DeliveryStatus, JobStatus
from jobs.core.webhook_tables import WebhookDelivery, WebhookEndpoint, WebhookEvent

BATCH_EVENTS = {BatchStatus.COMPLETED: "batch.completed", BatchStatus.FAILED: "batch.failed",
                BatchStatus.EXPIRED: "batch.expired", BatchStatus.CANCELLED: "batch.cancelled"}
JOB_EVENTS = {JobStatus.COMPLETED: "job.completed", JobStatus.FAILED: "job.failed"}
EVENT_TYPES = (*BATCH_EVENTS.values(), *JOB_EVENTS.values())
NOTIFY_CHANNEL = "inferq_webhooks"  # NOTIFY at a commit that wrote deliveries


def event_body(event_id: str, etype: str, subject_id: str, created_at: int) -> str:
    """OpenAI's event payload: ``{id, object, created_at, type, data: {id}}``."""
    return orjson.dumps({"id": event_id, "object": "event", "created_at": created_at,
                         "type": etype, "data": {"id": subject_id}}).decode()


# The outbox ------------------------------------------------------------------------------


def emit(ctx: Context, s: Session, tenant_id: str, etype: str, subject_id: str,
         callback_url: str | None = None) -> str | None:
    """Write the event and its deliveries in ``s`` (the status change's transaction);
    its id, or None when nothing subscribes to it."""
    endpoints = [e for e in s.scalars(select(WebhookEndpoint.id).where(
        WebhookEndpoint.tenant_id == tenant_id,
        WebhookEndpoint.event_types.contains([etype])))]
    if not endpoints and not callback_url:
        return None
    t = time.time()
    event_id = new_id("evt_")
    s.add(WebhookEvent(id=event_id, tenant_id=tenant_id, type=etype, subject_id=subject_id,
                       body=event_body(event_id, etype, subject_id, int(t)), created_at=t))
    s.flush()
    give_up = t + ctx.settings.webhook_retry_period_s
    targets: list[tuple[str | None, str | None]] = [(e, None) for e in endpoints]
    if callback_url:
        targets.append((None, callback_url))
    for endpoint_id, url in targets:
        s.add(WebhookDelivery(id=new_id("wh_"), event_id=event_id, tenant_id=tenant_id,
                              endpoint_id=endpoint_id, url=url, status=DeliveryStatus.PENDING,
                              attempts=0, next_attempt_at=t, give_up_at=give_up, created_at=t))
    if not s.info.get(NOTIFY_CHANNEL):  # wakes the delivery loop at commit (once per commit)
        s.execute(select(func.pg_notify(NOTIFY_CHANNEL, "")))
        s.info[NOTIFY_CHANNEL] = True
    return event_id


def batch_ended(ctx: Context, s: Session, b: Batch) -> str | None:
    """The event of a batch that has just reached a terminal status (in ``s``)."""
    etype = BATCH_EVENTS.get(BatchStatus(b.status))
    if etype is None:
        return None
    return emit(ctx, s, b.tenant_id, etype, b.id, b.callback_url)


def job_ended(ctx: Context, s: Session, tenant_id: str, job_id: str, status: str,
              callback_url: str | None) -> str | None:
    """The event of a job that has just completed or failed (in ``s``)."""
    etype = JOB_EVENTS.get(JobStatus(status))
    if etype is None:
        return None
    return emit(ctx, s, tenant_id, etype, job_id, callback_url)
