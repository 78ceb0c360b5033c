"""Interactive endpoints, answered by workers over the realtime lane."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import orjson
from flask import Response, g, stream_with_context

from api import streams
from api.current import charge_limits, context
from api.errors import error_body
from api.request_parsing import json_body
from api.routes.contract import Blueprint
from jobs.core import refs
from jobs.core.errors import InferqError
from jobs.core.status import StreamEvent
from jobs.fleet import catalog
from jobs.protocol.embeddings import EmbeddingsBody
from jobs.protocol.endpoints import CHAT, COMPLETIONS
from jobs.protocol.generation import ChatBody, CompletionBody
from jobs.protocol.objects.inference import (
    ChatChoice,
    ChatCompletion,
    Completion,
    CompletionChoice,
    CompletionUsage,
    EmbeddingsResponse,
    ResponseObject,
)
from jobs.protocol.parsing import parse_embeddings, parse_generation, parse_responses
from jobs.protocol.responses import EventWriter, response_body
from jobs.protocol.responses_request import ResponsesBody, chat_body
from jobs.protocol.shapes import ChunkWriter
from jobs.protocol.tool_calls import ChunkCalls, rewrite_completion
from jobs.protocol.tool_use import tools_of
from jobs.realtime import serve
from jobs.realtime.client import error_from_event
from jobs.tenants import token_counts

bp = Blueprint("inference", __name__, access="project")
BUSY = {413, 429, 504}  # too many tokens, over a limit, no answer in time
VERSION_HEADER = "inferq-model-version"
QUEUE_HEADER = "inferq-queue-ms"  # how long the request waited for a model worker's engine


@bp.post("/embeddings", body=EmbeddingsBody, ok=EmbeddingsResponse, errors=BUSY,
         headers=(VERSION_HEADER, QUEUE_HEADER))
def embeddings() -> Response:
    ctx = context()
    req = parse_embeddings(json_body(), ctx.settings.max_embedding_inputs, catalog.cached(ctx))
    req.model, named = refs.split_ref(req.model)  # name@version: that version answers
    grant = charge_limits(req.model, token_counts.embedding_tokens(req.inputs()))
    answer, version = serve.embed(ctx, req.model, req.model_dump(exclude_none=True), grant,
                                  caller(), named)
    headers = version_header(version)
    if answer.queued_s is not None:
        headers[QUEUE_HEADER] = f"{answer.queued_s * 1000:.1f}"
    return Response(answer.body, mimetype="application/json", headers=headers)


def caller() -> serve.Caller:
    return serve.Caller(g.tenant_id, g.api_key_id)


def version_header(version: str | None) -> dict[str, str]:
    """The version of the model that answered (a canary's, or the default's)."""
    return {VERSION_HEADER: version} if version else {}


@bp.post("/chat/completions", body=ChatBody, ok=ChatCompletion, stream=True, errors=BUSY,
         headers=(VERSION_HEADER,))
def chat_completions() -> Any:
    return _generate(CHAT)


@bp.post("/completions", body=CompletionBody, ok=Completion, stream=True, errors=BUSY,
         headers=(VERSION_HEADER,))
def completions() -> Any:
    return _generate(COMPLETIONS)


def _generate(endpoint: str) -> Any:
    ctx = context()
    req = parse_generation(endpoint, json_body(), catalog.cached(ctx))
    if not req.stream:
        return _answer(ctx, endpoint, req, None)
    give_back = streams.take(g.tenant_id)  # 429 past the project's open streams here
    try:
        return _answer(ctx, endpoint, req, give_back)
    except BaseException:
        give_back()
        raise


def _answer(ctx: Any, endpoint: str, req: ChatBody | CompletionBody,
            give_back: Callable[[], None] | None) -> Any:
    req.model, named = refs.split_ref(req.model)  # name@version: that version answers
    body = req.model_dump(exclude_none=True)
    grant = charge_limits(req.model, token_counts.request_tokens(
        endpoint, body, ctx.settings.rate_limit_default_max_tokens), stream=req.stream)
    gen = serve.generate(ctx, endpoint, req.model, body, grant, caller(), named)
    if req.stream:
        return _streamed(gen, _sse(gen, req, endpoint == CHAT), give_back)
    done = gen.collect()
    use = CompletionUsage.of(done["prompt_tokens"], done["completion_tokens"])
    out: ChatCompletion | Completion
    if endpoint == CHAT:
        out = rewrite_completion(ChatCompletion.of(req.model, _choices(ChatChoice, done), use),
                                 tools_of(body))
    else:
        out = Completion.of(req.model, _choices(CompletionChoice, done), use)
    return out, 200, version_header(gen.version)


C = TypeVar("C", ChatChoice, CompletionChoice)


def _choices(cls: type[C], done: dict[str, Any]) -> list[C]:
    """A collected answer's choices: as the worker built them (several choices, or log
    probabilities), or its one choice."""
    if "choices" in done:
        return [cls.model_validate(c) for c in done["choices"]]
    return [cls.of(0, done["text"], done["finish_reason"])]


def _streamed(gen: serve.Generation, events: Iterator[bytes],
              give_back: Callable[[], None] | None) -> Response:
    """A stream's response: its slot, admission and the project's stream count are
    given back when it closes, also if it was never read."""
    resp = Response(stream_with_context(events), mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                             **version_header(gen.version)})
    resp.call_on_close(gen.close)
    resp.call_on_close(gen.release)
    if give_back is not None:
        resp.call_on_close(give_back)
    return resp


def _sse(gen: serve.Generation, req: ChatBody | CompletionBody, chat: bool
         ) -> Iterator[bytes]:
    """Headers are out: from here on every failure is an error event, then [DONE]."""
    w = ChunkWriter(req.model, chat)
    tools = tools_of(req.model_dump(exclude_none=True)) if chat else None
    calls = ChunkCalls(tools) if tools is not None else None

    def events(chunk: dict[str, Any]) -> Iterator[bytes]:
        """A chunk, its calls read back (several chunks, or none while text is held)."""
        for c in calls.rewrite(chunk) if calls is not None else [chunk]:
            yield _event(c)

    try:
        if (first := w.first()) is not None:
            yield _event(first)
        for ev in gen.events():
            if ev is None:
                yield b": keep-alive\n\n"
            elif ev["t"] == StreamEvent.DELTA:
                # a request of several choices or with log probabilities: the chunk's
                # choices as the worker built them (index, logprobs, a choice's end)
                yield from events(w.choices(ev["choices"]) if "choices" in ev else
                                  w.delta(ev["text"]))
            elif ev["t"] == StreamEvent.DONE:
                if not ev.get("chunked"):  # else each choice's end was its own chunk
                    yield from events(w.finish(ev["finish_reason"]))
                if req.include_usage():
                    yield _event(w.usage(ev["prompt_tokens"], ev["completion_tokens"]))
            elif ev["t"] == StreamEvent.ERROR:
                yield _event(error_body(error_from_event(ev)))
        yield b"data: [DONE]\n\n"
    except InferqError as e:
        yield _event(error_body(e))
        yield b"data: [DONE]\n\n"
    finally:
        gen.close()


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"




# /v1/responses: the Responses API, run as a chat request ---------------------------------


@bp.post("/responses", body=ResponsesBody, ok=ResponseObject, stream=True, errors=BUSY,
         headers=(VERSION_HEADER,))
def responses() -> Any:
    """Create a model response (the Responses API).

    Run as the chat request it amounts to (jobs.protocol.responses_request.chat_body) on
    the realtime lane, with the chat path's limits, admission, usage and tracing; answered as a
    Response object, or with ``stream: true`` as the Responses API's events."""
    ctx = context()
    req = parse_responses(json_body(), catalog.cached(ctx))
    if not req.stream:
        return _respond(ctx, req, None)
    give_back = streams.take(g.tenant_id)  # 429 past the project's open streams here
    try:
        return _respond(ctx, req, give_back)
    except BaseException:
        give_back()
        raise


