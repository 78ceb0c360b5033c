"""The realtime lane: synchronous requests taken from the Redis realtime queues of the
models this worker holds and fed to the engines at the highest priority.

Interactive requests never wait behind a shard: they join the engine at its next
step while the shard's task keeps running. Embeddings are answered on the
request's reply list; generation streams its tokens through ``workers.lanes.streams``.

Usage is recorded here, by the worker that answered (``UsageWriter``), not by the
API: only the worker knows the request's accelerator-seconds, and it sees the end
of every answer, including streams whose client went away (billed for what was
generated until then) and API processes that died mid-request. The record's
source is ``rt:<request id>`` and a realtime message is taken by one worker only
(BRPOP), so a request is never counted twice; the write happens off the engine
thread once the answer is sent, so the one loss is a worker killed within that
write.

A request of several choices or with log probabilities (``GenRequest.fans``) streams
its choices' pieces as ``delta`` events that also carry the chunk's ``choices`` (each
with its ``index`` and the ``logprobs`` of its tokens; a choice's end is one more such
event), and its ``done`` event says ``chunked``; unstreamed, the ``done`` event carries
the answer's ``choices`` whole (workers.engines.responses). A ``delta`` event's ``text`` is
there either way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

import orjson
import redis
from opentelemetry.trace import Span, SpanKind

from jobs.batches.outputs import dumps
from jobs.core import logs, redis_keys, tracing
from jobs.core.context import Context
from jobs.core.errors import InferqError, ModelNotLoaded
from jobs.core.status import StreamEvent
from jobs.fleet import registry
from jobs.protocol.requests import CHAT, COMPLETIONS, EMBEDDINGS, parse_embeddings
from jobs.realtime import client as realtime
from jobs.slo import admission
from jobs.tenants import usage
from workers.engines.embeddings import REALTIME, seconds_of, started_of, when_all_done
from workers.engines.request import GenRequest, build_request
from workers.engines.responses import (
    Choice,
    TokenLogprob,
    chunk_choice,
    embeddings_body,
    failure,
    generation_choices,
)
from workers.lanes.streams import CancelListener, Publisher, PubSink
from workers.process import metrics

if TYPE_CHECKING:  # torch-bound (a simulated worker never imports torch)
    from workers.engines.generation import FinishReason, Usage
    from workers.models.residency import Residency

log = logging.getLogger("inferq.realtime")


class UsageWriter:
    """Records the usage of answered realtime requests on a thread of its own (never
    on the engine thread), billed to the project and key their message names."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="inferq-usage")

    def put(self, msg: dict[str, Any], kind: str, input_tokens: int, output_tokens: int,
            seconds: float) -> None:
        tenant = msg.get("tenant_id")
        if not isinstance(tenant, str):  # sent by an API that names no project
            return
        key = msg.get("api_key_id")
        e = usage.entry(self.ctx.settings, source=f"rt:{msg['id']}", tenant_id=tenant,
                        api_key_id=key if isinstance(key, str) else None, kind=kind,
                        model=str(msg["body"].get("model", "")), lane=usage.REALTIME,
                        input_tokens=input_tokens, output_tokens=output_tokens,
                        accelerator_seconds=seconds)
        self.pool.submit(self._write, e)

    def _write(self, e: usage.Entry) -> None:
        try:
            with self.ctx.db.session() as s:
                usage.record(s, e)
        except Exception as ex:  # noqa: BLE001 - the answer was sent; only its record is lost
            log.warning("usage of %s not recorded: %s", e.source, ex)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


BUSY_POLL_S = 0.05  # how soon a worker with a busy version looks again (a free one blocks)


def _enqueued_at(msg: dict[str, Any]) -> float | None:
    """When the API pushed ``msg`` (wall clock), if it says."""
    at = msg.get("enqueued_at")
    return float(at) if isinstance(at, int | float) else None


