"""A batch's status changes, all through ``move``: each checked against the lifecycle
(``jobs.core.status.ALLOWED``), stamped with its time, and, for an end, its webhook
event written in the same transaction as the status (the outbox)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from jobs.core.context import Context
from jobs.core.schema import Batch, now
from jobs.core.status import TERMINAL, BatchStatus, can_move
from jobs.webhooks import events as webhooks

# The column each status stamps the time it was reached in (once: a status entered
# again, a finalize retried, keeps its first time; ``expired_at`` is the deadline's
# passing, stamped by the janitor before the batch ends as expired).
STAMPS = {BatchStatus.IN_PROGRESS: "in_progress_at", BatchStatus.CANCELLING: "cancelling_at",
          BatchStatus.FINALIZING: "finalizing_at", BatchStatus.COMPLETED: "completed_at",
          BatchStatus.FAILED: "failed_at", BatchStatus.EXPIRED: "expired_at",
          BatchStatus.CANCELLED: "cancelled_at"}


class IllegalMove(RuntimeError):
    """A status change the lifecycle does not allow: a defect of the caller."""


def move(ctx: Context, s: Session, b: Batch, to: BatchStatus,
         errors: list[dict[str, Any]] | None = None) -> None:
    """Move ``b`` (a row locked in ``s``) to ``to``, with ``errors`` if given; staying in
    its status is allowed (a delivery repeated)."""
    src = BatchStatus(b.status)
    if to != src and not can_move(src, to):
        raise IllegalMove(f"batch {b.id}: {src} -> {to} is not a step of its lifecycle")
    b.status = to
    if getattr(b, STAMPS[to]) is None:
        setattr(b, STAMPS[to], now())
    if errors is not None:
        b.errors = errors
    if to in TERMINAL and src != to:
        webhooks.batch_ended(ctx, s, b)  # its event commits with the status
