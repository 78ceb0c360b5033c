"""Tool calls: function tools as the chat template renders them, the calls read back
from the generated text, and the grammar that makes a required call certain.

A request's function tools are given to the model's chat template (``tools``); the
model writes each call the Hermes / Qwen way, ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>``, and the answer's text is read back here: each such block whose
JSON names one of the request's functions and holds an ``arguments`` object is a call
(``call_…`` id, the arguments as a JSON string), the rest of the text the message's
content (null when only calls are left). A block that is not such a call stays in the
content as written. With ``parallel_tool_calls: false`` only the first call is taken.

``tool_choice``:

- ``auto`` (the default when there are tools): the model writes text or calls, read
  back as above;
- ``required``, or a named function: the answer is constrained (llguidance, the same
  library and masks as structured outputs) to calls only, ``<tool_call>`` and a JSON
  object whose ``name`` is one of the functions (the named one) and whose ``arguments``
  validate against that function's ``parameters``; one call with
  ``parallel_tool_calls: false``, one or more otherwise;
- ``none``: the tools are not given to the template and nothing is read back: the
  answer is text.

A model serves tools when its chat template renders them (refers to ``tools``:
``renders_tools``). No torch here: the API, batch validation and the workers share it.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from jobs.core.errors import InvalidRequest, shown
from jobs.protocol.structured import Constraint, compile_error

STRICT = ConfigDict(extra="forbid", strict=True)
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
TEMPLATE_TOOLS = re.compile(r"\btools\b")
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
# A required call's JSON as ``json.dumps`` writes it: no space to wander in.
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def renders_tools(template: str | None) -> bool:
    """A chat template renders tools when it refers to them (``tools``)."""
    return bool(template) and bool(TEMPLATE_TOOLS.search(template or ""))


def chat_template(folder: Path) -> str | None:
    """A model folder's chat template as transformers finds it: ``chat_template.jinja``,
    ``chat_template.json``'s, else ``tokenizer_config.json``'s (named templates: the
    default one, or all of them)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(errors="replace")
    for name in ("chat_template.json", "tokenizer_config.json"):
        try:
            got = json.loads((folder / name).read_text()).get("chat_template")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(got, list):
            got = "\n".join(str(t.get("template", "")) for t in got if isinstance(t, dict))
        if isinstance(got, str) and got:
            return got
    return None


def no_tools(model: str) -> InvalidRequest:
    """A request with tools (or tool messages) for a model that cannot take them."""
    return InvalidRequest(f"tools: unsupported parameter: the model {shown(model)} does not "
                          "support tools: its chat template does not render tools",
                          param="tools", code="unsupported_parameter")


def _checked_name(v: str) -> str:
    if not NAME.fullmatch(v):
        raise ValueError("name: letters, digits, '_' and '-', at most 64 characters")
    return v


def _schema(v: dict[str, Any] | None) -> dict[str, Any] | None:
    if v is not None and (problem := compile_error(v)):
        raise ValueError(f"parameters: the schema cannot be enforced: {problem}")
    return v


# Requests ------------------------------------------------------------------------------------


