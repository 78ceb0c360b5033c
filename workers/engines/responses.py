"""OpenAI-shaped response bodies built from engine results (batch lines: jobs.batches.outputs).

Generation answers of several choices or with log probabilities are built here from
what the engine gathered (``Choice``, ``TokenLogprob``): the whole body for jobs and
batch lines, the ``choices`` of a realtime answer and the choices of its stream chunks.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jobs.core.errors import InferqError
from jobs.protocol import responses as response_shapes
from jobs.protocol.embeddings import EmbeddingsBody
from jobs.protocol.endpoints import CHAT
from jobs.protocol.objects.inference import (
    ChatChoice,
    ChatCompletion,
    ChatLogprobs,
    ChatTokenLogprob,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionUsage,
    EmbeddingsResponse,
    TopLogprob,
)
from jobs.protocol.responses_request import ResponsesBody
from jobs.protocol.tool_calls import rewrite_completion
from jobs.protocol.tool_use import Tools
from jobs.protocol.validation import parse_model


def embeddings_body(req: EmbeddingsBody, vectors: list[np.ndarray], tokens: int) -> dict[str, Any]:
    out: list[Any] = []
    for v in vectors:
        if req.dimensions is not None and req.dimensions < len(v):
            v = v[: req.dimensions]
            v = v / max(float(np.linalg.norm(v)), 1e-12)
        v = np.asarray(v, dtype="<f4")
        out.append(base64.b64encode(v.tobytes()).decode() if req.encoding_format == "base64"
                   else v)
    # float32 arrays stay arrays: orjson writes them (OPT_SERIALIZE_NUMPY) as float32
    return EmbeddingsResponse.of(req.model, out, tokens).model_dump(warnings=False)


def failure(e: BaseException) -> tuple[int, dict[str, Any]]:
    """The HTTP status and OpenAI error object for an inference that raised.

    MemoryError reaches a request only after it was tried alone (the engines split
    batches that run out of memory), so it is the request's size, not a fault. An
    InferqError carries its own status: the engines' for a request whose input could
    not be computed (``workers.engines.embeddings.blame``) is a 400."""
    if isinstance(e, InferqError):
        return e.status, e.to_dict()
    if isinstance(e, MemoryError):
        return 413, {"message": str(e), "type": "invalid_request_error", "param": None,
                     "code": "request_too_large"}
    return 500, {"message": f"inference failed: {e}", "type": "server_error", "param": None,
                 "code": "server_error"}



def response_object(body: dict[str, Any], text: str, finish_reason: str, prompt_tokens: int,
                    completion_tokens: int) -> dict[str, Any]:
    """The Response (/v1/responses) of a generated answer, for its validated Responses
    ``body`` (a job's, or a shard row's): the request's settings echoed."""
    req: ResponsesBody = parse_model(ResponsesBody, body)
    return response_shapes.response_body(req, text, finish_reason, prompt_tokens,
                                         completion_tokens)


# Choices and log probabilities (chat completions and completions) ------------------------


@dataclass
class TokenLogprob:
    """One token of a choice as the log probabilities report it: its text and UTF-8
    bytes, its log probability (None: the first token of an echoed prompt, which has
    none), the most likely tokens at its position (text, bytes, log probability; None
    for that first token), and where its text starts: characters from the start of the
    prompt's text for completions (OpenAI's ``text_offset``), of the choice's for chat."""

    token: str
    bytes: list[int]
    logprob: float | None
    top: list[tuple[str, list[int], float]] | None
    offset: int


@dataclass
class Choice:
    """One choice of an answer as a gathering sink holds it; ``tokens`` is None when
    the request asked for no log probabilities."""

    index: int
    parts: list[str] = field(default_factory=list)
    tokens: list[TokenLogprob] | None = None
    reason: str = ""

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, text: str, tokens: list[TokenLogprob] | None) -> None:
        self.parts.append(text)
        if tokens is not None:
            self.tokens = (self.tokens or []) + tokens


def top_count(endpoint: str, body: dict[str, Any]) -> int | None:
    """The alternatives a valid chat or completions body asks for per token (None: no
    log probabilities)."""
    if endpoint == CHAT:
        return int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
    v = body.get("logprobs")
    return None if v is None else int(v)


