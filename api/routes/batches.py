"""/v1/batches: create, retrieve, list, cancel, a batch's events (Server-Sent Events) and
its partial output."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import orjson
from flask import Response, current_app, g, request, stream_with_context
from sqlalchemy.exc import DBAPIError

from api import streams
from api.current import context
from api.idempotency import idempotent
from api.request_parsing import json_body, optional_json_body, page_params
from api.routes.contract import BINARY, PAGE, SSE, TEXT, Blueprint, one_of, parameter
from jobs.batches import partial, progress, retry, service
from jobs.batches.retry import BatchRetry
from jobs.core.settings import Settings
from jobs.protocol.batch import BatchCreate
from jobs.protocol.objects.batches import BatchObject
from jobs.protocol.objects.common import Page
from jobs.protocol.validation import parse_model

bp = Blueprint("batches", __name__, access="project")
log = logging.getLogger("inferq.api")
# The headers of a partial output's answer.
OUTPUT_HEADERS = ("inferq-next-cursor", "inferq-batch-status", "inferq-chunks", "inferq-complete")


@bp.post("/batches", body=BatchCreate, errors={403, 404})
@idempotent
def create() -> BatchObject:
    req = parse_model(BatchCreate, json_body())
    b = service.create_batch(context(), g.tenant_id, req, g.api_key_id)
    return BatchObject.of(b)


@bp.get("/batches/<batch_id>")
def retrieve(batch_id: str) -> BatchObject:
    return BatchObject.of(*service.get_batch(context(), g.tenant_id, batch_id))


@bp.get("/batches", params=PAGE)
def list_() -> Page[BatchObject]:
    after, limit = page_params()
    rows, more = service.list_batches(context(), g.tenant_id, after, limit)
    return Page[BatchObject].of([BatchObject.of(b, sums) for b, sums in rows], more)


@bp.post("/batches/<batch_id>/cancel", errors={409})
def cancel(batch_id: str) -> BatchObject:
    service.cancel_batch(context(), g.tenant_id, batch_id)
    return BatchObject.of(*service.get_batch(context(), g.tenant_id, batch_id))


@bp.get("/batches/<batch_id>/output", media={"application/jsonl": TEXT}, params=(
    parameter("partial", "query", one_of(["true"]), True,
              "the lines committed so far (the final output is output_file_id's)"),
    parameter("after", "query", TEXT,
              description="the inferq-next-cursor header of the previous answer"),
    parameter("kind", "query", one_of(partial.KINDS, default="output"))),
    headers=OUTPUT_HEADERS)
def output(batch_id: str) -> Response:
    """The output lines of the chunks committed since the cursor ``after`` while the
    batch runs (docs/API.md, Partial results); the next cursor is a response header."""
    a = request.args
    out = partial.partial_output(context(), g.tenant_id, batch_id, a.get("partial"),
                                 a.get("after") or None, a.get("kind"))
    values = (out.next_cursor, str(out.batch.status), str(out.chunks),
              "true" if out.complete else "false")
    return Response(stream_with_context(out.blocks), mimetype="application/jsonl",
                    headers={**dict(zip(OUTPUT_HEADERS, values, strict=True)),
                             "Cache-Control": "no-store"})


@bp.post("/batches/<batch_id>/retry", body=BatchRetry, optional_body=True,
         errors={409})
@idempotent
def retry_(batch_id: str) -> BatchObject:
    """A child batch of the batch's failed requests (docs/API.md, Reruns)."""
    req = parse_model(BatchRetry, optional_json_body())
    b = retry.retry(context(), g.tenant_id, batch_id, req.error_codes, g.api_key_id)
    return BatchObject.of(b)


@bp.get("/batches/<batch_id>/merged_output", errors={409}, media={
    "application/jsonl": TEXT, "application/octet-stream": BINARY})
def merged_output(batch_id: str) -> Response:
    """Each request of the batch once, with its latest result (its reruns' included)."""
    fmt, blocks = retry.merged_output(context(), g.tenant_id, batch_id)
    return Response(stream_with_context(blocks), mimetype=(
        "application/octet-stream" if fmt == "parquet" else "application/jsonl"),
        headers={"Cache-Control": "no-store"})


@bp.get("/batches/<batch_id>/events", media={"text/event-stream": SSE}, answers={
    204: "the batch has ended and the client saw its last event"}, params=(
    parameter("Last-Event-ID", "header", TEXT,
              description="the id of the last event seen: resume after it"),))
def events(batch_id: str) -> Response:
    """The batch's status changes and counts as Server-Sent Events, until its terminal
    status (docs/API.md). A bad Last-Event-ID and another project's id are plain JSON
    errors: nothing is streamed before the batch is read."""
    ctx, tenant_id = context(), g.tenant_id
    seen = progress.parse_position(request.headers.get("Last-Event-ID"))
    first = progress.read(ctx, tenant_id, batch_id)
    progress.check_resumable(first, seen)
    if first.terminal and seen.rank == progress.TERMINAL_RANK:
        return Response(status=204)  # it has ended and the client saw it: do not reconnect
    give_back = streams.take(tenant_id)
    watcher: progress.Watcher = current_app.extensions["inferq_watcher"]
    resp = Response(_sse(first, seen, watcher, ctx.settings, give_back),
                    mimetype="text/event-stream",
                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    resp.call_on_close(give_back)  # also if it was never read
    return resp


def _sse(first: progress.Snapshot, seen: progress.Position, watcher: progress.Watcher,
         st: Settings, give_back: Callable[[], None]) -> Iterator[bytes]:
    """The stream, its batch followed by the process's watcher while it is open."""
    yield f"retry: {max(int(st.events_poll_s * 1000), 1000)}\n\n".encode()
    try:
        with watcher.following(first.batch.tenant_id, first) as next_snapshot:
            for ev in progress.follow(first, seen, next_snapshot,
                                      keepalive_s=st.events_keepalive_s, max_s=st.events_max_s):
                yield b": keep-alive\n\n" if ev is None else _event(ev)
    except DBAPIError as e:  # the database went away mid-stream: the client resumes later
        log.warning("batch event stream ended: %s", e)
        yield b": the database is unavailable; reconnect with Last-Event-ID\n\n"
    finally:
        give_back()


def _event(ev: progress.Event) -> bytes:
    b = BatchObject.of(ev.snapshot.batch, ev.snapshot.sums).body()
    data = {"object": "batch.progress", "batch_id": b["id"], "status": ev.status,
            "created_at": ev.at, "request_counts": b["request_counts"], "usage": b["usage"]}
    return (f"id: {ev.id}\nevent: {ev.kind}\ndata: ".encode() + orjson.dumps(data) + b"\n\n")
