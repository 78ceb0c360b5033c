"""The text generation request bodies: chat completions (/v1/chat/completions) and
completions (/v1/completions), their sampling parameters and messages, and the checks
of ``tool_choice`` against the tools (shared with the Responses body)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from jobs.core.errors import InvalidRequest, shown
from jobs.protocol.structured import ResponseFormat
from jobs.protocol.tools import (
    FunctionTool,
    ResponsesFunctionTool,
    ToolCallIn,
    ToolChoice,
    check_choice,
)
from jobs.protocol.validation import BODY, INT64, Name, Text

MAX_STOP = 4
# OpenAI's bounds: logit_bias entries and their values, choices, log probabilities.
MAX_LOGIT_BIAS, MAX_BIAS = 300, 100
MAX_N, MAX_BEST_OF = 128, 20
MAX_TOP_LOGPROBS, MAX_COMPLETION_LOGPROBS = 20, 5
Penalty = Annotated[float, Field(ge=-2, le=2)]


class StreamOptions(BaseModel):
    model_config = BODY

    include_usage: bool = False


class Message(BaseModel):
    model_config = BODY

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[dict[str, Any]] | None = None
    name: Annotated[Text, Field(max_length=256)] | None = None
    # an assistant message's calls, and the call a tool message answers
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: Name | None = None

    @model_validator(mode="after")
    def _tool_message(self) -> Message:
        if self.role == "tool" and (self.tool_call_id is None or self.content is None):
            raise ValueError("a tool message needs content and tool_call_id (the id of the "
                             "call it answers)")
        return self

    def uses_tools(self) -> bool:
        return self.role == "tool" or bool(self.tool_calls)

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v: Any) -> Any:
        if isinstance(v, list):
            if any(p.get("type") != "text" or not isinstance(p.get("text"), str) for p in v):
                raise ValueError("only text content parts are supported")
            return "".join(p["text"] for p in v)
        return v


class ToolUse(BaseModel):
    """``parallel_tool_calls``, and ``tool_choice`` checked against the ``tools`` and
    the structured output asked for (``constraint``): chat's body and the Responses
    API's, each declaring its own ``tools`` and ``tool_choice``."""

    model_config = BODY

    tools: list[FunctionTool] | list[ResponsesFunctionTool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None

    def constraint(self) -> ResponseFormat | None:
        raise NotImplementedError

    @model_validator(mode="after")
    def _tool_choice(self) -> Self:
        tools_checked(self.tools, self.tool_choice, self.constraint())
        return self


class Sampling(BaseModel):
    """Parameters shared by chat completions and completions."""

    model_config = BODY

    model: Name
    max_tokens: int | None = Field(default=None, ge=1, lt=2**31)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-INT64, lt=INT64)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: Name | None = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[str, float] | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Any) -> Any:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise ValueError(f"stop takes up to {MAX_STOP} non-empty strings")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        """Token ids (decimal strings) to -100..100; which ids the model has is the
        worker's to check (``workers.engines.request``)."""
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias: at most {MAX_LOGIT_BIAS} tokens, got {len(v)}")
        for k, bias in v.items():
            if not (k.isascii() and k.isdigit() and len(k) <= 10 and int(k) < 2**31):
                raise ValueError(f"logit_bias: keys are token ids (integers as strings), got "
                                 f"{shown(k, 32)}")
            if not -MAX_BIAS <= bias <= MAX_BIAS:
                raise ValueError(f"logit_bias: values are from -{MAX_BIAS} to {MAX_BIAS}, "
                                 f"got {bias:g} for token {k}")
        return v

    def token_bias(self) -> dict[int, float]:
        return {int(k): float(b) for k, b in (self.logit_bias or {}).items()}

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def token_limit(self) -> int | None:
        return self.max_tokens

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatBody(Sampling, ToolUse):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, lt=2**31)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None

    def constraint(self) -> ResponseFormat | None:
        return self.response_format

    def uses_tools(self) -> bool:
        """Tools or tool messages: the model's chat template must render them."""
        return bool(self.tools) or any(m.uses_tools() for m in self.messages)

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs: logprobs must be true when top_logprobs is set")
        return v

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def top_count(self) -> int | None:
        """Alternatives reported per token (None: no log probabilities)."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionBody(Sampling):
    prompt: Text | list[Text]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False
    best_of: int | None = Field(default=None, ge=1, le=MAX_BEST_OF)

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if v is not None and isinstance(n, int) and v < n:
            raise ValueError(f"best_of: must be at least n ({n}), got {v}")
        if v is not None and v > 1 and info.data.get("stream"):
            raise ValueError("best_of: results cannot be streamed when best_of is above 1")
        return v

    def top_count(self) -> int | None:
        return self.logprobs

    def candidates(self) -> int:
        """Sequences generated: best_of (at least n)."""
        return self.best_of or self.n

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("exactly one prompt per request is supported")
            v = v[0]
        if not v:
            raise ValueError("prompt must be a non-empty string")
        return v


def tools_checked(tools: list[FunctionTool] | list[ResponsesFunctionTool] | None,
                  choice: Any, fmt: ResponseFormat | None) -> None:
    """``tool_choice`` against the tools (and a structured output: one constraint at a
    time), each function named once; InvalidRequest naming the parameter."""
    try:
        check_choice(tools, choice)
    except ValueError as e:
        raise InvalidRequest(str(e), param="tool_choice") from None
    if choice not in (None, "none", "auto") and fmt is not None and fmt.type != "text":
        raise InvalidRequest("tool_choice: a required call and a structured output cannot "
                             "both constrain the answer", param="tool_choice")
    names = [t.function.name if isinstance(t, FunctionTool) else t.name for t in tools or []]
    if len(set(names)) < len(names):
        raise InvalidRequest("tools: two functions have the same name", param="tools")
