"""Batch results: every output line, error line and Parquet output row is built here.

A batch's results are OpenAI batch-output JSONL lines
(``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``):
a request that ran has a ``response`` (its body is the endpoint's response, or an
OpenAI error object for a non-200 status); a request that never ran has
``response: null`` and an ``error`` saying why.

A Parquet input gets Parquet outputs, one row per request, built from the same
lines. Columns by endpoint:

- ``/v1/embeddings``: custom_id, status_code, embedding, prompt_tokens,
  error_code, error_message
- ``/v1/chat/completions`` and ``/v1/completions``: custom_id, status_code,
  content, finish_reason, tool_calls, prompt_tokens, completion_tokens, error_code,
  error_message. ``content`` is the assistant message's text for chat and the
  generated text for completions (one column for both, so a dataset can move
  between the two endpoints without changing its readers); ``tool_calls`` the
  message's calls as JSON text (``[{id, type, function: {name, arguments}}]``), null
  when it made none.
- ``/v1/responses``: the same columns; ``content`` is the output message's text,
  ``tool_calls`` its ``function_call`` items in chat's shape,
  ``finish_reason`` ``stop`` for a completed Response and ``length`` for one that
  the token limit ended (``status: incomplete``), ``prompt_tokens`` and
  ``completion_tokens`` its ``usage.input_tokens`` and ``usage.output_tokens``.

``status_code`` is null for a request that never ran (``error_code`` says why).
The token columns of a row equal the ``usage`` of its line, and a batch's usage
is the sum over its lines (see ``Tokens``).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import orjson
import pyarrow as pa

from jobs.core.schema import new_id
from jobs.protocol.endpoints import EMBEDDINGS, RESPONSES


class Tokens(NamedTuple):
    """Tokens of one or more output lines: the prompt's and the generated ones."""

    prompt: int = 0
    completion: int = 0

    def plus(self, other: Tokens) -> Tokens:
        return Tokens(self.prompt + other.prompt, self.completion + other.completion)


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


# JSONL lines ------------------------------------------------------------------------------

def ok_line(custom_id: str, body: dict[str, Any]) -> bytes:
    """A request that ran and answered 200 with ``body``."""
    return dumps({"id": new_id("batch_req_"), "custom_id": custom_id,
                  "response": {"status_code": 200, "request_id": new_id("req_"), "body": body},
                  "error": None}) + b"\n"


def error_response_line(custom_id: str, status: int, message: str, code: str,
                        etype: str = "invalid_request_error", param: str | None = None
                        ) -> bytes:
    """A request answered with an HTTP error (its body is the OpenAI error object)."""
    return dumps({"id": new_id("batch_req_"), "custom_id": custom_id,
                  "response": {"status_code": status, "request_id": new_id("req_"),
                               "body": {"error": {"message": message, "type": etype,
                                                  "param": param, "code": code}}},
                  "error": None}) + b"\n"


def invalid_request_line(custom_id: str, message: str, code: str = "invalid_request",
                         param: str | None = None) -> bytes:
    """A request whose body does not fit its endpoint: 400, as a direct call would get."""
    return error_response_line(custom_id, 400, message, code, "invalid_request_error", param)


def unrun_line(custom_id: str, code: str, message: str) -> bytes:
    """A request that never ran (batch cancelled or expired first, shard failed)."""
    return dumps({"id": new_id("batch_req_"), "custom_id": custom_id, "response": None,
                  "error": {"code": code, "message": message}}) + b"\n"


def iter_lines(blocks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """Output lines, parsed, from a stream of JSONL blocks cut anywhere."""
    tail = b""
    for block in blocks:
        parts = (tail + block).split(b"\n")
        tail = parts.pop()
        for raw in parts:
            if raw.strip():
                yield orjson.loads(raw)
    if tail.strip():
        yield orjson.loads(tail)


def _ok_body(line: dict[str, Any]) -> dict[str, Any] | None:
    resp = line.get("response")
    if not isinstance(resp, dict) or resp.get("status_code") != 200:
        return None
    body = resp.get("body")
    return body if isinstance(body, dict) else None


def line_tokens(line: dict[str, Any]) -> Tokens:
    """The usage a line reports (zero for errors and requests that never ran)."""
    body = _ok_body(line)
    usage = (body or {}).get("usage") or {}
    if (body or {}).get("object") == "response":  # a Response's (/v1/responses) names
        return Tokens(int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0))
    return Tokens(int(usage.get("prompt_tokens") or 0),
                  int(usage.get("completion_tokens") or 0))


