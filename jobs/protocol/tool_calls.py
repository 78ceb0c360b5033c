"""Tool calls read back from the generated text: whole (``parse``,
``rewrite_completion``) or as it streams (``CallStream``, ``ChunkCalls``).

A request's function tools are given to the model's chat template (``tools``); the
model writes each call the Hermes / Qwen way, ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>``, and the answer's text is read back here: each such block whose
JSON names one of the request's functions and holds an ``arguments`` object is a call
(``call_…`` id, the arguments as a JSON string), the rest of the text the message's
content (null when only calls are left). A block that is not such a call stays in the
content as written. With ``parallel_tool_calls: false`` only the first call is taken.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Any

import orjson

from jobs.protocol.objects.inference import ChatCompletion, ToolCall, ToolCallFunction
from jobs.protocol.tool_use import CLOSE, OPEN, Tools

BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


def call_id() -> str:
    return "call_" + secrets.token_urlsafe(18).replace("-", "a").replace("_", "b")


@dataclass(frozen=True)
class Call:
    """A call read from the answer: the function's name and its arguments (JSON)."""

    name: str
    arguments: str
    id: str = field(default_factory=call_id)

    def tool_call(self) -> ToolCall:
        return ToolCall(id=self.id, function=ToolCallFunction(name=self.name,
                                                              arguments=self.arguments))


def read_call(block: str, names: set[str]) -> Call | None:
    """The call a ``<tool_call>`` block's inside holds, or None."""
    try:
        obj = orjson.loads(block.strip())
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(args, dict) or obj["name"] not in names:
        return None
    return Call(obj["name"], orjson.dumps(args).decode())


def parse(text: str, tools: Tools) -> tuple[str | None, list[Call]]:
    """The answer's content (None when only calls are left) and its calls."""
    calls: list[Call] = []
    kept: list[str] = []
    at = 0
    names = tools.names()
    for m in BLOCK.finditer(text):
        call = None if (calls and not tools.parallel) else read_call(m.group(1), names)
        kept.append(text[at:m.start()] if call is not None else text[at:m.end()])
        at = m.end()
        if call is not None:
            calls.append(call)
    kept.append(text[at:])
    if not calls:
        return text, []
    content = "".join(kept).strip()
    return content or None, calls


def finish_reason(reason: str, calls: list[Call]) -> str:
    """``tool_calls`` for an answer that ended (not cut short) with calls."""
    return "tool_calls" if calls and reason == "stop" else reason


def rewrite_completion(body: ChatCompletion, tools: Tools | None) -> ChatCompletion:
    """A chat.completion with each choice's calls read from its content (in place)."""
    if tools is None:
        return body
    for choice in body.choices:
        content, calls = parse(choice.message.content or "", tools)
        if calls:
            choice.message.content = content
            choice.message.tool_calls = [c.tool_call() for c in calls]
            choice.finish_reason = finish_reason(choice.finish_reason, calls)
    return body


class CallStream:
    """Calls read from an answer as it streams: ``feed`` takes each piece of text and
    returns what can be told so far, text (``str``) and whole calls (``Call``), in
    order; text that may be the start of a ``<tool_call>`` is held until it is known.
    ``finish`` returns what is left."""

    def __init__(self, tools: Tools) -> None:
        self.tools, self.names = tools, tools.names()
        self.pending = ""
        self.space = ""
        self.calls: list[Call] = []

    def feed(self, text: str) -> list[str | Call]:
        self.pending += text
        out: list[str | Call] = []
        while True:
            start = self.pending.find(OPEN)
            if start < 0:
                keep = _open_prefix(self.pending)
                out += self._text(self.pending[:len(self.pending) - keep])
                self.pending = self.pending[len(self.pending) - keep:]
                return out
            end = self.pending.find(CLOSE, start)
            if end < 0:
                out += self._text(self.pending[:start])
                self.pending = self.pending[start:]
                return out
            block = self.pending[start + len(OPEN):end]
            call = (None if (self.calls and not self.tools.parallel) else
                    read_call(block, self.names))
            if call is None:
                out += self._text(self.pending[:end + len(CLOSE)])
            else:
                out += self._text(self.pending[:start])
                self.calls.append(call)
                out.append(call)
            self.pending = self.pending[end + len(CLOSE):]

    def _text(self, text: str) -> list[str | Call]:
        """Text to show; space alone is held until more text comes (the space around
        calls is not content)."""
        if not text.strip():
            self.space += text
            return []
        text, self.space = self.space + text, ""
        return [text]

    def finish(self) -> list[str | Call]:
        rest, self.pending = self.pending, ""
        out = self._text(rest)
        if not self.calls and self.space:
            out.append(self.space)
        self.space = ""
        return out


def _open_prefix(text: str) -> int:
    """How many characters at the end of ``text`` may begin ``<tool_call>``."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:n]):
            return n
    return 0


class ChunkCalls:
    """The chunks of a streamed chat answer with their calls read back: each choice's
    text goes through its own ``CallStream``; a call is a chunk of its own whose
    ``delta.tool_calls`` holds it whole (``index``: its place among the choice's calls),
    and a choice that ended with calls ends with ``finish_reason: "tool_calls"``."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.streams: dict[int, CallStream] = {}

    def rewrite(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if not chunk.get("choices"):
            return [chunk]
        return [{**chunk, "choices": [c]} for choice in chunk["choices"]
                for c in self._choice(choice)]

    def _choice(self, choice: dict[str, Any]) -> list[dict[str, Any]]:
        index = int(choice["index"])
        stream = self.streams.setdefault(index, CallStream(self.tools))
        delta = dict(choice["delta"])
        had_content = "content" in delta
        pieces = stream.feed(delta.pop("content", None) or "")
        finish = choice.get("finish_reason")
        if finish is not None:
            pieces += stream.finish()
        out: list[dict[str, Any]] = []
        head = {**delta}  # the role, on the choice's first chunk
        logprobs = choice.get("logprobs")
        for piece in pieces:
            if isinstance(piece, str):
                d: dict[str, Any] = {**head, "content": piece}
            else:
                at = stream.calls.index(piece)
                d = {**head, "tool_calls": [{"index": at, **piece.tool_call().body()}]}
            out.append({"index": index, "delta": d, "finish_reason": None,
                        "logprobs": logprobs})
            head, logprobs = {}, None
        if not out and (head or logprobs is not None):
            out.append({"index": index, "delta": {**head, "content": ""} if had_content
                        else head, "finish_reason": None, "logprobs": logprobs})
        if finish is not None:
            out.append({"index": index, "delta": {}, "logprobs": None,
                        "finish_reason": finish_reason(finish, stream.calls)})
        return out
