"""The realtime lane: synchronous requests taken from the Redis realtime queues of the
models this worker holds and fed to the engines at the highest priority.

Interactive requests never wait behind a shard: they join the engine at its next
step while the shard's task keeps running. Embeddings are answered on the
request's reply list; generation streams its tokens through ``workers.streams``.

Usage is recorded here, by the worker that answered (``UsageWriter``), not by the
API: only the worker knows the request's accelerator-seconds, and it sees the end
of every answer, including streams whose client went away (billed for what was
generated until then) and API processes that died mid-request. The record's
source is ``rt:<request id>`` and a realtime message is taken by one worker only
(BRPOP), so a request is never counted twice; the write happens off the engine
thread once the answer is sent, so the one loss is a worker killed within that
write.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import redis

from jobs import realtime, usage
from jobs.context import Context
from jobs.errors import InferqError
from jobs.outputs import dumps
from jobs.requests import CHAT, COMPLETIONS, parse_embeddings
from workers.embedding_engine import REALTIME, EmbeddingEngine, seconds_of, when_all_done
from workers.generation import FinishReason, GenerationEngine, Usage
from workers.generation_request import build_request
from workers.responses import embeddings_body, failure
from workers.runtime.embeddings import EmbeddingModel
from workers.streams import CancelListener, Publisher, PubSink

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


class MeteredSink(PubSink):
    """A token stream whose usage is recorded when it ends, or when its client went
    away (what was generated until then)."""

    def __init__(self, publisher: Publisher, msg: dict[str, Any], cancels: CancelListener,
                 meter: UsageWriter | None) -> None:
        super().__init__(publisher, msg["id"], cancels)
        self.msg, self.meter = msg, meter

    def finish(self, reason: FinishReason, u: Usage) -> None:
        super().finish(reason, u)
        self._bill(u)

    def abandoned(self, u: Usage) -> None:
        """Called by the engine when it drops the sequence because its client left."""
        self._bill(u)

    def _bill(self, u: Usage) -> None:
        if self.meter is not None:
            self.meter.put(self.msg, usage.COMPLETIONS, u.prompt_tokens, u.completion_tokens,
                           u.accelerator_s)


class RealtimeConsumer(threading.Thread):
    """Blocks on the realtime queues of ``models`` (those this worker holds); started in
    a pool child that serves the lane.

    ``chat(model)`` returns the generation engine (loading the chat model on first use)
    or refuses a model this worker does not hold; ``allow`` is false while the circuit
    breaker is open, and the lane then leaves requests to other workers."""

    def __init__(self, r: redis.Redis, models: list[str], engine: EmbeddingEngine,
                 tokenizer: EmbeddingModel, max_inputs: int,
                 chat: Callable[[str], GenerationEngine], allow: Callable[[], bool],
                 meter: UsageWriter | None = None) -> None:
        super().__init__(name="inferq-realtime", daemon=True)
        self.r, self.engine, self.tokenizer, self.max_inputs = r, engine, tokenizer, max_inputs
        self.queues = [realtime.queue_for(m) for m in models]
        self.chat, self.allow, self.meter = chat, allow, meter
        self.publisher = Publisher(r)
        self.cancels = CancelListener(r)
        self.stopping = threading.Event()

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
            try:
                got = self.r.brpop(self.queues, timeout=1)
            except redis.RedisError as e:
                log.warning("realtime lane: %s; retrying", e)
                time.sleep(1)
                continue
            if got is not None:
                self.take(got[1])

    def take(self, raw: bytes | str) -> None:
        """Handle one message; whatever goes wrong is that request's error answer, and
        the lane keeps reading."""
        msg: Any = None
        try:
            msg = orjson.loads(raw)
            self.handle(msg)
        except Exception as e:  # noqa: BLE001 - answered to the caller; the lane lives on
            log.exception("realtime request failed")
            self.answer_error(msg, e)

    def answer_error(self, msg: Any, e: Exception) -> None:
        """Send ``e`` to the caller of ``msg`` (on its stream or its reply list), if the
        message says who that is."""
        if not isinstance(msg, dict) or not isinstance(msg.get("id"), str):
            return  # nobody to answer: the caller times out
        status, err = (e.status, e.to_dict()) if isinstance(e, InferqError) else failure(e)
        try:
            if msg.get("kind") in (CHAT, COMPLETIONS):
                PubSink(self.publisher, msg["id"], self.cancels).error(status, err)
            else:
                self.reply(msg["id"], {"status": status, "error": err})
        except Exception as e2:  # noqa: BLE001 - Redis is gone; the caller times out
            log.warning("realtime lane: could not answer %s: %s", msg["id"], e2)

    def handle(self, msg: dict[str, Any]) -> None:
        if msg.get("deadline", 0) < time.time():
            return  # the caller has given up
        if msg["kind"] in (CHAT, COMPLETIONS):
            self.handle_generation(msg)
        else:
            self.handle_embeddings(msg)

    def handle_generation(self, msg: dict[str, Any]) -> None:
        """Validate against the model (prompt length), then stream tokens back."""
        sink = MeteredSink(self.publisher, msg, self.cancels, self.meter)
        try:
            gen = self.chat(msg["body"]["model"])
            req = build_request(gen.model, msg["kind"], msg["body"])
        except InferqError as e:
            sink.error(e.status, e.to_dict())
            return
        gen.submit(req, sink, REALTIME)

    def handle_embeddings(self, msg: dict[str, Any]) -> None:
        """Queue the inputs; the last vector to arrive sends the whole answer."""
        rid = msg["id"]
        try:
            req = parse_embeddings(msg["body"], self.max_inputs)
            ids = self.tokenizer.prepare(req)  # refuses what the model cannot serve
        except InferqError as e:
            self.reply(rid, {"status": e.status, "error": e.to_dict()})
            return
        futures = self.engine.submit(ids, REALTIME)
        ntok = sum(map(len, ids))

        def done() -> None:
            try:
                body = embeddings_body(req, [f.result() for f in futures], ntok)
                self.reply(rid, {"body": orjson.Fragment(dumps(body))})
            except Exception as e:  # noqa: BLE001 - returned to the caller as its error
                status, err = failure(e)
                self.reply(rid, {"status": status, "error": err})
                return
            if self.meter is not None:
                self.meter.put(msg, usage.EMBEDDINGS_KIND, ntok, 0, seconds_of(futures))

        when_all_done(futures, done)

    def reply(self, rid: str, payload: dict[str, Any]) -> None:
        key = realtime.reply_key(rid)
        with self.r.pipeline() as p:
            p.lpush(key, orjson.dumps(payload))
            p.expire(key, realtime.REPLY_TTL_S)
            p.execute()
