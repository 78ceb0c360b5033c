"""OpenAI response bodies for text generation, shared by the API (streaming and
interactive answers) and the workers (batch output lines)."""

from __future__ import annotations

import time
from typing import Any

from jobs.core.schema import new_id


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_id(chat: bool) -> str:
    return new_id("chatcmpl-" if chat else "cmpl-")


def chat_completion(model: str, text: str, finish_reason: str, prompt_tokens: int,
                    completion_tokens: int, cid: str | None = None,
                    created: int | None = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": text, "refusal": None}
    return _completion(True, model, {"message": message}, finish_reason,
                       usage(prompt_tokens, completion_tokens), cid, created)


def text_completion(model: str, text: str, finish_reason: str, prompt_tokens: int,
                    completion_tokens: int, cid: str | None = None,
                    created: int | None = None) -> dict[str, Any]:
    return _completion(False, model, {"text": text}, finish_reason,
                       usage(prompt_tokens, completion_tokens), cid, created)


def _completion(chat: bool, model: str, content: dict[str, Any], finish_reason: str,
                use: dict[str, int], cid: str | None, created: int | None) -> dict[str, Any]:
    return {
        "id": cid or completion_id(chat), "object": "chat.completion" if chat else
        "text_completion", "created": created or int(time.time()), "model": model,
        "choices": [{"index": 0, **content, "finish_reason": finish_reason, "logprobs": None}],
        "usage": use, "system_fingerprint": None,
    }


class ChunkWriter:
    """Builds the chunks of one streamed answer (same id and created on every chunk)."""

    def __init__(self, model: str, chat: bool) -> None:
        self.model, self.chat = model, chat
        self.id = completion_id(chat)
        self.created = int(time.time())

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": None, "choices": choices, **extra}

    def _choice(self, text: str | None, finish: str | None, role: bool = False
                ) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}

    def first(self) -> dict[str, Any] | None:
        return self._chunk([self._choice("", None, role=True)]) if self.chat else None

    def delta(self, text: str) -> dict[str, Any]:
        return self._chunk([self._choice(text, None)])

    def choices(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        """A chunk of choices the worker built (several choices, log probabilities)."""
        return self._chunk(choices)

    def finish(self, reason: str) -> dict[str, Any]:
        return self._chunk([self._choice(None if self.chat else "", reason)])

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return self._chunk([], usage=usage(prompt_tokens, completion_tokens))
