"""The webhook tables (jobs/webhooks/): a project's endpoints and callback secret, the
outbox of events, their deliveries and the log of every attempt. Columns are NOT NULL
unless stated (as in ``jobs.core.schema``)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import BigInteger, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from jobs.core.schema import Base, now


class WebhookEndpoint(Base):
    """A project's webhook endpoint: where events of ``event_types`` are sent, signed
    with ``secret`` (``whsec_`` + base64). After a rotation that keeps the old secret,
    deliveries are signed with both until ``old_secret_expires_at``."""

    __tablename__ = "webhook_endpoints"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(String(2048))
    event_types: Mapped[list[Any]] = mapped_column(JSONB)
    secret: Mapped[str] = mapped_column(String(128))
    old_secret: Mapped[str | None] = mapped_column(String(128), nullable=True)
    old_secret_expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)
    updated_at: Mapped[int] = mapped_column(BigInteger, default=now)

    __table_args__ = (Index("ix_webhook_endpoints_tenant_id_id", "tenant_id", "id"),)


class WebhookCallbackSecret(Base):
    """A project's secret for per-request callbacks (``callback_url`` on a job or a
    batch); rotated like an endpoint's."""

    __tablename__ = "webhook_callback_secrets"
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"),
                                           primary_key=True)
    secret: Mapped[str] = mapped_column(String(128))
    old_secret: Mapped[str | None] = mapped_column(String(128), nullable=True)
    old_secret_expires_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[int] = mapped_column(BigInteger, default=now)
    updated_at: Mapped[int] = mapped_column(BigInteger, default=now)


class WebhookEvent(Base):
    """The outbox: one row per event, written in the transaction of the status change
    that causes it. ``body`` is the exact JSON every delivery of it sends."""

    __tablename__ = "webhook_events"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(64))
    subject_id: Mapped[str] = mapped_column(String(48))  # the batch or job
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)

    __table_args__ = (Index("ix_webhook_events_created_at", "created_at"),)


class WebhookDelivery(Base):
    """One event to one target: an endpoint (``endpoint_id``) or a per-request callback
    (``url``, signed with the project's callback secret). Its id is the
    ``webhook-id`` header of every attempt. A claimed row's lease is
    ``next_attempt_at``: a sender that dies leaves it due again when that passes."""

    __tablename__ = "webhook_deliveries"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("webhook_events.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    endpoint_id: Mapped[str | None] = mapped_column(
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), nullable=True)
    url: Mapped[str | None] = mapped_column(String(2048), nullable=True)  # a callback's
    status: Mapped[str] = mapped_column(String(16))  # DeliveryStatus
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    give_up_at: Mapped[float] = mapped_column(Float)
    lease_token: Mapped[str | None] = mapped_column(String(32), nullable=True)
    last_status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=time.time)
    delivered_at: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        Index("ix_webhook_deliveries_due", "next_attempt_at",
              postgresql_where="status = 'pending'"),
        Index("ix_webhook_deliveries_endpoint_id_id", "endpoint_id", "id"),
        Index("ix_webhook_deliveries_event_id", "event_id"),  # an event's, as it is pruned
    )


class WebhookAttempt(Base):
    """The delivery log: one row per attempt (its HTTP status, or why it got none)."""

    __tablename__ = "webhook_attempts"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    delivery_id: Mapped[str] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    duration_ms: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (Index("ix_webhook_attempts_delivery_id", "delivery_id", "id"),)
