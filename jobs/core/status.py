"""Lifecycles (batch, upload, shard, job, idempotency key, a worker's circuit breaker, a token
stream) as enums, and which batch transitions are allowed."""

from __future__ import annotations

from enum import StrEnum


class BatchStatus(StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


TERMINAL = {BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}

ALLOWED: dict[BatchStatus, set[BatchStatus]] = {
    BatchStatus.VALIDATING: {BatchStatus.IN_PROGRESS, BatchStatus.FAILED, BatchStatus.CANCELLING,
                             BatchStatus.FINALIZING},
    BatchStatus.IN_PROGRESS: {BatchStatus.FINALIZING, BatchStatus.CANCELLING, BatchStatus.EXPIRED,
                              BatchStatus.FAILED},
    BatchStatus.FINALIZING: {BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.CANCELLED,
                             BatchStatus.EXPIRED},
    # a cancelling batch whose results cannot be assembled fails
    BatchStatus.CANCELLING: {BatchStatus.CANCELLED, BatchStatus.FINALIZING, BatchStatus.FAILED},
}


def can_move(src: str, dst: str) -> bool:
    return BatchStatus(dst) in ALLOWED.get(BatchStatus(src), set())


class UploadStatus(StrEnum):
    """An upload (``POST /v1/uploads``): pending until completed, cancelled or expired.
    Expired is also what a pending upload past its ``expires_at`` reads as."""

    PENDING = "pending"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class ShardStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


SHARD_FINISHED = (ShardStatus.DONE, ShardStatus.FAILED, ShardStatus.CANCELLED)


class ShardOutcome(StrEnum):
    """How one attempt at a shard ended, as the shard task reports it."""

    DONE = "done"
    DUPLICATE = "duplicate"  # another worker holds it
    FENCED = "fenced"  # the lease was lost: another worker took over
    CANCELLED = "cancelled"
    HANDED_BACK = "handed_back"  # given up uncommitted or on shutdown; another worker resumes
    RETRY = "retry"  # failed; queued again with backoff
    FAILED = "failed"


RESUMED_ELSEWHERE = (ShardOutcome.HANDED_BACK, ShardOutcome.RETRY)


class JobStatus(StrEnum):
    """An asynchronous job's lifecycle (``POST /v1/jobs``)."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


class BreakerState(StrEnum):
    """A worker's circuit breaker, as its heartbeat announces it."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class StreamEvent(StrEnum):
    """The events of a realtime generation stream, in order: start, deltas, then done
    or error (the ``t`` field of each event the worker publishes)."""

    START = "start"
    DELTA = "delta"
    DONE = "done"
    ERROR = "error"


class IdempotencyState(StrEnum):
    """An idempotency key's record: its first request still running, or answered."""

    PENDING = "pending"
    DONE = "done"


class DeliveryStatus(StrEnum):
    """A webhook delivery (one event to one target): waiting for its next attempt (or
    being sent), delivered (a 2xx answer), or given up after the retry period."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
