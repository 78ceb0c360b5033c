"""Webhooks: endpoints (a signing secret shown once), test sends, event types,
deliveries and their attempts, and the callback secret of jobs' and batches'
``callback_url``."""

from __future__ import annotations

from typing import Literal, Self

from jobs.core.status import DeliveryStatus
from jobs.core.webhook_tables import (
    WebhookAttempt,
    WebhookCallbackSecret,
    WebhookDelivery,
    WebhookEvent,
)
from jobs.core.webhook_tables import WebhookEndpoint as EndpointRow
from jobs.protocol.objects.common import Out


class WebhookEndpoint(Out):
    id: str
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    created_at: int
    updated_at: int
    name: str
    url: str
    event_types: list[str]
    signing_secret_hint: str

    @classmethod
    def of(cls, e: EndpointRow, hint: str) -> Self:
        """``hint``: the secret's hint (jobs.webhooks.signing.secret_hint)."""
        return cls(id=e.id, created_at=e.created_at, updated_at=e.updated_at, name=e.name,
                   url=e.url, event_types=list(e.event_types), signing_secret_hint=hint)


class WebhookEndpointWithSecret(WebhookEndpoint):
    """As created or rotated: the signing secret is shown this once."""

    signing_secret: str

    @classmethod
    def of(cls, e: EndpointRow, hint: str) -> Self:
        return cls(id=e.id, created_at=e.created_at, updated_at=e.updated_at, name=e.name,
                   url=e.url, event_types=list(e.event_types), signing_secret_hint=hint,
                   signing_secret=e.secret)


class WebhookTestResult(Out):
    object: Literal["webhook_endpoint.test"] = "webhook_endpoint.test"
    webhook_endpoint_id: str
    event_type: str
    status_code: int
    success: bool


class EventTypeList(Out):
    object: Literal["list"] = "list"
    data: list[str]


class DeliveryAttempt(Out):
    attempt: int
    started_at: int
    duration_ms: int | None
    status_code: int | None
    error: str | None

    @classmethod
    def of(cls, a: WebhookAttempt) -> Self:
        return cls(attempt=a.attempt, started_at=int(a.started_at), duration_ms=a.duration_ms,
                   status_code=a.status_code, error=a.error)


class Delivery(Out):
    id: str
    object: Literal["webhook_endpoint.delivery"] = "webhook_endpoint.delivery"
    event_id: str
    event_type: str
    webhook_endpoint_id: str
    status: DeliveryStatus
    created_at: int
    delivered_at: int | None
    next_attempt_at: int | None
    attempts: list[DeliveryAttempt]

    @classmethod
    def of(cls, d: WebhookDelivery, ev: WebhookEvent, attempts: list[WebhookAttempt]) -> Self:
        """An endpoint's delivery (not a callback's: those have no ``endpoint_id``)."""
        assert d.endpoint_id is not None
        return cls(id=d.id, event_id=ev.id, event_type=ev.type,
                   webhook_endpoint_id=d.endpoint_id, status=DeliveryStatus(d.status),
                   created_at=int(d.created_at),
                   delivered_at=None if d.delivered_at is None else int(d.delivered_at),
                   next_attempt_at=(int(d.next_attempt_at)
                                    if d.status == DeliveryStatus.PENDING else None),
                   attempts=[DeliveryAttempt.of(a) for a in attempts])


class CallbackSecret(Out):
    object: Literal["webhook_callback_secret"] = "webhook_callback_secret"
    created_at: int
    updated_at: int
    signing_secret_hint: str

    @classmethod
    def of(cls, row: WebhookCallbackSecret, hint: str) -> Self:
        """``hint``: the secret's hint (jobs.webhooks.signing.secret_hint)."""
        return cls(created_at=row.created_at, updated_at=row.updated_at,
                   signing_secret_hint=hint)


class CallbackSecretWithSecret(CallbackSecret):
    signing_secret: str

    @classmethod
    def of(cls, row: WebhookCallbackSecret, hint: str) -> Self:
        return cls(created_at=row.created_at, updated_at=row.updated_at,
                   signing_secret_hint=hint, signing_secret=row.secret)