def _respond(ctx: Any, req: ResponsesBody, give_back: Callable[[], None] | None) -> Any:
    req.model, named = refs.split_ref(req.model)  # name@version: that version answers
    body = chat_body(req)
    grant = charge_limits(req.model, token_counts.request_tokens(
        CHAT, body, ctx.settings.rate_limit_default_max_tokens), stream=req.stream)
    gen = serve.generate(ctx, CHAT, req.model, body, grant, caller(), named)
    if req.stream:
        return _streamed(gen, _response_events(gen, req), give_back)
    done = gen.collect()
    return response_body(req, done["text"], done["finish_reason"], done["prompt_tokens"],
                         done["completion_tokens"]), 200, version_header(gen.version)


def _response_events(gen: serve.Generation, req: ResponsesBody) -> Iterator[bytes]:
    """The Responses API's events (jobs.protocol.responses.EventWriter) as Server-Sent
    Events with their names. Headers are out: from here on a failure is an ``error``
    event, and the stream ends."""
    w = EventWriter(req)
    try:
        for named in w.start():
            yield _named_event(named)
        for ev in gen.events():
            if ev is None:
                yield b": keep-alive\n\n"
            elif ev["t"] == StreamEvent.DELTA:
                for named in w.delta(ev["text"]):
                    yield _named_event(named)
            elif ev["t"] == StreamEvent.DONE:
                for named in w.finish(ev["finish_reason"], ev["prompt_tokens"],
                                      ev["completion_tokens"]):
                    yield _named_event(named)
            elif ev["t"] == StreamEvent.ERROR:
                yield _named_event(w.error(error_from_event(ev).to_dict()))
    except InferqError as e:
        yield _named_event(w.error(e.to_dict()))
    finally:
        gen.close()


def _named_event(named: tuple[str, dict[str, Any]]) -> bytes:
    return b"event: " + named[0].encode() + b"\ndata: " + orjson.dumps(named[1]) + b"\n\n"
