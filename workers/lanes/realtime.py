"""The realtime lane: synchronous requests taken from the Redis realtime queues of the
models this worker holds and fed to the engines at the highest priority.

Interactive requests never wait behind a shard: they join the engine at its next
step while the shard's task keeps running. Embeddings are answered on the
request's reply list; generation streams its tokens through ``workers.lanes.streams``.


Its streams' sinks are ``workers.lanes.realtime_sinks``'s, and the usage of what it
answers is recorded by ``workers.lanes.usage_writer``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import orjson
import redis
from opentelemetry.trace import Span, SpanKind

from jobs.batches.outputs import dumps
from jobs.core import lanes, logs, redis_keys, refs, tracing
from jobs.core.errors import InferqError, ModelNotLoaded
from jobs.protocol.endpoints import CHAT, COMPLETIONS, EMBEDDINGS
from jobs.protocol.parsing import parse_embeddings
from jobs.realtime import client as realtime
from jobs.realtime.taken import WorkerStopping
from jobs.slo import service_rates
from jobs.tenants import limits, usage
from workers.engines.embeddings import seconds_of, started_of, when_all_done
from workers.engines.request import GenRequest, build_request
from workers.engines.responses import embeddings_body, failure
from workers.engines.scheduling import REALTIME
from workers.lanes.realtime_sinks import MeteredSink, ServicedSink, TracedSink, enqueued_at
from workers.lanes.streams import CancelListener, Publisher, PubSink
from workers.lanes.taking import Taker, as_bytes
from workers.lanes.usage_writer import UsageWriter
from workers.process import metrics
from workers.process.heartbeat import worker_name

if TYPE_CHECKING:  # torch-bound (a simulated worker never imports torch)
    from workers.models.residency import Residency

log = logging.getLogger("inferq.realtime")

BUSY_POLL_S = 0.05  # how soon a worker with a busy version looks again (a free one blocks)


def _version(msg: dict[str, Any]) -> str | None:
    """The version the API routed a message to (None: any this worker holds)."""
    v = msg.get("version")
    return v if isinstance(v, str) else None


def check_reservation(msg: dict[str, Any], req: GenRequest) -> None:
    """400 when the request's sequences times its max_tokens (by default what its
    prompt leaves of the context) exceed what the API says it may reserve."""
    cap = msg.get("max_reserved_tokens")
    if not isinstance(cap, int) or cap <= 0:
        return
    named = "best_of" if req.best_of > req.n else "n"
    if (refused := limits.reservation_refused(cap, req.best_of, req.max_new_tokens,
                                              named)) is not None:
        raise refused


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
                 service: service_rates.ServiceMeter | None = None,
                 max_pending: int = 0, on_demand: bool = False, name: str = "",
                 draining: Callable[[], bool] | None = None, drain_s: float = 0.0) -> None:
        super().__init__(name="inferq-realtime", daemon=True)
        self.service = service  # the service measurements the heartbeat reports
        self.max_pending = max_pending  # requests taken at once: the rows of a pass
        self.r, self.models, self.max_inputs = r, models, max_inputs
        self.allow, self.meter = allow, meter
        self.on_demand = on_demand  # INFERQ_PLACEMENT=on_demand: load what is asked for
        self.publisher = Publisher(r)
        self.cancels = CancelListener(r)
        self.stopping = threading.Event()
        # Taking reliably, and what it has taken and not answered (workers.lanes.taking).
        self.taker = Taker(r, name or f"{worker_name()}:{id(self):x}", self.publisher)
        # SIGTERM: ``draining()`` turns true; it stops taking, and what it holds gets
        # ``drain_s`` from then to end (``drain``).
        self.draining = draining or (lambda: False)
        self.drain_s, self.drain_by = drain_s, 0.0

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
        self.taker.start()
        super().start()

    def stop(self) -> None:
        """Stop reading requests, then the stream publisher (what it holds is sent), what
        is still taken goes to other workers (``Taker.close``), then the cancel listener."""
        self.stopping.set()
        if self.is_alive():
            self.join(timeout=5)
        self.publisher.stopping.set()
        self.publisher.join(timeout=5)
        self.taker.close()
        self.cancels.stopping.set()
        self.cancels.join(timeout=5)
        if self.meter is not None:
            self.meter.close()

    def drain(self) -> bool:
        """Stop taking requests and wait for those taken to be answered, until ``drain_s``
        after the stop began (SIGTERM); those still open then end with a 503
        ``worker_stopping`` (a stream: its error event, its sequence dropped). True when
        all were answered."""
        if not self.drain_by:
            self.drain_by = time.monotonic() + self.drain_s
        self.stopping.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)
        left = self.taker.wait_answered(self.drain_by)
        for rid in left:
            err = WorkerStopping(f"this worker was stopping and could not finish the request "
                                 f"within its {self.drain_s:.0f} s drain; retry it")
            sink = self.taker.sinks.get(rid)
            if sink is not None:
                sink.error(err.status, err.to_dict())
            else:
                self.reply(rid, {"status": err.status, "error": err.to_dict()})
        if left:
            log.warning("realtime lane stopping: %d requests ended unfinished "
                        "(worker_stopping)", len(left))
        return not left

    def run(self) -> None:
        while not self.stopping.is_set():
            if self.draining():  # SIGTERM: its queues are left to other workers
                self.drain_by = time.monotonic() + self.drain_s
                log.info("realtime lane: stopping, no more requests taken")
                return
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
                got = self.taker.take(queues, timeout=BUSY_POLL_S if some_busy else 1)
            except redis.RedisError as e:
                log.warning("realtime lane: %s; retrying", e)
                time.sleep(1)
                continue
            if got is None or self.back(got[0], got[1][0]):
                continue
            name, first = got[0], got[1][0]
            engines = self.models.embedding_queue_refs(name[len(redis_keys.realtime_queue("")):])
            more = self.fill(name) if engines else []
            if not more:
                self.take(first)
                continue
            with self.models.gathering(engines):  # taken together: one pass
                for raw in (first, *more):
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
        try:
            got = self.taker.take_now([queue], self.max_pending - 1)
        except redis.RedisError as e:
            log.warning("realtime lane: %s; serving the request alone", e)
            return []
        return list(got[1]) if got is not None else []

    def handed_back(self, queue: bytes | str, raw: bytes | str) -> bool:
        """A request popped from the queue of a version this worker no longer holds
        (unloaded while the pop was waiting) goes back to the head of that queue, for
        the worker that holds it or is loading it; True when it did."""
        name = queue.decode() if isinstance(queue, bytes) else queue
        if name == redis_keys.REALTIME_ANY or name in self.queues:
            return False
        self.taker.give_back(name, as_bytes(raw))  # taken from the right: next in line again
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
            self.taker.forget(as_bytes(raw), "")
            return
        self.taker.hold(msg, as_bytes(raw))  # until its answer
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
        name, _ = refs.split_ref(model_ref)
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
                rid = msg["id"]
                PubSink(self.publisher, rid, self.cancels,
                        on_end=lambda: self.taker.stream_ended(rid)).error(status, err)
            else:
                self.reply(msg["id"], {"status": status, "error": err})
        except Exception as e2:  # noqa: BLE001 - Redis is gone; the caller times out
            log.warning("realtime lane: could not answer %s: %s", msg["id"], e2)

    def handle(self, msg: dict[str, Any], span: Span | None = None) -> None:
        if msg.get("deadline", 0) < time.time():
            tracing.end(span, attributes={"inferq.dropped": "the caller has given up"})
            self.taker.answered(str(msg.get("id")))
            return  # the caller has given up
        if self.on_demand and (v := _version(msg)) is not None:
            model = str(msg["body"].get("model", ""))
            if refs.model_ref(model, v) not in self.models.refs():
                self.models.load(refs.model_ref(model, v), "on_demand")  # in line, as asked
        if msg["kind"] in (CHAT, COMPLETIONS):
            self.handle_generation(msg, span)
        else:
            self.handle_embeddings(msg, span)

    def handle_generation(self, msg: dict[str, Any], span: Span | None = None) -> None:
        """Validate against the model (prompt length) and the tokens it may reserve,
        then stream tokens back; the engine shares its rows among projects."""
        sink = self.sink_for(msg)
        try:
            gen = self.models.chat(msg["body"]["model"], _version(msg))
            req = build_request(gen.model, msg["kind"], msg["body"])
            req.project = str(msg.get("tenant_id") or "")  # its share of the rows
            check_reservation(msg, req)
        except InferqError as e:
            sink.error(e.status, e.to_dict())
            tracing.end(span, error=e)
            return
        sink.shape(req)
        if isinstance(sink, ServicedSink):
            sink.servers = gen.max_rows  # each running sequence holds a row
        if not self.taker.start_work(sink.rid):  # another worker has it now: it answers
            tracing.end(span, attributes={"inferq.dropped": "given to another worker"})
            return
        gen.submit(req, sink if span is None else TracedSink(sink, span), REALTIME)

    def sink_for(self, msg: dict[str, Any]) -> MeteredSink:
        """The sink of a generation's stream, held until its last event."""
        rid = msg["id"]
        sink = (MeteredSink(self.publisher, msg, self.cancels, self.meter,
                            on_end=lambda: self.taker.stream_ended(rid))
                if self.service is None else
                ServicedSink(self.publisher, msg, self.cancels, self.meter, self.service,
                             on_end=lambda: self.taker.stream_ended(rid)))
        self.taker.sinks[rid] = sink
        return sink

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
        enqueued = enqueued_at(msg)
        ntok = sum(map(len, ids))

        def done() -> None:
            # Queued: from the API's push until its first pass started.
            started = started_of(futures)
            queued = (None if enqueued is None or started is None
                      else max(0.0, started - enqueued))
            if queued is not None:
                metrics.observe_queue(lanes.REALTIME, req.model, queued)
            try:
                body = embeddings_body(req, [f.result() for f in futures], ntok)
                self.reply(rid, {"body": orjson.Fragment(dumps(body)),
                                 **({} if queued is None else {"queued_s": queued})})
            except Exception as e:  # noqa: BLE001 - returned to the caller as its error
                status, err = failure(e)
                self.reply(rid, {"status": status, "error": err})
                metrics.observe_request(lanes.REALTIME, req.model, EMBEDDINGS, "error", None)
                tracing.end(span, error=e)
                return
            tracing.end(span, attributes={"gen_ai.usage.input_tokens": ntok,
                                          "inferq.inputs": len(ids),
                                          "inferq.accelerator_s": seconds_of(futures)})
            metrics.observe_request(lanes.REALTIME, req.model, EMBEDDINGS, "ok",
                                    seconds_of(futures))
            if self.service is not None:  # one pass at a time: the engine is one server
                # Its first answer is its own departure: its share of the passes (a
                # pass's whole time would count the requests batched with it twice).
                self.service.record(req.model, seconds_of(futures), seconds_of(futures))
            if self.meter is not None:
                self.meter.put(msg, usage.EMBEDDINGS_KIND, ntok, 0, seconds_of(futures))

        when_all_done(futures, done)

    def reply(self, rid: str, payload: dict[str, Any]) -> None:
        """The whole answer of ``rid``, on its reply list; no longer held (at once)."""
        key = redis_keys.reply(rid)
        with self.r.pipeline() as p:
            p.lpush(key, orjson.dumps(payload))
            p.expire(key, realtime.REPLY_TTL_S)
            self.taker.answered(rid, p)
            p.execute()