def logprobs_object(endpoint: str, tokens: list[TokenLogprob] | None, top: int | None
                    ) -> ChatLogprobs | CompletionLogprobs | None:
    """A choice's (or a chunk's) ``logprobs`` in the endpoint's shape (None: not asked
    for)."""
    return (chat_logprobs if endpoint == CHAT else completion_logprobs)(tokens, top)


def chat_logprobs(tokens: list[TokenLogprob] | None, top: int | None) -> ChatLogprobs | None:
    """Chat's ``{content: [{token, logprob, bytes, top_logprobs}], refusal}``."""
    if tokens is None or top is None:
        return None
    return ChatLogprobs(content=[ChatTokenLogprob(
        token=t.token, logprob=t.logprob, bytes=t.bytes,
        top_logprobs=[TopLogprob(token=s, logprob=lp, bytes=b) for s, b, lp in t.top or []])
        for t in tokens])


def completion_logprobs(tokens: list[TokenLogprob] | None, top: int | None
                        ) -> CompletionLogprobs | None:
    """Completions' ``{tokens, token_logprobs, top_logprobs, text_offset}``
    (``top_logprobs`` null when ``logprobs`` is 0; else each position's most likely
    tokens and the sampled one)."""
    if tokens is None or top is None:
        return None
    tops: list[dict[str, float] | None] | None = None
    if top > 0:
        tops = []
        for t in tokens:
            if t.top is None or t.logprob is None:
                tops.append(None)
                continue
            d = {s: lp for s, _, lp in t.top}
            d.setdefault(t.token, t.logprob)
            tops.append(d)
    return CompletionLogprobs(tokens=[t.token for t in tokens],
                              token_logprobs=[t.logprob for t in tokens], top_logprobs=tops,
                              text_offset=[t.offset for t in tokens])


def _chat_choices(choices: list[Choice], top: int | None) -> list[ChatChoice]:
    return [ChatChoice.of(c.index, c.text, c.reason, chat_logprobs(c.tokens, top))
            for c in choices]


def _completion_choices(choices: list[Choice], top: int | None) -> list[CompletionChoice]:
    return [CompletionChoice.of(c.index, c.text, c.reason, completion_logprobs(c.tokens, top))
            for c in choices]


def generation_choices(endpoint: str, choices: list[Choice], top: int | None
                       ) -> list[dict[str, Any]]:
    """The ``choices`` of a chat.completion or text_completion."""
    if endpoint == CHAT:
        return [c.body() for c in _chat_choices(choices, top)]
    return [c.body() for c in _completion_choices(choices, top)]


def generation_body(endpoint: str, model: str, choices: list[Choice], top: int | None,
                    prompt_tokens: int, completion_tokens: int,
                    tools: Tools | None = None) -> dict[str, Any]:
    """A whole chat.completion or text_completion: every choice, with its log
    probabilities when asked for; usage counts the prompt once and every choice's
    tokens (all ``best_of`` sequences'); ``tools``: a chat request's, whose calls are
    read back from each choice's text."""
    use = CompletionUsage.of(prompt_tokens, completion_tokens)
    if endpoint == CHAT:
        chat = ChatCompletion.of(model, _chat_choices(choices, top), use)
        return rewrite_completion(chat, tools).body()
    return Completion.of(model, _completion_choices(choices, top), use).body()


def chunk_choice(endpoint: str, index: int, text: str, tokens: list[TokenLogprob] | None,
                 top: int | None, finish: str | None = None, role: bool = False
                 ) -> dict[str, Any]:
    """One choice of a streamed chunk: a text delta with the log probabilities of its
    tokens, or (``finish``) the choice's last chunk; ``role``: the choice's first chunk
    (chat: its delta names the role)."""
    logprobs = logprobs_object(endpoint, tokens, top)
    lp = logprobs.body() if logprobs is not None else None
    if endpoint != CHAT:
        return {"index": index, "text": text, "finish_reason": finish, "logprobs": lp}
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if finish is None or text:
        delta["content"] = text
    return {"index": index, "delta": delta, "finish_reason": finish, "logprobs": lp}
