"""The Batch object, built from the batch and its shards' sums."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel

from jobs.core.schema import Batch
from jobs.core.status import BatchStatus
from jobs.protocol.objects.common import Out, ReasoningTokens


class BatchError(BaseModel):
    code: str | None
    line: int | None
    message: str | None
    param: str | None


class BatchErrors(Out):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(Out):
    total: int
    completed: int
    failed: int


class CachedTokens(Out):
    cached_tokens: int


class BatchUsage(Out):
    input_tokens: int
    input_tokens_details: CachedTokens
    output_tokens: int
    output_tokens_details: ReasoningTokens
    total_tokens: int


class BatchObject(Out):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None
    model: str | None
    model_version: str | None  # the version pinned when the batch was validated
    service_tier: str
    parent_batch_id: str | None  # the batch whose failed requests this one reruns
    usage: BatchUsage

    @classmethod
    def of(cls, b: Batch, sums: tuple[int, int, int, int] = (0, 0, 0, 0)) -> Self:
        """``sums`` are its shards' completed and failed rows, prompt and completion
        tokens (all zero before it has shards); ``usage`` is the sum of the usage of its
        output lines."""
        completed, failed, input_tokens, output_tokens = sums
        return cls(
            id=b.id, endpoint=b.endpoint,
            errors=BatchErrors(data=[BatchError(**e) for e in b.errors]) if b.errors else None,
            input_file_id=b.input_file_id, completion_window=b.completion_window,
            status=BatchStatus(b.status), output_file_id=b.output_file_id,
            error_file_id=b.error_file_id, created_at=b.created_at,
            in_progress_at=b.in_progress_at, expires_at=b.expires_at,
            finalizing_at=b.finalizing_at, completed_at=b.completed_at,
            failed_at=b.failed_at, expired_at=b.expired_at, cancelling_at=b.cancelling_at,
            cancelled_at=b.cancelled_at,
            request_counts=RequestCounts(total=b.total, completed=completed,
                                         failed=failed + b.invalid),
            metadata=b.metadata_, model=b.model, model_version=b.model_version,
            service_tier=b.service_tier, parent_batch_id=b.parent_batch_id,
            usage=BatchUsage(input_tokens=input_tokens,
                             input_tokens_details=CachedTokens(cached_tokens=0),
                             output_tokens=output_tokens,
                             output_tokens_details=ReasoningTokens(reasoning_tokens=0),
                             total_tokens=input_tokens + output_tokens))
