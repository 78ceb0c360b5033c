"""An asynchronous job's object (/v1/jobs)."""

from __future__ import annotations

from typing import Any, Literal, Self

from jobs.core.schema import Job
from jobs.core.status import JobStatus
from jobs.protocol.objects.common import Out


class JobObject(Out):
    id: str
    object: Literal["job"] = "job"
    endpoint: str
    status: JobStatus
    created_at: int
    started_at: int | None
    completed_at: int | None
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    callback_url: str | None
    attempts: int
    model_version: str | None  # the version it was routed to (a canary's, or the default)

    @classmethod
    def of(cls, job: Job) -> Self:
        return cls(id=job.id, endpoint=job.endpoint, status=JobStatus(job.status),
                   created_at=job.created_at, started_at=job.started_at,
                   completed_at=job.completed_at, result=job.result, error=job.error,
                   callback_url=job.callback_url, attempts=job.attempt,
                   model_version=job.model_version)
