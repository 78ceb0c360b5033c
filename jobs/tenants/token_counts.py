"""Token counts as the rate limits see them: what a request reserves in its
tokens-per-minute window at admission (an upper bound, from its body: the API holds no
tokenizer), and the real totals read from a response's ``usage`` to settle it with."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from jobs.protocol.endpoints import CHAT, EMBEDDINGS
from jobs.protocol.responses_request import as_chat

# Token estimates (the API holds no tokenizer). Every token of a byte-level BPE or a
# WordPiece vocabulary covers at least one byte of its text, so a text's UTF-8 length
# bounds its token count; what the model adds is bounded separately.
EMBEDDING_SPECIAL_TOKENS = 2  # [CLS] and [SEP] around each input
MESSAGE_OVERHEAD_TOKENS = 8  # a chat template's role markers around one message
PROMPT_OVERHEAD_TOKENS = 64  # its own text: a default system prompt, the generation prompt


def _text_bytes(value: Any) -> int:
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list):
        return sum(_text_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_text_bytes(v) for v in value.values())
    return 0


def embedding_tokens(inputs: Iterable[str | list[int]]) -> int:
    """Exact for token-id inputs (their ids plus the model's special tokens); an upper
    bound for texts (their UTF-8 bytes plus the special tokens)."""
    total = 0
    for x in inputs:
        total += (len(x) if isinstance(x, list) else len(x.encode())) + EMBEDDING_SPECIAL_TOKENS
    return total


def prompt_tokens(endpoint: str, body: dict[str, Any]) -> int:
    """An upper bound of the prompt tokens of a validated request body."""
    endpoint, body = as_chat(endpoint, body)  # a Responses body: its chat request's
    if endpoint == EMBEDDINGS:
        v = body.get("input")
        if isinstance(v, str):
            return embedding_tokens([v])
        if isinstance(v, list) and v and isinstance(v[0], int):
            return embedding_tokens([v])
        return embedding_tokens(v if isinstance(v, list) else [])
    if endpoint == CHAT:
        messages = body.get("messages") or []
        return PROMPT_OVERHEAD_TOKENS + sum(
            MESSAGE_OVERHEAD_TOKENS + _text_bytes(m.get("content")) + _text_bytes(m.get("name"))
            for m in messages if isinstance(m, dict))
    return PROMPT_OVERHEAD_TOKENS + _text_bytes(body.get("prompt"))


def request_tokens(endpoint: str, body: dict[str, Any], default_max_tokens: int) -> int:
    """What a request reserves in its tokens-per-minute window: its prompt's upper
    bound plus, for generation, ``max_completion_tokens``/``max_tokens`` (or
    ``default_max_tokens`` when it names none)."""
    endpoint, body = as_chat(endpoint, body)  # a Responses body: its chat request's
    tokens = prompt_tokens(endpoint, body)
    if endpoint != EMBEDDINGS:
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        tokens += int(limit) if limit else default_max_tokens
    return tokens


def usage_tokens(usage: Any) -> int | None:
    """Total tokens of an OpenAI ``usage`` object, None if it has none."""
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if isinstance(total, int):
        return total
    parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    return sum(p for p in parts if isinstance(p, int)) if any(
        isinstance(p, int) for p in parts) else None


def body_usage_tokens(body: bytes) -> int | None:
    """The total tokens of a response body that ends with its ``usage`` object (as the
    workers write them), read from its tail without parsing the whole body."""
    at = body.rfind(b'"usage":')
    if at < 0:
        return None
    try:
        return usage_tokens(orjson.loads(body[at + 8:].rstrip()[:-1]))
    except orjson.JSONDecodeError:
        return None