class MeteredSink(PubSink):
    """A token stream whose usage is recorded when it ends, or when its client went
    away (what was generated until then)."""

    def __init__(self, publisher: Publisher, msg: dict[str, Any], cancels: CancelListener,
                 meter: UsageWriter | None) -> None:
        super().__init__(publisher, msg["id"], cancels)
        self.msg, self.meter = msg, meter
        self.model, self.enqueued_at = str(msg["body"].get("model", "")), _enqueued_at(msg)
        self.timer = metrics.StreamTimer(usage.REALTIME, self.model, self.enqueued_at,
                                         time.time)
        self.kind = str(msg.get("kind"))
        self.streamed = bool(msg["body"].get("stream"))
        self.top: int | None = None  # alternatives per token (set by ``shape``)
        self.choices: list[Choice] | None = None  # a request that fans out: its choices

    def shape(self, req: GenRequest) -> None:
        """The request it answers, once built: whether (and how) it fans out."""
        self.top = req.logprobs
        if req.fans():
            self.choices = [Choice(i) for i in range(req.n)]

    def start(self) -> None:
        """Admitted to the engine: the end of its queue time."""
        if self.enqueued_at is not None:
            metrics.observe_queue(usage.REALTIME, self.model, time.time() - self.enqueued_at)
        super().start()

    def delta(self, text: str) -> None:
        self.timer.delta()
        super().delta(text)

    def piece(self, index: int, text: str, tokens: list[TokenLogprob] | None) -> None:
        """Part of a choice: one delta event (its chunk's choice when streamed)."""
        self.timer.delta()
        assert self.choices is not None
        c = self.choices[index]
        first = not c.parts
        c.add(text, tokens)
        ev: dict[str, Any] = {"t": StreamEvent.DELTA, "text": text, "index": index}
        if self.streamed:
            ev["choices"] = [chunk_choice(self.kind, index, text, tokens, self.top,
                                          role=first and index > 0)]
        self._send(ev)

    def choice_end(self, index: int, reason: str) -> None:
        assert self.choices is not None
        c = self.choices[index]
        c.reason = reason
        if self.streamed:
            self._send({"t": StreamEvent.DELTA, "text": "", "index": index, "choices": [
                chunk_choice(self.kind, index, "", None, self.top, finish=reason,
                             role=not c.parts and index > 0)]})

    def finish(self, reason: FinishReason, u: Usage) -> None:
        if self.choices is None:
            super().finish(reason, u)
        else:  # the answer's choices, or (streamed) that they were sent as chunks
            ev: dict[str, Any] = {"t": StreamEvent.DONE, "finish_reason": reason,
                                  "prompt_tokens": u.prompt_tokens,
                                  "completion_tokens": u.completion_tokens,
                                  "batch_rows": u.batch_rows}
            if self.streamed:
                ev["chunked"] = True
            else:
                ev["choices"] = generation_choices(self.kind, self.choices, self.top)
            self._send(ev)
        metrics.observe_request(usage.REALTIME, self.model, str(self.msg["kind"]), "ok",
                                u.accelerator_s)
        self._bill(u)

    def error(self, status: int, err: dict[str, Any]) -> None:
        metrics.observe_request(usage.REALTIME, self.model, str(self.msg["kind"]), "error",
                                None)
        super().error(status, err)

    def abandoned(self, u: Usage) -> None:
        """Called by the engine when it drops the sequence because its client left."""
        self._bill(u)

    def _bill(self, u: Usage) -> None:
        if self.meter is not None:
            self.meter.put(self.msg, usage.COMPLETIONS, u.prompt_tokens, u.completion_tokens,
                           u.accelerator_s)


class ServicedSink(MeteredSink):
    """A token stream that also reports its service to the admission model: how long
    it held a row of the decode batch (start to finish, steps shared with other work
    included) and its first step (start to first text)."""

    def __init__(self, publisher: Publisher, msg: dict[str, Any], cancels: CancelListener,
                 meter: UsageWriter | None, service: admission.ServiceMeter) -> None:
        super().__init__(publisher, msg, cancels, meter)
        self.service, self.servers = service, 1
        self.t_start: float | None = None
        self.t_first: float | None = None

    def start(self) -> None:
        self.t_start = time.perf_counter()
        super().start()

    def delta(self, text: str) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()
        super().delta(text)

    def piece(self, index: int, text: str, tokens: list[TokenLogprob] | None) -> None:
        if self.t_first is None:
            self.t_first = time.perf_counter()
        super().piece(index, text, tokens)

    def finish(self, reason: FinishReason, u: Usage) -> None:
        super().finish(reason, u)
        self._served()

    def abandoned(self, u: Usage) -> None:
        super().abandoned(u)
        self._served()

    def _served(self) -> None:
        if self.t_start is None:
            return
        end = time.perf_counter()
        first = (self.t_first or end) - self.t_start
        self.service.record(self.model, end - self.t_start, first, self.servers)


