"""Webhooks: a project's endpoints (OpenAI's webhook endpoints API), the events its
batches and jobs cause, and how every delivery is signed.

An event is written to the outbox (``webhook_events``, one ``webhook_deliveries`` row
per target) by :func:`emit`, in the transaction of the status change that causes it:
the change and its event commit together or not at all. ``jobs/webhooks/deliveries.py`` sends
them. Targets are the project's endpoints subscribed to the event's type and, for a
job or batch created with ``callback_url``, that URL (signed with the project's
callback secret).

Signing is Standard Webhooks', as OpenAI's: ``webhook-id`` (the delivery's id, the
same on every attempt), ``webhook-timestamp`` (the attempt's time) and
``webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`` keyed by
the base64-decoded part of the ``whsec_`` secret; during a rotation that keeps the
old secret, one signature per secret, space-separated.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from jobs.core.context import Context
from jobs.core.errors import InvalidRequest, NotFound, shown
from jobs.core.schema import (
    Batch,
    WebhookAttempt,
    WebhookCallbackSecret,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
    new_id,
    now,
)
from jobs.core.status import BatchStatus, DeliveryStatus, JobStatus
from storage import outbound

BATCH_EVENTS = {BatchStatus.COMPLETED: "batch.completed", BatchStatus.FAILED: "batch.failed",
                BatchStatus.EXPIRED: "batch.expired", BatchStatus.CANCELLED: "batch.cancelled"}
JOB_EVENTS = {JobStatus.COMPLETED: "job.completed", JobStatus.FAILED: "job.failed"}
EVENT_TYPES = (*BATCH_EVENTS.values(), *JOB_EVENTS.values())
OLD_SECRET_GRACE_S = 24 * 3600
NOTIFY_CHANNEL = "inferq_webhooks"  # NOTIFY at a commit that wrote deliveries
NAME_MAX = 200


# Signing ---------------------------------------------------------------------------------


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


def secret_hint(secret: str) -> str:
    return f"whsec_...{secret[-4:]}"


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = (base64.b64decode(secret.removeprefix("whsec_")) if secret.startswith("whsec_")
           else secret.encode())
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def signed_headers(msg_id: str, body: bytes, keys: list[str],
                   timestamp: int | None = None) -> dict[str, str]:
    """The headers of one attempt: signed now, with every secret in ``keys``."""
    ts = int(time.time()) if timestamp is None else timestamp
    return {"content-type": "application/json", "user-agent": "inferq-webhooks",
            "webhook-id": msg_id, "webhook-timestamp": str(ts),
            "webhook-signature": " ".join(signature(k, msg_id, ts, body) for k in keys)}


def active_secrets(row: WebhookEndpoint | WebhookCallbackSecret, t: int | None = None
                   ) -> list[str]:
    """The secrets a delivery is signed with: the current one, and the previous one
    while a rotation keeps it valid."""
    t = now() if t is None else t
    keys = [row.secret]
    if row.old_secret and (row.old_secret_expires_at or 0) > t:
        keys.append(row.old_secret)
    return keys


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


# Target URLs -----------------------------------------------------------------------------


def check_target(ctx: Context, url: str, param: str) -> None:
    """A 400 for a URL no delivery may be sent to (scheme, or an address that is not
    public and not allow-listed), as far as it can be known now."""
    try:
        outbound.check_url(url, ctx.settings.webhook_allow_host_set)
    except outbound.OutboundRefused as e:
        raise InvalidRequest(f"{param} is refused: {e}", param=param,
                             code="invalid_url") from None


# Endpoints -------------------------------------------------------------------------------


class EndpointCreate(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    event_types: list[str] = Field(min_length=1, max_length=len(EVENT_TYPES))
    name: str = Field(min_length=1, max_length=NAME_MAX)
    url: str = Field(min_length=1, max_length=2048)


class EndpointUpdate(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    event_types: list[str] | None = Field(default=None, min_length=1,
                                          max_length=len(EVENT_TYPES))
    name: str | None = Field(default=None, min_length=1, max_length=NAME_MAX)
    url: str | None = Field(default=None, min_length=1, max_length=2048)


class RotateSecret(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    keep_old_secret_active_for_24_hours: bool = False


class TestSend(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    event_type: str = Field(max_length=64)


def _event_types(types: list[str]) -> list[str]:
    for t in types:
        if t not in EVENT_TYPES:
            raise InvalidRequest(f"event_types: {shown(t)} is not an event this service sends; "
                                 f"one of {', '.join(EVENT_TYPES)}", param="event_types",
                                 code="unsupported_event_type")
    return sorted(set(types), key=EVENT_TYPES.index)


def create_endpoint(ctx: Context, tenant_id: str, req: EndpointCreate) -> WebhookEndpoint:
    types = _event_types(req.event_types)
    check_target(ctx, req.url, "url")
    t = now()
    e = WebhookEndpoint(id=new_id("we_"), tenant_id=tenant_id, name=req.name, url=req.url,
                        event_types=types, secret=new_secret(), created_at=t, updated_at=t)
    with ctx.db.session() as s:
        s.add(e)
    return e


def _endpoint(s: Session, tenant_id: str, endpoint_id: str, lock: bool = False
              ) -> WebhookEndpoint:
    q = select(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id,
                                      WebhookEndpoint.tenant_id == tenant_id)
    e = s.scalar(q.with_for_update() if lock else q)
    if e is None:
        raise NotFound(f"No such webhook endpoint: {endpoint_id}", param="webhook_endpoint_id")
    return e


def get_endpoint(ctx: Context, tenant_id: str, endpoint_id: str) -> WebhookEndpoint:
    with ctx.db.session() as s:
        return _endpoint(s, tenant_id, endpoint_id)


def list_endpoints(ctx: Context, tenant_id: str, after: str | None, limit: int
                   ) -> tuple[list[WebhookEndpoint], bool]:
    """Newest first (ids are time-ordered)."""
    with ctx.db.session() as s:
        q = select(WebhookEndpoint).where(WebhookEndpoint.tenant_id == tenant_id)
        if after:
            _cursor(s, WebhookEndpoint, tenant_id, after)
            q = q.where(WebhookEndpoint.id < after)
        rows = list(s.scalars(q.order_by(WebhookEndpoint.id.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def _cursor(s: Session, model: type[WebhookEndpoint] | type[WebhookDelivery], tenant_id: str,
            after: str) -> None:
    if s.scalar(select(model.id).where(model.id == after, model.tenant_id == tenant_id)) is None:
        raise InvalidRequest(f"after: no such object {after!r}; pass the id of an item from "
                             "a previous page", param="after")


def update_endpoint(ctx: Context, tenant_id: str, endpoint_id: str, req: EndpointUpdate
                    ) -> WebhookEndpoint:
    """Changes what is given; ``updated_at`` moves only when something changed."""
    types = _event_types(req.event_types) if req.event_types is not None else None
    if req.url is not None:
        check_target(ctx, req.url, "url")
    with ctx.db.session() as s:
        e = _endpoint(s, tenant_id, endpoint_id, lock=True)
        changed = False
        for field, value in (("event_types", types), ("name", req.name), ("url", req.url)):
            if value is not None and getattr(e, field) != value:
                setattr(e, field, value)
                changed = True
        if changed:
            e.updated_at = now()
        return e


def delete_endpoint(ctx: Context, tenant_id: str, endpoint_id: str) -> None:
    """Its pending deliveries and their log go with it."""
    with ctx.db.session() as s:
        s.delete(_endpoint(s, tenant_id, endpoint_id, lock=True))


def _rotate(row: WebhookEndpoint | WebhookCallbackSecret, keep_old: bool) -> None:
    t = now()
    row.old_secret = row.secret if keep_old else None
    row.old_secret_expires_at = t + OLD_SECRET_GRACE_S if keep_old else None
    row.secret, row.updated_at = new_secret(), t


def rotate_secret(ctx: Context, tenant_id: str, endpoint_id: str, keep_old: bool
                  ) -> WebhookEndpoint:
    with ctx.db.session() as s:
        e = _endpoint(s, tenant_id, endpoint_id, lock=True)
        _rotate(e, keep_old)
        return e


def endpoint_object(e: WebhookEndpoint, with_secret: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"id": e.id, "object": "webhook_endpoint", "created_at": e.created_at,
                           "updated_at": e.updated_at, "name": e.name, "url": e.url,
                           "event_types": list(e.event_types),
                           "signing_secret_hint": secret_hint(e.secret)}
    if with_secret:
        out["signing_secret"] = e.secret
    return out


# The project's callback secret -----------------------------------------------------------


def rotate_callback_secret(ctx: Context, tenant_id: str, keep_old: bool
                           ) -> WebhookCallbackSecret:
    """Create the project's callback secret, or replace it (the old one valid 24 h more
    with ``keep_old``)."""
    with ctx.db.session() as s:
        row = s.get(WebhookCallbackSecret, tenant_id, with_for_update=True)
        if row is None:
            t = now()
            row = WebhookCallbackSecret(tenant_id=tenant_id, secret=new_secret(),
                                        created_at=t, updated_at=t)
            s.add(row)
        else:
            _rotate(row, keep_old)
        return row


def get_callback_secret(ctx: Context, tenant_id: str) -> WebhookCallbackSecret:
    with ctx.db.session() as s:
        row = s.get(WebhookCallbackSecret, tenant_id)
    if row is None:
        raise NotFound("this project has no callback secret yet: create it with "
                       "POST /v1/webhook_callback_secret", code="callback_secret_missing")
    return row


def check_callback(ctx: Context, tenant_id: str, url: str) -> None:
    """A ``callback_url`` is accepted when it may be sent to and the project has a
    callback secret to sign it with."""
    check_target(ctx, url, "callback_url")
    with ctx.db.session() as s:
        if s.get(WebhookCallbackSecret, tenant_id) is None:
            raise InvalidRequest("callback_url needs the project's callback secret to sign "
                                 "deliveries: create it first with POST "
                                 "/v1/webhook_callback_secret", param="callback_url",
                                 code="callback_secret_missing")


def callback_secret_object(row: WebhookCallbackSecret, with_secret: bool = False
                           ) -> dict[str, Any]:
    out: dict[str, Any] = {"object": "webhook_callback_secret", "created_at": row.created_at,
                           "updated_at": row.updated_at,
                           "signing_secret_hint": secret_hint(row.secret)}
    if with_secret:
        out["signing_secret"] = row.secret
    return out


# The delivery log --------------------------------------------------------------------------


def list_deliveries(ctx: Context, tenant_id: str, endpoint_id: str, after: str | None,
                    limit: int) -> tuple[list[tuple[WebhookDelivery, WebhookEvent,
                                                    list[WebhookAttempt]]], bool]:
    """An endpoint's deliveries, newest first, each with its event and attempts."""
    with ctx.db.session() as s:
        _endpoint(s, tenant_id, endpoint_id)
        q = select(WebhookDelivery, WebhookEvent).join(
            WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id).where(
            WebhookDelivery.endpoint_id == endpoint_id)
        if after:
            _cursor(s, WebhookDelivery, tenant_id, after)
            q = q.where(WebhookDelivery.id < after)
        rows = list(s.execute(q.order_by(WebhookDelivery.id.desc()).limit(limit + 1)).all())
        more, rows = len(rows) > limit, rows[:limit]
        attempts: dict[str, list[WebhookAttempt]] = {d.id: [] for d, _ in rows}
        if rows:
            for a in s.scalars(select(WebhookAttempt).where(
                    WebhookAttempt.delivery_id.in_(list(attempts))).order_by(WebhookAttempt.id)):
                attempts[a.delivery_id].append(a)
    return [(d, ev, attempts[d.id]) for d, ev in rows], more


