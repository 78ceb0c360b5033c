"""The Responses API's objects (/v1/responses), built from a chat answer: the Response
object, shared by the API (interactive answers) and the workers (jobs, batch output
lines), and the events of a streamed one.

A Response echoes the request's settings (``instructions``, ``metadata``,
``temperature``, ``top_p``, ``max_output_tokens``, ``user``) and states what inferq
does with the parameters it takes only at their no-op values (no tools, no
reasoning, text format, no truncation, not stored), with every field the pinned SDK's
``Response`` requires, so that strict response validation passes.
"""

from __future__ import annotations

import time
from typing import Any

from jobs.models import new_id
from jobs.requests import ResponsesBody

COMPLETED, INCOMPLETE, IN_PROGRESS = "completed", "incomplete", "in_progress"


def response_id() -> str:
    return new_id("resp_")


def message_id() -> str:
    return new_id("msg_")


def status_of(finish_reason: str | None) -> str:
    """The Response's status for the chat answer's finish reason: ``length`` (the
    token limit, or the end of the context) is ``incomplete``."""
    return INCOMPLETE if finish_reason == "length" else COMPLETED


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def output_message(mid: str, text: str | None, status: str) -> dict[str, Any]:
    """The answer's one output item; ``text`` None: none of its content yet."""
    return {"id": mid, "type": "message", "status": status, "role": "assistant",
            "content": [] if text is None else [output_text(text)]}


def response_object(req: ResponsesBody, *, rid: str, created_at: int, status: str,
                    output: list[dict[str, Any]], use: dict[str, Any] | None,
                    completed_at: int | None = None) -> dict[str, Any]:
    return {
        "id": rid, "object": "response", "created_at": created_at, "status": status,
        "background": False, "completed_at": completed_at, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == INCOMPLETE
        else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": None, "metadata": dict(req.metadata or {}), "model": req.model,
        "output": output, "parallel_tool_calls": True, "previous_response_id": None,
        "prompt": None, "prompt_cache_key": None, "prompt_cache_retention": None,
        "reasoning": {"effort": None, "summary": None}, "safety_identifier": None,
        "service_tier": "default", "store": False, "temperature": req.temperature,
        "text": {"format": text_format(req), "verbosity": None}, "tool_choice": "none",
        "tools": [], "top_logprobs": 0, "top_p": req.top_p, "truncation": "disabled",
        "usage": use, "user": req.user,
    }


def text_format(req: ResponsesBody) -> dict[str, Any]:
    """The request's ``text.format`` as the Response echoes it."""
    if req.text is None or req.text.format is None:
        return {"type": "text"}
    return req.text.format.model_dump(exclude_none=True)


def response_body(req: ResponsesBody, text: str, finish_reason: str, prompt_tokens: int,
                  completion_tokens: int, rid: str | None = None,
                  created_at: int | None = None) -> dict[str, Any]:
    """The whole Response of a chat answer (its text, finish reason and usage)."""
    now = int(time.time())
    status = status_of(finish_reason)
    return response_object(req, rid=rid or response_id(), created_at=created_at or now,
                           status=status, output=[output_message(message_id(), text, status)],
                           use=usage(prompt_tokens, completion_tokens), completed_at=now)


class EventWriter:
    """The events of one streamed Response, in the Responses API's order, each with
    the next ``sequence_number``: ``start`` (response.created, response.in_progress,
    the output item and its content part added), ``delta`` for each piece of text,
    ``finish`` (the text, part and item done, then response.completed or
    response.incomplete) and ``error``. Each event is (its name, its data)."""

    def __init__(self, req: ResponsesBody) -> None:
        self.req = req
        self.id, self.message_id = response_id(), message_id()
        self.created_at = int(time.time())
        self.seq = 0
        self.parts: list[str] = []

    def _event(self, kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        out = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return kind, out

    def _response(self, status: str, output: list[dict[str, Any]],
                  use: dict[str, Any] | None, completed_at: int | None = None
                  ) -> dict[str, Any]:
        return response_object(self.req, rid=self.id, created_at=self.created_at,
                               status=status, output=output, use=use,
                               completed_at=completed_at)

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.message_id, "output_index": 0, "content_index": 0}

    def start(self) -> list[tuple[str, dict[str, Any]]]:
        started = self._response(IN_PROGRESS, [], None)
        return [self._event("response.created", response=started),
                self._event("response.in_progress", response=started),
                self._event("response.output_item.added", output_index=0,
                            item=output_message(self.message_id, None, IN_PROGRESS)),
                self._event("response.content_part.added", **self._at(),
                            part=output_text(""))]

    def delta(self, text: str) -> tuple[str, dict[str, Any]]:
        self.parts.append(text)
        return self._event("response.output_text.delta", **self._at(), delta=text,
                           logprobs=[])

    def text(self) -> str:
        return "".join(self.parts)

    def finish(self, finish_reason: str, prompt_tokens: int, completion_tokens: int
               ) -> list[tuple[str, dict[str, Any]]]:
        text, status = self.text(), status_of(finish_reason)
        item = output_message(self.message_id, text, status)
        done = self._response(status, [item], usage(prompt_tokens, completion_tokens),
                              int(time.time()))
        return [self._event("response.output_text.done", **self._at(), text=text,
                            logprobs=[]),
                self._event("response.content_part.done", **self._at(),
                            part=output_text(text)),
                self._event("response.output_item.done", output_index=0, item=item),
                self._event(f"response.{status}", response=done)]

    def error(self, err: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """An error after the stream began (an OpenAI error object's fields)."""
        return self._event("error", code=err.get("code"), message=str(err.get("message")),
                           param=err.get("param"))
