"""The chunks of a streamed chat completion or completion (``chat.completion.chunk``,
``text_completion``): the Server-Sent Events of ``stream: true``. Whole answers are
jobs.protocol.objects.inference's models."""

from __future__ import annotations

import time
from typing import Any

from jobs.core.schema import new_id
from jobs.protocol.objects.inference import CompletionUsage


def completion_id(chat: bool) -> str:
    return new_id("chatcmpl-" if chat else "cmpl-")


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
        return self._chunk([], usage=CompletionUsage.of(prompt_tokens,
                                                         completion_tokens).body())
