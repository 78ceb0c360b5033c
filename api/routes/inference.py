"""Interactive endpoints, answered by workers over the realtime lane."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from flask import Blueprint, Response, g, stream_with_context

from api import streams
from api.current import admit, context
from api.errors import error_body
from api.schemas import json_body
from jobs.core.errors import InferqError
from jobs.core.status import StreamEvent
from jobs.fleet import catalog, placement, rollout, shadow
from jobs.protocol.requests import (
    CHAT,
    COMPLETIONS,
    ChatBody,
    CompletionBody,
    ResponsesBody,
    chat_body,
    parse_embeddings,
    parse_generation,
    parse_responses,
)
from jobs.protocol.responses import EventWriter, response_body
from jobs.protocol.shapes import ChunkWriter, chat_completion, text_completion
from jobs.protocol.tools import ChunkCalls, rewrite_completion, tools_of
from jobs.realtime import shadow as mirror
from jobs.realtime.client import ON_DEMAND, RealtimeClient, TokenStream, error_from_event
from jobs.slo import admission
from jobs.tenants import limits

bp = Blueprint("inference", __name__)


@bp.post("/embeddings")
def embeddings() -> Response:
    ctx = context()
    req = parse_embeddings(json_body(), ctx.settings.max_embedding_inputs, catalog.cached(ctx))
    grant = admit(req.model, limits.embedding_tokens(req.inputs()))
    try:
        ticket = admission.admit(ctx, req.model)  # after the project's limits
    except Exception:
        limits.settle(ctx, grant, 0)
        raise
    route = rollout.route(ctx, req.model)  # a canary takes its share
    client = RealtimeClient(ctx.redis, tenant_id=g.tenant_id, api_key_id=g.api_key_id,
                            version=route.version, place=placer(ctx))
    sent = req.model_dump(exclude_none=True)
    t0 = time.perf_counter()
    try:
        answer = client.answer("embeddings", sent, ctx.settings.realtime_timeout_s)
    except Exception:
        limits.settle(ctx, grant, 0)  # not answered: its tokens are given back
        raise
    finally:
        ticket.release()
    body = answer.body
    if (real := limits.body_usage_tokens(body)) is not None:
        limits.settle(ctx, grant, real)
    if route.shadows and route.version:
        shadow.record(ctx.redis, req.model, route.version, "primary", time.perf_counter() - t0)
        mirror.mirror_embeddings(ctx, sent, body, route.shadows)
    headers = version_header(route.version)
    if answer.queued_s is not None:
        headers[QUEUE_HEADER] = f"{answer.queued_s * 1000:.1f}"
    return Response(body, mimetype="application/json", headers=headers)


VERSION_HEADER = "inferq-model-version"
QUEUE_HEADER = "inferq-queue-ms"  # how long the request waited for a model worker's engine


def version_header(version: str | None) -> dict[str, str]:
    """The version of the model that answered (a canary's, or the default's)."""
    return {VERSION_HEADER: version} if version else {}


def placer(ctx: Any) -> Any:
    """How the realtime lane places a version no live worker holds (jobs.fleet.placement), or
    the on-demand marker (INFERQ_PLACEMENT=on_demand)."""
    if ctx.settings.placement == "on_demand":
        return ON_DEMAND
    return lambda ref: placement.ensure(ctx, ref, "realtime")


@bp.post("/chat/completions")
def chat_completions() -> Any:
    return _generate(CHAT)


@bp.post("/completions")
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
    st = ctx.settings
    body = req.model_dump(exclude_none=True)
    grant = admit(req.model, limits.request_tokens(endpoint, body,
                                                   st.rate_limit_default_max_tokens),
                  stream=req.stream)
    try:
        ticket = admission.admit(ctx, req.model)  # after the project's limits
    except Exception:
        limits.settle(ctx, grant, 0)
        limits.release_stream(ctx, grant)
        raise
    route = rollout.route(ctx, req.model)  # a canary takes its share
    t0 = time.perf_counter()
    stream = TokenStream(ctx.redis, endpoint, body,
                         first_event_s=st.first_token_timeout_s, idle_s=st.no_progress_timeout_s,
                         tenant_id=g.tenant_id, api_key_id=g.api_key_id,
                         version=route.version, place=placer(ctx))

    def answered(text: str) -> None:  # mirrored once the client's answer is complete
        if route.shadows and route.version:
            shadow.record(ctx.redis, req.model, route.version, "primary",
                          time.perf_counter() - t0)
            mirror.mirror_generation(ctx, endpoint, body, text, route.shadows)

    try:
        stream.open()  # errors before any token (bad prompt, no worker) are plain 4xx/5xx
    except Exception:
        limits.settle(ctx, grant, 0)  # nothing ran: its tokens and its stream slot go back
        limits.release_stream(ctx, grant)
        ticket.release()
        raise
    if req.stream:
        resp = Response(stream_with_context(_sse(stream, req, endpoint == CHAT, grant,
                                                 answered)),
                        mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                 **version_header(route.version)})
        resp.call_on_close(lambda: limits.release_stream(ctx, grant))  # also if never read
        resp.call_on_close(ticket.release)  # out of the admission count once it ended
        if give_back is not None:
            resp.call_on_close(give_back)
        return resp
    try:
        parts, done = [], None
        for ev in stream.events():
            if ev is None:
                continue
            if ev["t"] == StreamEvent.DELTA:
                parts.append(ev["text"])
            elif ev["t"] == StreamEvent.DONE:
                done = ev
            elif ev["t"] == StreamEvent.ERROR:
                raise error_from_event(ev)
    finally:
        stream.close()
        ticket.release()
    assert done is not None
    limits.settle(ctx, grant, done["prompt_tokens"] + done["completion_tokens"])
    answered("".join(parts))
    build = chat_completion if endpoint == CHAT else text_completion
    body = build(req.model, "".join(parts), done["finish_reason"], done["prompt_tokens"],
                 done["completion_tokens"])
    if "choices" in done:  # several choices or log probabilities: as the worker built them
        body["choices"] = done["choices"]
    if endpoint == CHAT:
        rewrite_completion(body, tools_of(req.model_dump(exclude_none=True)))
    return body, 200, version_header(route.version)


def _sse(stream: TokenStream, req: ChatBody | CompletionBody, chat: bool,
         grant: limits.Grant, answered: Callable[[str], None]) -> Iterator[bytes]:
    """Headers are out: from here on every failure is an error event, then [DONE]. The
    stream's slot is renewed while it runs and given back when it ends, however.
    ``answered`` gets the whole text once the stream is done."""
    ctx = context()
    w = ChunkWriter(req.model, chat)
    tools = tools_of(req.model_dump(exclude_none=True)) if chat else None
    calls = ChunkCalls(tools) if tools is not None else None

    def events(chunk: dict[str, Any]) -> Iterator[bytes]:
        """A chunk, its calls read back (several chunks, or none while text is held)."""
        for c in calls.rewrite(chunk) if calls is not None else [chunk]:
            yield _event(c)

    parts: list[str] = []
    try:
        if (first := w.first()) is not None:
            yield _event(first)
        for ev in stream.events():
            limits.renew_stream(ctx, grant)
            if ev is None:
                yield b": keep-alive\n\n"
            elif ev["t"] == StreamEvent.DELTA:
                parts.append(ev["text"])
                # a request of several choices or with log probabilities: the chunk's
                # choices as the worker built them (index, logprobs, a choice's end)
                yield from events(w.choices(ev["choices"]) if "choices" in ev else
                                  w.delta(ev["text"]))
            elif ev["t"] == StreamEvent.DONE:
                limits.settle(ctx, grant, ev["prompt_tokens"] + ev["completion_tokens"])
                answered("".join(parts))
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
        stream.close()  # a client that went away cancels its sequence at the next step
        limits.release_stream(ctx, grant)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"




# /v1/responses: the Responses API, run as a chat request ---------------------------------


@bp.post("/responses")
def responses() -> Any:
    """Create a model response (the Responses API).

    Run as the chat request it amounts to (jobs.protocol.requests.chat_body) on the realtime
    lane, with the chat path's limits, admission, usage and tracing; answered as a
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
    st = ctx.settings
    body = chat_body(req)
    grant = admit(req.model, limits.request_tokens(CHAT, body,
                                                   st.rate_limit_default_max_tokens),
                  stream=req.stream)
    try:
        ticket = admission.admit(ctx, req.model)  # after the project's limits
    except Exception:
        limits.settle(ctx, grant, 0)
        limits.release_stream(ctx, grant)
        raise
    route = rollout.route(ctx, req.model)  # a canary takes its share
    t0 = time.perf_counter()
    stream = TokenStream(ctx.redis, CHAT, body,
                         first_event_s=st.first_token_timeout_s, idle_s=st.no_progress_timeout_s,
                         tenant_id=g.tenant_id, api_key_id=g.api_key_id,
                         version=route.version, place=placer(ctx))

    def answered(text: str) -> None:  # mirrored once the client's answer is complete
        if route.shadows and route.version:
            shadow.record(ctx.redis, req.model, route.version, "primary",
                          time.perf_counter() - t0)
            mirror.mirror_generation(ctx, CHAT, body, text, route.shadows)

    try:
        stream.open()  # errors before any token (bad prompt, no worker) are plain 4xx/5xx
    except Exception:
        limits.settle(ctx, grant, 0)  # nothing ran: its tokens and its stream slot go back
        limits.release_stream(ctx, grant)
        ticket.release()
        raise
    if req.stream:
        resp = Response(stream_with_context(_response_events(stream, req, grant, answered)),
                        mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                                 **version_header(route.version)})
        resp.call_on_close(lambda: limits.release_stream(ctx, grant))  # also if never read
        resp.call_on_close(ticket.release)
        if give_back is not None:
            resp.call_on_close(give_back)
        return resp
    try:
        parts, done = [], None
        for ev in stream.events():
            if ev is None:
                continue
            if ev["t"] == StreamEvent.DELTA:
                parts.append(ev["text"])
            elif ev["t"] == StreamEvent.DONE:
                done = ev
            elif ev["t"] == StreamEvent.ERROR:
                raise error_from_event(ev)
    finally:
        stream.close()
        ticket.release()
    assert done is not None
    limits.settle(ctx, grant, done["prompt_tokens"] + done["completion_tokens"])
    answered("".join(parts))
    return response_body(req, "".join(parts), done["finish_reason"], done["prompt_tokens"],
                         done["completion_tokens"]), 200, version_header(route.version)


