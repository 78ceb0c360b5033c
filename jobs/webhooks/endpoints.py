"""A project's webhook endpoints (OpenAI's webhook endpoints API) and each one's delivery
log, the project's secret for per-request callbacks, and the check of every target URL.
"""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from jobs.core.context import Context
from jobs.core.errors import InvalidRequest, NotFound, shown
from jobs.core.schema import new_id, now
from jobs.core.status import DeliveryStatus
from jobs.core.webhook_tables import (
    WebhookAttempt,
    WebhookCallbackSecret,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
)
from jobs.webhooks.events import EVENT_TYPES
from jobs.webhooks.signing import new_secret
from storage import outbound

OLD_SECRET_GRACE_S = 24 * 3600
NAME_MAX = 200


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
