"""Webhooks: endpoints (a signing secret shown once), test sends, event types,
deliveries and their attempts, and the callback secret of jobs' and batches'
``callback_url``."""

from __future__ import annotations

from typing import Literal

from api.schemas.common import Out
from jobs.core.status import DeliveryStatus


class WebhookEndpoint(Out):
    id: str
    object: Literal["webhook_endpoint"]
    created_at: int
    updated_at: int
    name: str
    url: str
    event_types: list[str]
    signing_secret_hint: str


class WebhookEndpointWithSecret(WebhookEndpoint):
    """As created or rotated: the signing secret is shown this once."""

    signing_secret: str


class WebhookTestResult(Out):
    object: Literal["webhook_endpoint.test"]
    webhook_endpoint_id: str
    event_type: str
    status_code: int
    success: bool


class EventTypeList(Out):
    object: Literal["list"]
    data: list[str]


class DeliveryAttempt(Out):
    attempt: int
    started_at: int
    duration_ms: int | None
    status_code: int | None
    error: str | None


class Delivery(Out):
    id: str
    object: Literal["webhook_endpoint.delivery"]
    event_id: str
    event_type: str
    webhook_endpoint_id: str
    status: DeliveryStatus
    created_at: int
    delivered_at: int | None
    next_attempt_at: int | None
    attempts: list[DeliveryAttempt]


class CallbackSecret(Out):
    object: Literal["webhook_callback_secret"]
    created_at: int
    updated_at: int
    signing_secret_hint: str


class CallbackSecretWithSecret(CallbackSecret):
    signing_secret: str
