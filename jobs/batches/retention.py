"""Retention: what expires is deleted, what is kept has a stated lifetime.

- **Files** past ``expires_at`` (``expires_after`` of ``POST /v1/files`` and of an
  upload; a batch's ``output_expires_after`` for its output and error files, anchored
  at their ``created_at``) are gone at once: every route answers them as deleted
  (``repository.file_exists``). The janitor then deletes their objects from the
  object store and marks their rows deleted — a batch's input only once every batch
  reading it has ended, as ``DELETE /v1/files/{id}`` waits for them — with what was
  derived from them: a batch's output parts with its output and error files (its
  partial output answers ``results_expired`` from then on), an ended batch's shards
  with its input.
- **Webhook events**, with their deliveries and attempts, are deleted
  ``INFERQ_WEBHOOK_RETENTION_DAYS`` after the event once none of its deliveries is
  pending (a delivery is retried for ``INFERQ_WEBHOOK_RETRY_PERIOD_S`` at most).
- **Usage records** are deleted ``INFERQ_USAGE_RETENTION_DAYS`` after they were
  written (0, the default: kept; the usage and costs routes read them).
- **Idempotency-Keys**, with the answers they replay, are deleted
  ``INFERQ_IDEMPOTENCY_RETENTION_DAYS`` (7) after their first use: the same key sent
  later makes a new object.
Each pass deletes at most ``limit`` of each, oldest first, so a sweep stays short.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sqlalchemy import delete, exists, select

from jobs.core.context import Context
from jobs.core.schema import Batch, File, IdempotencyKey, UsageRecord, now
from jobs.core.status import TERMINAL, DeliveryStatus
from jobs.core.webhook_tables import WebhookDelivery, WebhookEvent
from storage import keys

DAY = 86400


@dataclass
class Pruned:
    files: list[str] = field(default_factory=list)  # expired files deleted
    events: int = 0  # webhook events deleted (with their deliveries and attempts)
    usage: int = 0  # usage records deleted
    keys: int = 0  # Idempotency-Keys deleted


def prune(ctx: Context, at: float | None = None, limit: int = 500) -> Pruned:
    t = time.time() if at is None else at
    out = Pruned(files=expire_files(ctx, int(t), limit))
    out.events = _old_events(ctx, t - ctx.settings.webhook_retention_days * DAY, limit)
    if ctx.settings.usage_retention_days > 0:
        out.usage = _old_usage(ctx, t - ctx.settings.usage_retention_days * DAY, limit)
    out.keys = _old_keys(ctx, t - ctx.settings.idempotency_retention_days * DAY, limit)
    return out


def expire_files(ctx: Context, at: int | None = None, limit: int = 500) -> list[str]:
    """Files past their expiry that no unfinished batch reads: objects deleted, rows
    marked deleted. Their ids. With a batch's output or error file go the parts they
    were assembled from (the partial-output route reads those); with an ended batch's
    input go its shards (a copy of it). A failed object delete rolls the pass back:
    the next sweep tries again."""
    t = now() if at is None else at
    reading = exists().where(Batch.input_file_id == File.id, Batch.status.not_in(TERMINAL))
    with ctx.db.session() as s:
        files = list(s.scalars(
            select(File).where(~File.deleted, File.expires_at.is_not(None),
                               File.expires_at <= t, ~reading)
            .order_by(File.expires_at).limit(limit).with_for_update(skip_locked=True)))
        ids = [f.id for f in files]
        for batch_id in s.scalars(select(Batch.id).where(
                Batch.output_file_id.in_(ids) | Batch.error_file_id.in_(ids))):
            ctx.store.delete_prefix(keys.batch_parts(batch_id))
        for batch_id in s.scalars(select(Batch.id).where(Batch.input_file_id.in_(ids))):
            ctx.store.delete_prefix(keys.batch_shards(batch_id))
            ctx.store.delete(keys.validation_errors(batch_id))
        for f in files:
            ctx.store.delete(f.object_key)
            f.deleted = True
        return ids


def _old_events(ctx: Context, before: float, limit: int) -> int:
    pending = exists().where(WebhookDelivery.event_id == WebhookEvent.id,
                             WebhookDelivery.status == DeliveryStatus.PENDING)
    with ctx.db.session() as s:
        ids = list(s.scalars(select(WebhookEvent.id).where(
            WebhookEvent.created_at < before, ~pending)
            .order_by(WebhookEvent.created_at).limit(limit)))
        if ids:  # deliveries and attempts go with them (ON DELETE CASCADE)
            s.execute(delete(WebhookEvent).where(WebhookEvent.id.in_(ids)))
        return len(ids)


def _old_usage(ctx: Context, before: float, limit: int) -> int:
    with ctx.db.session() as s:
        ids = list(s.scalars(select(UsageRecord.id).where(UsageRecord.created_at < before)
                             .order_by(UsageRecord.created_at).limit(limit)))
        if ids:
            s.execute(delete(UsageRecord).where(UsageRecord.id.in_(ids)))
        return len(ids)


def _old_keys(ctx: Context, before: float, limit: int) -> int:
    with ctx.db.session() as s:
        old = list(s.execute(select(IdempotencyKey.tenant_id, IdempotencyKey.key).where(
            IdempotencyKey.created_at < before).order_by(IdempotencyKey.created_at)
            .limit(limit)))
        for tenant_id, key in old:
            s.execute(delete(IdempotencyKey).where(IdempotencyKey.tenant_id == tenant_id,
                                                   IdempotencyKey.key == key))
        return len(old)