# Parquet rows -----------------------------------------------------------------------------

_COMMON_HEAD = [("custom_id", pa.string()), ("status_code", pa.int32())]
_COMMON_TAIL = [("error_code", pa.string()), ("error_message", pa.string())]
EMBEDDINGS_SCHEMA = pa.schema(_COMMON_HEAD + [
    ("embedding", pa.list_(pa.float32())),
    ("prompt_tokens", pa.int32()),
] + _COMMON_TAIL)
GENERATION_SCHEMA = pa.schema(_COMMON_HEAD + [
    ("content", pa.string()),
    ("finish_reason", pa.string()),
    ("tool_calls", pa.string()),
    ("prompt_tokens", pa.int32()),
    ("completion_tokens", pa.int32()),
] + _COMMON_TAIL)


def _error(line: dict[str, Any]) -> Any:
    """The error of a line: of a request that never ran, or the body of a non-200
    response."""
    resp, err = line.get("response"), line.get("error")
    if isinstance(resp, dict) and resp.get("status_code") != 200:
        sent = resp.get("body")
        if isinstance(sent, dict):
            err = sent.get("error")
    return err


def error_code(line: dict[str, Any]) -> str | None:
    """The error code of an output line (None for a success)."""
    err = _error(line)
    code = err.get("code") if isinstance(err, dict) else None
    return code if isinstance(code, str) else None


def parquet_schema(endpoint: str) -> pa.Schema:
    return EMBEDDINGS_SCHEMA if endpoint == EMBEDDINGS else GENERATION_SCHEMA


def parquet_row(endpoint: str, line: dict[str, Any]) -> dict[str, Any]:
    """One Parquet output row from one output line (any shape of line: never raises on a
    body that lacks a field, the cell is left null)."""
    schema = parquet_schema(endpoint)
    row: dict[str, Any] = dict.fromkeys(schema.names)
    row["custom_id"] = line.get("custom_id")
    resp, err = line.get("response"), _error(line)
    if isinstance(resp, dict):
        row["status_code"] = resp.get("status_code")
    body = _ok_body(line)
    if body is not None:
        tokens = line_tokens(line)
        row["prompt_tokens"] = tokens.prompt
        if endpoint == EMBEDDINGS:
            emb = (body.get("data") or [{}])[0].get("embedding")
            if isinstance(emb, str):  # encoding_format base64: little-endian float32
                emb = np.frombuffer(base64.b64decode(emb), dtype="<f4").tolist()
            row["embedding"] = emb
        elif endpoint == RESPONSES:
            row["content"], row["finish_reason"] = response_text(body)
            calls = [{"id": item.get("call_id"), "type": "function",
                      "function": {"name": item.get("name"),
                                   "arguments": item.get("arguments")}}
                     for item in body.get("output") or []
                     if isinstance(item, dict) and item.get("type") == "function_call"]
            row["tool_calls"] = orjson.dumps(calls).decode() if calls else None
            row["completion_tokens"] = tokens.completion
        else:
            choice = (body.get("choices") or [{}])[0]
            message = choice.get("message")
            row["content"] = (message.get("content") if isinstance(message, dict)
                              else choice.get("text"))
            row["finish_reason"] = choice.get("finish_reason")
            made = message.get("tool_calls") if isinstance(message, dict) else None
            row["tool_calls"] = orjson.dumps(made).decode() if made else None
            row["completion_tokens"] = tokens.completion
    if isinstance(err, dict):
        row["error_code"], row["error_message"] = err.get("code"), err.get("message")
    return row


def response_text(body: dict[str, Any]) -> tuple[str | None, str]:
    """A Response's output text (its output messages' text parts, joined) and the
    finish reason its status amounts to (``length`` when incomplete)."""
    texts = [part.get("text") or "" for item in body.get("output") or []
             if isinstance(item, dict) and item.get("type") == "message"
             for part in item.get("content") or []
             if isinstance(part, dict) and part.get("type") == "output_text"]
    reason = "length" if body.get("status") == "incomplete" else "stop"
    return ("".join(texts) if texts else None), reason


def parquet_rows(endpoint: str, blocks: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    return (parquet_row(endpoint, line) for line in iter_lines(blocks))