def resend(ctx: Context, tenant_id: str, endpoint_id: str, delivery_id: str
           ) -> tuple[WebhookDelivery, WebhookEvent, list[WebhookAttempt]]:
    """Send a delivery again now, whatever became of it (same ``webhook-id``), with a
    new retry period."""
    with ctx.db.session() as s:
        _endpoint(s, tenant_id, endpoint_id)
        d = s.scalar(select(WebhookDelivery).where(
            WebhookDelivery.id == delivery_id, WebhookDelivery.endpoint_id == endpoint_id)
            .with_for_update())
        if d is None:
            raise NotFound(f"No such delivery: {delivery_id}", param="delivery_id")
        t = time.time()
        d.status, d.next_attempt_at, d.lease_token = DeliveryStatus.PENDING, t, None
        d.give_up_at = t + ctx.settings.webhook_retry_period_s
        ev = s.get(WebhookEvent, d.event_id)
        assert ev is not None
        attempts = list(s.scalars(select(WebhookAttempt).where(
            WebhookAttempt.delivery_id == d.id).order_by(WebhookAttempt.id)))
    return d, ev, attempts


def delivery_object(d: WebhookDelivery, ev: WebhookEvent, attempts: list[WebhookAttempt]
                    ) -> dict[str, Any]:
    return {"id": d.id, "object": "webhook_endpoint.delivery", "event_id": ev.id,
            "event_type": ev.type, "webhook_endpoint_id": d.endpoint_id, "status": d.status,
            "created_at": int(d.created_at), "delivered_at": None if d.delivered_at is None
            else int(d.delivered_at), "next_attempt_at": None if d.status != "pending"
            else int(d.next_attempt_at), "attempts": [
                {"attempt": a.attempt, "started_at": int(a.started_at),
                 "duration_ms": a.duration_ms, "status_code": a.status_code, "error": a.error}
                for a in attempts]}