def _response_events(stream: TokenStream, req: ResponsesBody, grant: limits.Grant,
                     answered: Callable[[str], None]) -> Iterator[bytes]:
    """The Responses API's events (jobs.protocol.responses.EventWriter) as Server-Sent
    Events with their names. Headers are out: from here on a failure is an ``error``
    event, and the stream ends. The stream's slot is renewed while it runs and given
    back when it ends, however."""
    ctx = context()
    w = EventWriter(req)
    try:
        for named in w.start():
            yield _named_event(named)
        for ev in stream.events():
            limits.renew_stream(ctx, grant)
            if ev is None:
                yield b": keep-alive\n\n"
            elif ev["t"] == StreamEvent.DELTA:
                for named in w.delta(ev["text"]):
                    yield _named_event(named)
            elif ev["t"] == StreamEvent.DONE:
                limits.settle(ctx, grant, ev["prompt_tokens"] + ev["completion_tokens"])
                answered(w.text())
                for named in w.finish(ev["finish_reason"], ev["prompt_tokens"],
                                      ev["completion_tokens"]):
                    yield _named_event(named)
            elif ev["t"] == StreamEvent.ERROR:
                yield _named_event(w.error(error_from_event(ev).to_dict()))
    except InferqError as e:
        yield _named_event(w.error(e.to_dict()))
    finally:
        stream.close()  # a client that went away cancels its sequence at the next step
        limits.release_stream(ctx, grant)


def _named_event(named: tuple[str, dict[str, Any]]) -> bytes:
    return b"event: " + named[0].encode() + b"\ndata: " + orjson.dumps(named[1]) + b"\n\n"
