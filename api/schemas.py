"""Response shapes (OpenAI objects with every field present) and request parsing helpers."""

from __future__ import annotations

import re
from typing import Any

import orjson
from flask import request

from jobs.errors import InvalidRequest, NotFound, PayloadTooLarge, shown
from jobs.models import Batch, File
from jobs.repository import ShardSums

MAX_JSON_DEPTH = 64
# Every id this service hands out (and every model name) fits this; anything else
# cannot name an object, and must not reach the database (PostgreSQL refuses NUL).
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_MISSING = {"file_id": "No such File object: {}", "batch_id": "No such Batch object: {}",
            "job_id": "No such job: {}", "model_id": "The model {} does not exist"}


def json_body(limit: int = 64 * 1024 * 1024) -> dict[str, Any]:
    """The request's JSON object: valid UTF-8, at most ``MAX_JSON_DEPTH`` levels deep,
    no NUL character in any string (the database cannot store one)."""
    if (request.content_length or 0) > limit:
        raise PayloadTooLarge(f"a JSON request body is at most {limit} bytes")
    if not request.is_json:
        raise InvalidRequest("the request body must be JSON, sent with "
                             "Content-Type: application/json")
    raw = request.get_data(cache=True)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    if _NUL_ESCAPE.search(raw):
        raise InvalidRequest("strings in the request body must not contain NUL (\\u0000)")
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _too_deep(body):
        raise InvalidRequest(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    return body


def _too_deep(body: Any) -> bool:
    level = [body]
    for _ in range(MAX_JSON_DEPTH):
        deeper: list[Any] = []
        for v in level:
            for c in v.values() if isinstance(v, dict) else v:
                if isinstance(c, dict | list):
                    deeper.append(c)
        if not deeper:
            return False
        level = deeper
    return True


def check_path_ids(view_args: dict[str, Any]) -> None:
    """An id in a path that no object can have is a 404 before any lookup."""
    for name, value in view_args.items():
        if name in _MISSING and not ID.fullmatch(value):
            raise NotFound(_MISSING[name].format(shown(value)), param=name,
                           code="model_not_found" if name == "model_id" else None)


def query_text(name: str, max_len: int = 64) -> str | None:
    """A free-text query parameter, refused if it could not be stored or compared."""
    v = request.args.get(name)
    if v is not None and (len(v) > max_len or not v.isprintable()):
        raise InvalidRequest(f"{name} must be at most {max_len} printable characters",
                             param=name)
    return v


def page_params() -> tuple[str | None, int]:
    raw = request.args.get("limit", "20")
    try:
        limit = int(raw)
    except ValueError:
        raise InvalidRequest(f"limit must be an integer, got {shown(raw)}",
                             param="limit") from None
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100", param="limit")
    after = request.args.get("after") or None
    if after is not None and (len(after) > 64 or not ID.fullmatch(after)):
        raise InvalidRequest(f"after must be an object id, got {shown(after)}", param="after")
    return after, limit


def page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}


def file_object(f: File) -> dict[str, Any]:
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": f.created_at,
            "filename": f.filename, "purpose": f.purpose, "status": "processed",
            "expires_at": f.expires_at, "status_details": None}


def batch_object(b: Batch, sums: ShardSums) -> dict[str, Any]:
    """The OpenAI batch object; ``sums`` are its shards' (all zero before it has
    shards). ``usage`` is the sum of the usage of its output lines."""
    completed, failed, input_tokens, output_tokens = sums
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
        "metadata": b.metadata_, "model": b.model, "service_tier": b.service_tier,
        "usage": {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": output_tokens,
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": input_tokens + output_tokens},
    }
    return out
