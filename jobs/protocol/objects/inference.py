"""The answers of the inference endpoints: embeddings, chat completions, completions
(their choices, log probabilities and tool calls) and a Response (/v1/responses), each
built with these models by the API (interactive answers) and the workers (jobs, batch
output lines). A streamed answer's chunks and events are not modelled here: they are
Server-Sent Events (jobs.protocol.shapes, jobs.protocol.responses)."""

from __future__ import annotations

import time
from typing import Annotated, Any, ClassVar, Generic, Literal, Self, TypeVar

from pydantic import Field

from jobs.core.schema import new_id
from jobs.protocol.objects.common import Out, ReasoningTokens


def _absent(v: object) -> bool:
    return v is None


class Embedding(Out):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # base64 of little-endian float32 with encoding_format


class EmbeddingUsage(Out):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(Out):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage

    @classmethod
    def of(cls, model: str, vectors: list[Any], tokens: int) -> Self:
        """``vectors``: each input's embedding, a float32 array (sent as its numbers,
        unchecked: it is the engine's output) or its base64 text."""
        return cls(data=[Embedding.model_construct(index=i, embedding=v, object="embedding")
                         for i, v in enumerate(vectors)],
                   model=model, usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens))


class CompletionUsage(Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> Self:
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


class ToolCallFunction(Out):
    name: str
    arguments: str  # JSON text


class ToolCall(Out):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(Out):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: Annotated[list[ToolCall] | None,
                          Field(exclude_if=_absent)] = None  # sent when the answer has calls


class TopLogprob(Out):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(Out):
    token: str
    logprob: float | None
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Out):
    content: list[ChatTokenLogprob]
    refusal: None = None


class CompletionLogprobs(Out):
    tokens: list[str]
    token_logprobs: list[float | None]  # None: the first token of an echoed prompt
    top_logprobs: list[dict[str, float] | None] | None  # None: logprobs 0
    text_offset: list[int]


class ChatChoice(Out):
    index: int
    message: ChatMessage
    finish_reason: str
    logprobs: ChatLogprobs | None

    @classmethod
    def of(cls, index: int, text: str, finish_reason: str,
           logprobs: ChatLogprobs | None = None) -> Self:
        return cls(index=index, message=ChatMessage(content=text),
                   finish_reason=finish_reason, logprobs=logprobs)


class CompletionChoice(Out):
    index: int
    text: str
    finish_reason: str
    logprobs: CompletionLogprobs | None

    @classmethod
    def of(cls, index: int, text: str, finish_reason: str,
           logprobs: CompletionLogprobs | None = None) -> Self:
        return cls(index=index, text=text, finish_reason=finish_reason, logprobs=logprobs)


C = TypeVar("C", ChatChoice, CompletionChoice)


class _Answer(Out, Generic[C]):
    """A chat completion or a completion: its choices and usage."""

    id: str
    object: str
    created: int
    model: str
    choices: list[C]
    usage: CompletionUsage
    system_fingerprint: None = None
    _id_prefix: ClassVar[str]
    _choice: ClassVar[type[ChatChoice] | type[CompletionChoice]]

    @classmethod
    def of(cls, model: str, choices: list[C], usage: CompletionUsage) -> Self:
        return cls(id=new_id(cls._id_prefix), created=int(time.time()),  # type: ignore[call-arg]
                   model=model, choices=choices, usage=usage)  # (object: each kind's constant)

    @classmethod
    def of_text(cls, model: str, text: str, finish_reason: str, prompt_tokens: int,
                completion_tokens: int) -> Self:
        """An answer of one choice."""
        return cls.of(model, [cls._choice.of(0, text, finish_reason)],  # type: ignore[list-item]
                      CompletionUsage.of(prompt_tokens, completion_tokens))


class ChatCompletion(_Answer[ChatChoice]):
    object: Literal["chat.completion"] = "chat.completion"
    _id_prefix = "chatcmpl-"
    _choice = ChatChoice


class Completion(_Answer[CompletionChoice]):
    object: Literal["text_completion"] = "text_completion"
    _id_prefix = "cmpl-"
    _choice = CompletionChoice


class ResponseInputTokens(Out):
    cached_tokens: int
    cache_write_tokens: int


class ResponseUsage(Out):
    input_tokens: int
    input_tokens_details: ResponseInputTokens
    output_tokens: int
    output_tokens_details: ReasoningTokens
    total_tokens: int

    @classmethod
    def of(cls, input_tokens: int, output_tokens: int) -> Self:
        return cls(input_tokens=input_tokens,
                   input_tokens_details=ResponseInputTokens(cached_tokens=0,
                                                            cache_write_tokens=0),
                   output_tokens=output_tokens,
                   output_tokens_details=ReasoningTokens(reasoning_tokens=0),
                   total_tokens=input_tokens + output_tokens)


class OutputText(Out):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = []
    logprobs: list[dict[str, Any]] = []


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(Out):
    """The answer's message; its content is empty until its text is known."""

    id: str
    type: Literal["message"] = "message"
    status: ItemStatus
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallItem(Out):
    """A call the answer made (its arguments empty while in progress)."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class IncompleteDetails(Out):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ResponseReasoning(Out):
    effort: None = None
    summary: None = None


class ResponseText(Out):
    format: dict[str, Any]  # the request's text.format ({"type": "text"} when not given)
    verbosity: None = None


class ResponseObject(Out):
    """A Response (/v1/responses; jobs.protocol.responses builds it)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ItemStatus
    background: bool = False
    completed_at: int | None
    error: None = None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: None = None
    metadata: dict[str, str]
    model: str
    output: list[Annotated[OutputMessage | FunctionCallItem, Field(discriminator="type")]]
    parallel_tool_calls: bool
    previous_response_id: None = None
    prompt: None = None
    prompt_cache_key: None = None
    prompt_cache_retention: None = None
    reasoning: ResponseReasoning = ResponseReasoning()
    safety_identifier: None = None
    service_tier: Literal["default"] = "default"
    store: bool = False
    temperature: float | None
    text: ResponseText
    tool_choice: str | dict[str, Any]  # as requested: auto with tools, none without
    tools: list[dict[str, Any]]
    top_logprobs: int = 0
    top_p: float | None
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None
    user: str | None
