"""Response shapes (OpenAI objects with every field present) and request parsing helpers."""

from __future__ import annotations

from typing import Any

from flask import request

from jobs.errors import InvalidRequest, PayloadTooLarge
from jobs.models import Batch, File


def json_body(limit: int = 64 * 1024 * 1024) -> dict[str, Any]:
    if (request.content_length or 0) > limit:
        raise PayloadTooLarge(f"a JSON request body is at most {limit} bytes")
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def page_params() -> tuple[str | None, int]:
    raw = request.args.get("limit", "20")
    try:
        limit = int(raw)
    except ValueError:
        raise InvalidRequest(f"limit must be an integer, got {raw!r}", param="limit") from None
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100", param="limit")
    after = request.args.get("after") or None
    if after is not None and len(after) > 64:
        raise InvalidRequest("after must be an object id", param="after")
    return after, limit


def page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}


def file_object(f: File) -> dict[str, Any]:
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": f.created_at,
            "filename": f.filename, "purpose": f.purpose, "status": "processed",
            "expires_at": f.expires_at, "status_details": None}


def batch_object(b: Batch, sums: tuple[int, int, int]) -> dict[str, Any]:
    completed, failed, tokens = sums
    out: dict[str, Any] = {
        "id": b.id, "object": "batch", "endpoint": b.endpoint,
        "errors": {"object": "list", "data": b.errors} if b.errors else None,
        "input_file_id": b.input_file_id, "completion_window": b.completion_window,
        "status": b.status, "output_file_id": b.output_file_id, "error_file_id": b.error_file_id,
        "created_at": b.created_at, "in_progress_at": b.in_progress_at,
        "expires_at": b.expires_at, "finalizing_at": b.finalizing_at,
        "completed_at": b.completed_at, "failed_at": b.failed_at, "expired_at": b.expired_at,
        "cancelling_at": b.cancelling_at, "cancelled_at": b.cancelled_at,
        "request_counts": {"total": b.total, "completed": completed,
                           "failed": failed + b.invalid},
        "metadata": b.metadata_, "model": b.model,
        "usage": {"input_tokens": tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": tokens},
    }
    return out