def _version(msg: dict[str, Any]) -> str | None:
    """The version the API routed a message to (None: any this worker holds)."""
    v = msg.get("version")
    return v if isinstance(v, str) else None


def log_fields(msg: Any) -> dict[str, str | None]:
    """The ids a request's log lines carry: the API request's (else the message's) and
    its project's."""
    if not isinstance(msg, dict):
        return {}
    rid, project = msg.get("request_id") or msg.get("id"), msg.get("tenant_id")
    return {"request_id": rid if isinstance(rid, str) else None,
            "project_id": project if isinstance(project, str) else None}


def trace_request(msg: Any) -> Span | None:
    """The request's CONSUMER span, child of the API's send (the message's
    ``traceparent``); None when tracing is off."""
    if not tracing.enabled() or not isinstance(msg, dict):
        return None
    body = msg.get("body")
    return tracing.start(f"realtime {msg.get('kind')}", SpanKind.CONSUMER, parent=msg,
                         attributes={"messaging.system": "redis",
                                     "messaging.message.id": str(msg.get("id")),
                                     "inferq.project_id": msg.get("tenant_id"),
                                     "gen_ai.request.model": str(body.get("model"))
                                     if isinstance(body, dict) else None})


class TracedSink:
    """A realtime stream's sink (any of the above) with the request's trace, used only
    when tracing is on: events on the request's span when the engine admits the
    sequence and at its first token, a child span for the engine step that prefilled it
    (admission to first token) and one for the decode steps that followed (first token
    to the end). Nothing per token beyond a bool check; the span ends with the stream."""

    def __init__(self, inner: MeteredSink, span: Span) -> None:
        self.inner, self.span = inner, span
        self.step: Span | None = None
        self.first, self.ended = True, False

    def start(self) -> None:
        self.inner.start()
        self.span.add_event("engine.admitted")
        self.step = tracing.child(self.span, "engine prefill")

    def delta(self, text: str) -> None:
        self._first()
        self.inner.delta(text)

    def piece(self, index: int, text: str, tokens: list[TokenLogprob] | None) -> None:
        self._first()
        self.inner.piece(index, text, tokens)

    def choice_end(self, index: int, reason: str) -> None:
        self.inner.choice_end(index, reason)

    def _first(self) -> None:
        if self.first:
            self.first = False
            self.span.add_event("first_token")
            tracing.end(self.step)
            self.step = tracing.child(self.span, "engine decode")

    def finish(self, reason: FinishReason, u: Usage) -> None:
        self.inner.finish(reason, u)
        self._end(None, u, {"inferq.finish_reason": str(reason)})

    def fail(self, error: Exception) -> None:
        self.inner.fail(error)
        self._end(error, None)

    def error(self, status: int, err: dict[str, Any]) -> None:
        self.inner.error(status, err)
        self._end(str(err.get("message", "error")), None,
                  {"http.response.status_code": status})

    def abandoned(self, u: Usage) -> None:
        self.inner.abandoned(u)
        self.span.add_event("cancelled")
        self._end(None, u)

    def cancelled(self) -> bool:
        return self.inner.cancelled()

    def _end(self, error: BaseException | str | None, u: Usage | None,
             attributes: dict[str, Any] | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        attrs = dict(attributes or {})
        if u is not None:
            attrs.update({"gen_ai.usage.input_tokens": u.prompt_tokens,
                          "gen_ai.usage.output_tokens": u.completion_tokens,
                          "inferq.accelerator_s": u.accelerator_s})
            if self.step is not None and not self.first:
                self.step.set_attribute("inferq.decode_steps", max(0, u.completion_tokens - 1))
        tracing.end(self.step, error)
        tracing.end(self.span, error, attrs)


class RealtimeConsumer(threading.Thread):
    """Blocks on the realtime queues of the model versions this worker holds (its
    ``models``, read again before each wait: a version loaded or unloaded changes
    them); started in a pool child that serves the lane.

    A message names its model and the version the API routed it to (``version``; a
    message without one is served by the version of that name this worker holds);
    ``allow`` is false while the circuit breaker is open, and the lane then leaves
    requests to other workers."""

    def __init__(self, r: redis.Redis, models: Residency, max_inputs: int,
                 allow: Callable[[], bool], meter: UsageWriter | None = None,
                 service: admission.ServiceMeter | None = None,
                 max_pending: int = 0, on_demand: bool = False) -> None:
        super().__init__(name="inferq-realtime", daemon=True)
        self.service = service  # the service measurements the heartbeat reports
        self.max_pending = max_pending  # requests taken at once: the rows of a pass
        self.r, self.models, self.max_inputs = r, models, max_inputs
        self.allow, self.meter = allow, meter
        self.on_demand = on_demand  # INFERQ_PLACEMENT=on_demand: load what is asked for
        self.publisher = Publisher(r)
        self.cancels = CancelListener(r)
        self.stopping = threading.Event()

    @property
    def queues(self) -> list[str]:
        """Its versions' queues, then its names' (requests sent with no version, by an
        API that routes by name only: served by the version of that name it holds)."""
        return ([redis_keys.realtime_queue(m) for m in self.models.refs()]
                + [redis_keys.realtime_queue(m) for m in self.models.names()]
                + ([redis_keys.REALTIME_ANY] if self.on_demand else []))

    def free_queues(self) -> tuple[list[str], bool]:
        """The queues it takes from now, and whether it left some out: those of
        embedding versions whose engine runs or holds realtime work are left out. A
        request for such a version stays on the shared queue, for whichever worker
        frees first (one queue, c servers: a worker that took it now would make it wait
        out its current realtime pass while another may be idle). Work of the other
        lanes does not count: a realtime row overtakes it at the next pass."""
        busy = self.models.busy_refs(REALTIME)
        if not busy:
            return self.queues, False
        held = self.models.residents()
        names = {r.model.name for r in held} - {r.model.name for r in held if r.ref in busy}
        return ([redis_keys.realtime_queue(r.ref) for r in held if r.ref not in busy]
                + [redis_keys.realtime_queue(n) for n in sorted(names)]
                + ([redis_keys.REALTIME_ANY] if self.on_demand else [])), True

    def start(self) -> None:
        self.publisher.start()
        self.cancels.start()
        super().start()

    def stop(self) -> None:
        """Stop reading requests, then the stream publisher and the cancel listener."""
        self.stopping.set()
        if self.is_alive():
            self.join(timeout=5)
        for t in (self.publisher, self.cancels):
            t.stopping.set()
            t.join(timeout=5)
        if self.meter is not None:
            self.meter.close()

    def run(self) -> None:
        while not self.stopping.is_set():
            if not self.allow():
                time.sleep(0.5)
                continue
            # Holds nothing yet: a load command is on its way.
            if not self.queues and not self.on_demand:
                time.sleep(0.2)
                continue
            queues, some_busy = self.free_queues()
            if not queues:  # every engine busy: the requests wait on the shared queue
                self.models.wait_free(REALTIME, BUSY_POLL_S)
                continue
            try:  # while some version is busy, look again soon for when it frees
                got = self.r.brpop(queues, timeout=BUSY_POLL_S if some_busy else 1)
            except redis.RedisError as e:
                log.warning("realtime lane: %s; retrying", e)
                time.sleep(1)
                continue
            if got is None or self.back(got[0], got[1]):
                continue
            name = got[0].decode() if isinstance(got[0], bytes) else got[0]
            engines = self.models.embedding_queue_refs(name[len(redis_keys.realtime_queue("")):])
            more = self.fill(name) if engines else []
            if not more:
                self.take(got[1])
                continue
            with self.models.gathering(engines):  # taken together: one pass
                for raw in (got[1], *more):
                    self.take(raw)

    def back(self, queue: bytes | str, raw: bytes | str) -> bool:
        """``handed_back``; a request it could not hand back (Redis failed) is taken
        here: refused if this worker does not hold its model, never dropped."""
        try:
            return self.handed_back(queue, raw)
        except redis.RedisError as e:
            log.warning("realtime lane: could not hand a request back (%s); answering it", e)
            return False

    def fill(self, queue: str) -> list[bytes | str]:
        """The rest of a pass: up to ``max_pending - 1`` more requests already waiting
        on the embeddings queue the first came from (none wait there while another
        worker is free: a free worker blocked on the queue takes a request as it
        arrives). Nothing if Redis fails: the first is served alone."""
        if self.max_pending <= 1 or queue == redis_keys.REALTIME_ANY:
            return []
        n = self.max_pending - 1
        try:
            try:
                got = self.r.rpop(queue, n)
            except redis.ResponseError:  # a Redis before 6.2: no count
                pipe = self.r.pipeline(transaction=False)
                for _ in range(n):
                    pipe.rpop(queue)
                got = [x for x in pipe.execute() if x is not None]
        except redis.RedisError as e:
            log.warning("realtime lane: %s; serving the request alone", e)
            return []
        return list(got) if isinstance(got, list) else []

    def handed_back(self, queue: bytes | str, raw: bytes | str) -> bool:
        """A request popped from the queue of a version this worker no longer holds
        (unloaded while the pop was waiting) goes back to the head of that queue, for
        the worker that holds it or is loading it; True when it did."""
        name = queue.decode() if isinstance(queue, bytes) else queue
        if name == redis_keys.REALTIME_ANY or name in self.queues:
            return False
        self.r.rpush(name, raw)  # BRPOP takes from the right: next in line again
        log.info("realtime lane: a request for %s handed back (no longer held here)",
                 name[len(redis_keys.realtime_queue("")):])
        return True

    def take(self, raw: bytes | str) -> None:
        """Handle one message; whatever goes wrong is that request's error answer, and
        the lane keeps reading. Its log lines carry the request's ids; with tracing on,
        the request has a span (child of the API's send) until its answer is sent."""
        msg: Any = None
        try:
            msg = orjson.loads(raw)
        except Exception:  # noqa: BLE001 - nobody to answer: the caller times out
            log.exception("realtime request failed: not a message")
            return
        span = trace_request(msg)
        with logs.bound(**log_fields(msg)), tracing.use(span):
            try:
                self.handle(msg, span)
            except Exception as e:  # noqa: BLE001 - answered to the caller; the lane lives on
                log.exception("realtime request failed")
                tracing.end(span, error=e)
                self.answer_error(msg, e)

    def refuse_waiting(self, model_ref: str, e: Exception) -> None:
        """Answer every request waiting on ``model_ref``'s queue with a 503: its load
        failed (jobs.fleet.placement.load_failed)."""
        name, _ = registry.split_ref(model_ref)
        err = ModelNotLoaded(name)
        err.message = f"{err.message} ({name} could not be loaded: {type(e).__name__})"
        while (raw := self.r.rpop(redis_keys.realtime_queue(model_ref))) is not None:
            try:
                self.answer_error(orjson.loads(cast(bytes, raw)), err)
            except Exception:  # noqa: BLE001 - nobody to answer: the caller times out
                log.warning("realtime lane: a waiting request could not be answered")

    def answer_error(self, msg: Any, e: Exception) -> None:
        """Send ``e`` to the caller of ``msg`` (on its stream or its reply list), if the
        message says who that is."""
        if not isinstance(msg, dict) or not isinstance(msg.get("id"), str):
            return  # nobody to answer: the caller times out
        status, err = failure(e)
        try:
            if msg.get("kind") in (CHAT, COMPLETIONS):
                PubSink(self.publisher, msg["id"], self.cancels).error(status, err)
            else:
                self.reply(msg["id"], {"status": status, "error": err})
        except Exception as e2:  # noqa: BLE001 - Redis is gone; the caller times out
            log.warning("realtime lane: could not answer %s: %s", msg["id"], e2)

    def handle(self, msg: dict[str, Any], span: Span | None = None) -> None:
        if msg.get("deadline", 0) < time.time():
            tracing.end(span, attributes={"inferq.dropped": "the caller has given up"})
            return  # the caller has given up
        if self.on_demand and (v := _version(msg)) is not None:
            model = str(msg["body"].get("model", ""))
            if registry.ref(model, v) not in self.models.refs():
                self.models.load(registry.ref(model, v), "on_demand")  # in line, as asked
        if msg["kind"] in (CHAT, COMPLETIONS):
            self.handle_generation(msg, span)
        else:
            self.handle_embeddings(msg, span)

    def handle_generation(self, msg: dict[str, Any], span: Span | None = None) -> None:
        """Validate against the model (prompt length), then stream tokens back."""
        sink = (MeteredSink(self.publisher, msg, self.cancels, self.meter)
                if self.service is None else
                ServicedSink(self.publisher, msg, self.cancels, self.meter, self.service))
        try:
            gen = self.models.chat(msg["body"]["model"], _version(msg))
            req = build_request(gen.model, msg["kind"], msg["body"])
        except InferqError as e:
            sink.error(e.status, e.to_dict())
            tracing.end(span, error=e)
            return
        sink.shape(req)
        if isinstance(sink, ServicedSink):
            sink.servers = gen.max_rows  # each running sequence holds a row
        gen.submit(req, sink if span is None else TracedSink(sink, span), REALTIME)

    def handle_embeddings(self, msg: dict[str, Any], span: Span | None = None) -> None:
        """Queue the inputs; the last vector to arrive sends the whole answer."""
        rid = msg["id"]
        try:
            req = parse_embeddings(msg["body"], self.max_inputs)
            res = self.models.embedder(req.model, _version(msg))
            assert res.inputs is not None and res.engine is not None
            ids = res.inputs.prepare(req)  # refuses what the model cannot serve
        except InferqError as e:
            self.reply(rid, {"status": e.status, "error": e.to_dict()})
            tracing.end(span, error=e)
            return
        futures = res.engine.submit(ids, REALTIME)
        enqueued = _enqueued_at(msg)
        ntok = sum(map(len, ids))

        def done() -> None:
            # Queued: from the API's push until its first pass started.
            started = started_of(futures)
            queued = (None if enqueued is None or started is None
                      else max(0.0, started - enqueued))
            if queued is not None:
                metrics.observe_queue(usage.REALTIME, req.model, queued)
            try:
                body = embeddings_body(req, [f.result() for f in futures], ntok)
                self.reply(rid, {"body": orjson.Fragment(dumps(body)),
                                 **({} if queued is None else {"queued_s": queued})})
            except Exception as e:  # noqa: BLE001 - returned to the caller as its error
                status, err = failure(e)
                self.reply(rid, {"status": status, "error": err})
                metrics.observe_request(usage.REALTIME, req.model, EMBEDDINGS, "error", None)
                tracing.end(span, error=e)
                return
            tracing.end(span, attributes={"gen_ai.usage.input_tokens": ntok,
                                          "inferq.inputs": len(ids),
                                          "inferq.accelerator_s": seconds_of(futures)})
            metrics.observe_request(usage.REALTIME, req.model, EMBEDDINGS, "ok",
                                    seconds_of(futures))
            if self.service is not None:  # one pass at a time: the engine is one server
                # Its first answer is its own departure: its share of the passes (a
                # pass's whole time would count the requests batched with it twice).
                self.service.record(req.model, seconds_of(futures), seconds_of(futures))
            if self.meter is not None:
                self.meter.put(msg, usage.EMBEDDINGS_KIND, ntok, 0, seconds_of(futures))

        when_all_done(futures, done)

    def reply(self, rid: str, payload: dict[str, Any]) -> None:
        key = redis_keys.reply(rid)
        with self.r.pipeline() as p:
            p.lpush(key, orjson.dumps(payload))
            p.expire(key, realtime.REPLY_TTL_S)
            p.execute()
