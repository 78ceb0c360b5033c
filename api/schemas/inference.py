"""The answers of the inference endpoints: embeddings, chat completions, completions, a
Response (/v1/responses), and an asynchronous job's object."""

from __future__ import annotations

from typing import Any, Literal

from api.schemas.common import Out, ReasoningTokens
from jobs.core.status import JobStatus


class Embedding(Out):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingUsage(Out):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(Out):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class CompletionUsage(Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatMessage(Out):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None


class ChatChoice(Out):
    index: int
    message: ChatMessage
    finish_reason: str
    logprobs: None


class ChatCompletion(Out):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage
    system_fingerprint: str | None


class CompletionChoice(Out):
    index: int
    text: str
    finish_reason: str
    logprobs: None


class Completion(Out):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage
    system_fingerprint: str | None


class ResponseInputTokens(Out):
    cached_tokens: int
    cache_write_tokens: int


class ResponseUsage(Out):
    input_tokens: int
    input_tokens_details: ResponseInputTokens
    output_tokens: int
    output_tokens_details: ReasoningTokens
    total_tokens: int


class OutputText(Out):
    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]]
    logprobs: list[dict[str, Any]]


class OutputMessage(Out):
    id: str
    type: Literal["message"]
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"]
    content: list[OutputText]


class IncompleteDetails(Out):
    reason: Literal["max_output_tokens"]


class ResponseReasoning(Out):
    effort: None
    summary: None


class ResponseTextFormat(Out):
    type: Literal["text"]


class ResponseText(Out):
    format: ResponseTextFormat
    verbosity: None


class ResponseObject(Out):
    """A Response (/v1/responses; jobs.protocol.responses)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    background: bool
    completed_at: int | None
    error: None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: None
    metadata: dict[str, str]
    model: str
    output: list[OutputMessage]
    parallel_tool_calls: bool
    previous_response_id: None
    prompt: None
    prompt_cache_key: None
    prompt_cache_retention: None
    reasoning: ResponseReasoning
    safety_identifier: None
    service_tier: Literal["default"]
    store: bool
    temperature: float
    text: ResponseText
    tool_choice: Literal["none"]
    tools: list[dict[str, Any]]
    top_logprobs: int
    top_p: float
    truncation: Literal["disabled"]
    usage: ResponseUsage | None
    user: str | None


class JobObject(Out):
    id: str
    object: Literal["job"]
    endpoint: str
    status: JobStatus
    created_at: int
    started_at: int | None
    completed_at: int | None
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    callback_url: str | None
    attempts: int
    model_version: str | None  # the version it was routed to (a canary's, or the default)
