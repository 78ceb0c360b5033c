"""Batch and shard lifecycles, and which transitions are allowed."""

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
    BatchStatus.CANCELLING: {BatchStatus.CANCELLED, BatchStatus.FINALIZING},
}


def can_move(src: str, dst: str) -> bool:
    return BatchStatus(dst) in ALLOWED.get(BatchStatus(src), set())


class ShardStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


SHARD_FINISHED = (ShardStatus.DONE, ShardStatus.FAILED, ShardStatus.CANCELLED)