class FunctionDefinition(BaseModel):
    """A function's definition: chat's ``function`` of a tool, and the fields of the
    Responses API's flat function tool."""

    model_config = STRICT

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _fn_name(cls, v: str) -> str:
        return _checked_name(v)

    @field_validator("parameters")
    @classmethod
    def _parameters(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return _schema(v)


class FunctionTool(BaseModel):
    """One of chat's ``tools``: ``{"type": "function", "function": {...}}``."""

    model_config = STRICT

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = STRICT

    name: str


class NamedToolChoice(BaseModel):
    """Chat's ``tool_choice`` naming a function."""

    model_config = STRICT

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ResponsesFunctionTool(FunctionDefinition):
    """One of the Responses API's ``tools``: a function tool, flat."""

    type: Literal["function"]

    def chat(self) -> dict[str, Any]:
        """As one of chat's ``tools``."""
        fn = self.model_dump(exclude_none=True, exclude={"type"})
        return {"type": "function", "function": fn}

    def echoed(self) -> dict[str, Any]:
        """As the Response object states it (every field of the SDK's FunctionTool)."""
        return {"type": "function", "name": self.name, "description": self.description,
                "parameters": self.parameters, "strict": self.strict}


class ResponsesNamedChoice(BaseModel):
    """The Responses API's ``tool_choice`` naming a function (flat)."""

    model_config = STRICT

    type: Literal["function"]
    name: str


ResponsesToolChoice = Literal["none", "auto", "required"] | ResponsesNamedChoice


class CalledFunction(BaseModel):
    model_config = STRICT

    name: str
    arguments: str


class ToolCallIn(BaseModel):
    """An earlier answer's call, in an assistant message's ``tool_calls``."""

    model_config = STRICT

    id: str = Field(max_length=256)
    type: Literal["function"]
    function: CalledFunction

    def template(self) -> dict[str, Any]:
        """As chat templates take it: the arguments as an object where they parse."""
        try:
            args: Any = orjson.loads(self.function.arguments)
        except orjson.JSONDecodeError:
            args = self.function.arguments
        return {"id": self.id, "type": "function",
                "function": {"name": self.function.name, "arguments": args}}


def check_choice(tools: list[FunctionTool] | list[ResponsesFunctionTool] | None,
                 choice: Any) -> None:
    """``tool_choice`` against the request's tools: ``required`` and a named function
    need tools, a named function one of them (ValueError)."""
    names = [t.function.name if isinstance(t, FunctionTool) else t.name for t in tools or []]
    named = (choice.function.name if isinstance(choice, NamedToolChoice) else
             choice.name if isinstance(choice, ResponsesNamedChoice) else None)
    if choice == "required" and not names:
        raise ValueError("tool_choice: 'required' needs tools")
    if named is not None and named not in names:
        raise ValueError(f"tool_choice: names the function {named!r}, which is not one of "
                         f"the tools ({', '.join(names) or 'none given'})")


# What a request asks of the engines and of its answer -----------------------------------------


@dataclass(frozen=True)
class Function:
    name: str
    description: str | None
    parameters: dict[str, Any] | None


@dataclass(frozen=True)
class Tools:
    """A request's tools as they are used: ``choice`` is ``auto``, ``required`` or the
    name of the function to call (``none`` is no Tools at all)."""

    functions: tuple[Function, ...]
    choice: str = "auto"
    parallel: bool = True

    def template(self) -> list[dict[str, Any]]:
        """The ``tools`` the chat template renders."""
        out = []
        for f in self.functions:
            fn: dict[str, Any] = {"name": f.name}
            if f.description is not None:
                fn["description"] = f.description
            fn["parameters"] = f.parameters if f.parameters is not None else NO_PARAMETERS
            out.append({"type": "function", "function": fn})
        return out

    def forced(self) -> bool:
        return self.choice != "auto"

    def callable(self) -> tuple[Function, ...]:
        if self.choice in ("auto", "required"):
            return self.functions
        return tuple(f for f in self.functions if f.name == self.choice)

    def grammar(self) -> str:
        """The Lark grammar (llguidance's, ``%json`` schemas inside) of an answer that is
        calls only: one, or one or more when calls may be parallel."""
        bodies = []
        for i, f in enumerate(self.callable()):
            schema = {"type": "object",
                      "properties": {"name": {"const": f.name},
                                     "arguments": f.parameters if f.parameters is not None
                                     else {"type": "object"}},
                      "required": ["name", "arguments"], "additionalProperties": False,
                      "x-guidance": COMPACT}
            bodies.append(f"fn{i}: %json {orjson.dumps(schema).decode()}")
        alternatives = " | ".join(f"fn{i}" for i in range(len(bodies)))
        head = "start: call (\"\\n\" call)*" if self.parallel else "start: call"
        return "\n".join([head, f"call: \"{OPEN}\" body \"{CLOSE}\"",
                          f"body: {alternatives}", *bodies]) + "\n"

    def constraint(self) -> Constraint | None:
        """What the engines enforce: calls only when a call is required."""
        if not self.forced():
            return None
        return Constraint({}, lark=self.grammar())

    def names(self) -> set[str]:
        return {f.name for f in self.callable()}


def tools_of(body: dict[str, Any]) -> Tools | None:
    """The tools of a valid chat body (a dict as sent on: ``tools``, ``tool_choice``,
    ``parallel_tool_calls``); None when there are none or ``tool_choice`` is ``none``."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    if not tools or choice == "none":
        return None
    functions = tuple(Function(t["function"]["name"], t["function"].get("description"),
                               t["function"].get("parameters")) for t in tools)
    if isinstance(choice, dict):
        picked = str(choice["function"]["name"])
    else:
        picked = str(choice or "auto")
    return Tools(functions, picked, body.get("parallel_tool_calls") is not False)


# Answers ---------------------------------------------------------------------------------------


def call_id() -> str:
    return "call_" + secrets.token_urlsafe(18).replace("-", "a").replace("_", "b")


@dataclass(frozen=True)
class Call:
    """A call read from the answer: the function's name and its arguments (JSON)."""

    name: str
    arguments: str
    id: str = field(default_factory=call_id)

    def chat(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


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


def rewrite_completion(body: dict[str, Any], tools: Tools | None) -> dict[str, Any]:
    """A chat.completion with each choice's calls read from its content (in place)."""
    if tools is None:
        return body
    for choice in body.get("choices", []):
        message = choice["message"]
        content, calls = parse(message.get("content") or "", tools)
        if calls:
            message["content"] = content
            message["tool_calls"] = [c.chat() for c in calls]
            choice["finish_reason"] = finish_reason(choice["finish_reason"], calls)
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
                d = {**head, "tool_calls": [{"index": at, **piece.chat()}]}
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
