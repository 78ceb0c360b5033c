"""Reading a request: its JSON body (``json_body``: valid UTF-8, not too deep, no NUL),
its query parameters (a page's ``limit`` and ``after``, free text) and the ids in its
path (``check_path_ids``: one no object can have is a 404 before any lookup)."""

from __future__ import annotations

import re
from typing import Any

import orjson
from flask import request

from jobs.core.errors import MODEL_NOT_FOUND, InvalidRequest, NotFound, PayloadTooLarge, shown

MAX_JSON_DEPTH = 64
# Every id this service hands out (and every model name) fits this; anything else
# cannot name an object, and must not reach the database (PostgreSQL refuses NUL).
ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_MISSING = {"file_id": "No such File object: {}", "batch_id": "No such Batch object: {}",
            "job_id": "No such job: {}", "model_id": "The model {} does not exist",
            "upload_id": "No such Upload object: {}"}


MAX_JSON_BODY = 64 * 1024 * 1024  # bytes of any request body but an upload's


def optional_json_body() -> dict[str, Any]:
    """A JSON body where every field is optional: none at all is ``{}``."""
    return json_body() if request.get_data(cache=True) else {}


def json_body(limit: int = MAX_JSON_BODY) -> dict[str, Any]:
    """The request's JSON object: valid UTF-8, at most ``MAX_JSON_DEPTH`` levels deep,
    no NUL character in any string (the database cannot store one)."""
    if (request.content_length or 0) > limit:
        raise PayloadTooLarge(f"a JSON request body is at most {limit} bytes")
    if not request.is_json:
        raise InvalidRequest("the request body must be JSON, sent with "
                             "Content-Type: application/json")
    raw = request.get_data(cache=True)
    if len(raw) > limit:  # a chunked body has no Content-Length to refuse it by
        raise PayloadTooLarge(f"a JSON request body is at most {limit} bytes")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidRequest(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    if b"\\u0000" in raw and _NUL_ESCAPE.search(raw):  # the regex only where it may match
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
                           code=MODEL_NOT_FOUND if name == "model_id" else None)


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
