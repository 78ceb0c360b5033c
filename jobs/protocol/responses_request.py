"""The Responses API's request body (/v1/responses), and the chat body it runs as.

A Responses request is a chat request with other names: ``instructions`` is a system
message first, ``input`` a string is one user message, and input message items (an
earlier answer's output message included) are messages, their text parts joined. It
is validated as itself (every parameter of the SDK's responses.create is in
jobs.protocol.parameters' table) and runs as the chat body ``chat_body`` makes of it,
on the chat path: the same lane, limits, admission, usage and tracing. Its answer is
the Response object built from the chat answer (jobs.protocol.responses).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, field_validator

from jobs.protocol.endpoints import CHAT, RESPONSES
from jobs.protocol.generation import ToolUse
from jobs.protocol.structured import ResponseFormat, TextFormat
from jobs.protocol.tools import ResponsesFunctionTool, ResponsesToolChoice
from jobs.protocol.validation import BODY, Name, Text, check_metadata, parse_model


class InputPart(BaseModel):
    """A text part of an input message: ``input_text``, or an earlier answer's
    ``output_text``."""

    model_config = BODY

    type: Literal["input_text", "output_text"]
    text: Text


def joined(text: str | list[InputPart]) -> str:
    """A content or an output: a string, or its parts' texts in order."""
    return text if isinstance(text, str) else "".join(p.text for p in text)


class _Item(BaseModel):
    """What every item of ``input`` may carry: its ``id`` and ``status`` (checked, else
    unused)."""

    model_config = BODY

    id: Name | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class InputItem(_Item):
    """A message item of ``input``: an easy input message, an input message or an
    earlier output message (their fields)."""

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | list[InputPart]

    def text(self) -> str:
        return joined(self.content)


class FunctionCallItem(_Item):
    """An earlier answer's ``function_call`` output item, as input."""

    type: Literal["function_call"]
    call_id: Name
    name: Name
    arguments: Text

    def call(self) -> dict[str, Any]:
        """As a chat assistant message's call."""
        return {"id": self.call_id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class FunctionCallOutputItem(_Item):
    """A ``function_call_output`` input item: a call's result, a chat tool message."""

    type: Literal["function_call_output"]
    call_id: Name
    output: Text | list[InputPart]

    def text(self) -> str:
        return joined(self.output)


def _item_type(v: Any) -> str:
    kind = v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", "message")
    return kind if kind in ("function_call", "function_call_output") else "message"


Item = Annotated[Annotated[InputItem, Tag("message")]
                 | Annotated[FunctionCallItem, Tag("function_call")]
                 | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
                 Discriminator(_item_type)]


class TextConfig(BaseModel):
    """``text``: its ``format``, chat's ``response_format`` (TEXT_CONFIG)."""

    model_config = BODY

    format: TextFormat | None = None


class ResponseStreamOptions(BaseModel):
    model_config = BODY


class ResponsesBody(ToolUse):

    model: Name
    input: Text | list[Item]
    instructions: Text | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, lt=2**31)
    metadata: dict[str, str] | None = None
    stream: bool = False
    stream_options: ResponseStreamOptions | None = None
    temperature: float = Field(default=1.0, ge=0, le=2)
    text: TextConfig | None = None
    top_p: float = Field(default=1.0, gt=0, le=1)
    user: Name | None = None
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: ResponsesToolChoice | None = None

    def constraint(self) -> ResponseFormat | None:
        fmt = self.text.format if self.text is not None else None
        return fmt.response_format() if fmt is not None else None

    def uses_tools(self) -> bool:
        """Tools or calls in the input: the model's chat template must render them."""
        return bool(self.tools) or (isinstance(self.input, list) and any(
            not isinstance(x, InputItem) for x in self.input))

    @field_validator("input")
    @classmethod
    def _input(cls, v: Any) -> Any:
        if not v:
            raise ValueError("input: expected a non-empty string or a non-empty list of "
                             "message items")
        return v

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        return check_metadata(v)


def chat_body(req: ResponsesBody) -> dict[str, Any]:
    """The chat completions body a Responses request runs as (a valid ChatBody)."""
    messages: list[dict[str, Any]] = []
    if req.instructions is not None:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        for item in req.input:
            if isinstance(item, InputItem):
                messages.append({"role": item.role, "content": item.text()})
            elif isinstance(item, FunctionCallOutputItem):
                messages.append({"role": "tool", "content": item.text(),
                                 "tool_call_id": item.call_id})
            elif messages and messages[-1]["role"] == "assistant":
                # a call follows its answer's text (or the calls before it)
                messages[-1].setdefault("tool_calls", []).append(item.call())
            else:
                messages.append({"role": "assistant", "content": None,
                                 "tool_calls": [item.call()]})
    body: dict[str, Any] = {"model": req.model, "messages": messages,
                            "temperature": req.temperature, "top_p": req.top_p}
    if req.tools:
        body["tools"] = [t.chat() for t in req.tools]
    if req.tool_choice is not None:
        c = req.tool_choice
        body["tool_choice"] = c if isinstance(c, str) else {
            "type": "function", "function": {"name": c.name}}
    if req.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    if req.max_output_tokens is not None:
        body["max_tokens"] = req.max_output_tokens
    if req.user is not None:
        body["user"] = req.user
    if req.text is not None and req.text.format is not None and \
            req.text.format.type != "text":
        body["response_format"] = req.text.format.response_format().model_dump(
            exclude_none=True)
    return body


def as_chat(endpoint: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The endpoint and body a valid request runs as: a Responses body's chat body, on
    /v1/chat/completions; any other request as it is."""
    if endpoint == RESPONSES:
        return CHAT, chat_body(parse_model(ResponsesBody, body))
    return endpoint, body
