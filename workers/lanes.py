"""In-process consumers beside the Celery task: the realtime lane and the heartbeat.

The realtime consumer blocks on the Redis realtime queue and feeds the engine at
the highest priority, so interactive requests never wait behind a shard: they
join the engine at its next step while the shard's task keeps running.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import orjson
import redis

from jobs import asyncjobs, realtime, shapes
from jobs.errors import InferqError, Unavailable
from jobs.requests import CHAT, COMPLETIONS, EMBEDDINGS, parse_embeddings
from workers.embedding_engine import JOBS, REALTIME, EmbeddingEngine
from workers.generation import Collect, Usage, build_request
from workers.responses import dumps, embeddings_body, failure

log = logging.getLogger("inferq.lanes")


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class RealtimeConsumer(threading.Thread):
    def __init__(self, r: redis.Redis, engine: EmbeddingEngine, tok: Any, max_inputs: int,
                 generator: Any = None, allow: Any = lambda: True) -> None:
        super().__init__(name="inferq-realtime", daemon=True)
        self.allow = allow
        self.r, self.engine, self.tok, self.max_inputs = r, engine, tok, max_inputs
        self.generator = generator  # () -> GenerationEngine, loading the chat model once
        self.publisher = Publisher(r)
        self.cancels = CancelListener(r)
        self.stopping = threading.Event()

    def start(self) -> None:
        self.publisher.start()
        self.cancels.start()
        super().start()

    def handle_generation(self, msg: dict[str, Any]) -> None:
        """Validate against the model (prompt length), then stream tokens back."""
        sink = PubSink(self.publisher, msg["id"], self.cancels)
        try:
            if self.generator is None:
                raise Unavailable("no chat model is loaded on this worker")
            gen = self.generator()
            req = build_request(gen.model, msg["kind"], msg["body"])
        except InferqError as e:
            return sink.error(e.status, _err(e))
        gen.submit(req, sink, REALTIME)
        return None

    def run(self) -> None:
        while not self.stopping.is_set():
            if not self.allow():  # the circuit breaker is open: leave requests to others
                time.sleep(0.5)
                continue
            try:
                got = self.r.brpop([realtime.QUEUE], timeout=1)
            except redis.RedisError as e:
                log.warning("realtime lane: %s; retrying", e)
                time.sleep(1)
                continue
            if got is not None:
                self.handle(orjson.loads(got[1]))

    def handle(self, msg: dict[str, Any]) -> None:
        rid = msg["id"]
        if msg.get("deadline", 0) < time.time():
            return  # the caller has given up
        if msg["kind"] in (CHAT, COMPLETIONS):
            return self.handle_generation(msg)
        try:
            req = parse_embeddings(msg["body"], self.max_inputs)
        except InferqError as e:
            return self.reply(rid, {"status": e.status, "error": _err(e)})
        ids = self.tok.tokenize(req.inputs())
        futures = self.engine.submit(ids, REALTIME)
        ntok = sum(map(len, ids))
        remaining = [len(futures)]
        lock = threading.Lock()

        def done(_: Future[np.ndarray]) -> None:
            with lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            try:
                body = embeddings_body(req, [f.result() for f in futures], ntok)
                self.reply(rid, {"body": orjson.Fragment(dumps(body))})
            except Exception as e:  # noqa: BLE001 - returned to the caller as its error
                status, err = failure(e)
                self.reply(rid, {"status": status, "error": err})

        for f in futures:
            f.add_done_callback(done)
        return None

    def reply(self, rid: str, payload: dict[str, Any]) -> None:
        key = realtime.reply_key(rid)
        with self.r.pipeline() as p:
            p.lpush(key, orjson.dumps(payload))
            p.expire(key, realtime.REPLY_TTL_S)
            p.execute()


def _err(e: InferqError) -> dict[str, Any]:
    return {"message": e.message, "type": e.type, "param": e.param, "code": e.code}


class Heartbeat(threading.Thread):
    """Announces the worker (lanes, models) and its engines' counters every few seconds."""

    def __init__(self, r: redis.Redis, name: str, info: dict[str, Any], every_s: float,
                 stats: Any = None) -> None:
        super().__init__(name="inferq-heartbeat", daemon=True)
        self.r, self.name, self.info, self.every_s = r, name, info, every_s
        self.stats = stats  # () -> dict, engine counters for operators and benchmarks
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                info = {k: v() if callable(v) else v for k, v in self.info.items()}
                info["at"] = time.time()
                if self.stats:
                    info["stats"] = self.stats()
                realtime.heartbeat(self.r, self.name, info, self.every_s * 3)
            except Exception as e:  # noqa: BLE001 - a heartbeat must outlive any error
                log.warning("heartbeat: %s", e)
            self.stopping.wait(self.every_s)


class Publisher(threading.Thread):
    """Publishes stream events off the engine thread, a pipeline per burst."""

    def __init__(self, r: redis.Redis) -> None:
        super().__init__(name="inferq-publisher", daemon=True)
        self.r = r
        self.q: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()

    def put(self, channel: str, data: bytes) -> None:
        self.q.put((channel, data))

    def run(self) -> None:
        while True:
            batch = [self.q.get()]
            while not self.q.empty() and len(batch) < 512:
                batch.append(self.q.get_nowait())
            try:
                with self.r.pipeline(transaction=False) as p:
                    for ch, data in batch:
                        p.publish(ch, data)
                    p.execute()
            except redis.RedisError as e:  # subscribers see the gap and end their streams
                log.warning("publishing %d stream events failed: %s", len(batch), e)


class CancelListener(threading.Thread):
    """Request ids whose caller went away (published by the API on disconnect)."""

    def __init__(self, r: redis.Redis, ttl_s: float = 600) -> None:
        super().__init__(name="inferq-cancels", daemon=True)
        self.r, self.ttl_s = r, ttl_s
        self.ids: dict[str, float] = {}

    def __contains__(self, rid: str) -> bool:
        return rid in self.ids

    def run(self) -> None:
        while True:
            try:
                ps = self.r.pubsub(ignore_subscribe_messages=True)
                ps.subscribe(realtime.CANCEL_CHANNEL)
                for msg in ps.listen():
                    now = time.time()
                    self.ids[msg["data"].decode()] = now
                    if len(self.ids) > 10_000:
                        self.ids = {k: t for k, t in self.ids.items() if now - t < self.ttl_s}
            except redis.RedisError as e:
                log.warning("cancel listener: %s; resubscribing", e)
                time.sleep(1)


class PubSink:
    """Engine sink for one realtime stream: numbered events on the request's channel."""

    def __init__(self, publisher: Publisher, rid: str, cancels: CancelListener) -> None:
        self.publisher, self.rid, self.cancels = publisher, rid, cancels
        self.channel = realtime.stream_channel(rid)
        self.n = 0

    def _send(self, ev: dict[str, Any]) -> None:
        ev["n"] = self.n
        self.n += 1
        self.publisher.put(self.channel, orjson.dumps(ev))

    def start(self) -> None:
        self._send({"t": "start"})

    def delta(self, text: str) -> None:
        self._send({"t": "delta", "text": text})

    def finish(self, reason: str, usage: Usage) -> None:
        self._send({"t": "done", "finish_reason": reason, "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "batch_rows": usage.batch_rows})

    def fail(self, error: Exception) -> None:
        self.error(*failure(error))

    def error(self, status: int, err: dict[str, Any]) -> None:
        self._send({"t": "error", "status": status, "error": err})

    def cancelled(self) -> bool:
        return self.rid in self.cancels


class JobsConsumer(threading.Thread):
    """Takes asynchronous jobs in bursts and feeds them to the engines together, at a
    priority between realtime and batch; results are written back to the job rows."""

    burst = 64

    def __init__(self, ctx: Any, engine: EmbeddingEngine, tok: Any, generator: Any, worker: str,
                 recover_every_s: float = 15.0, allow: Any = lambda: True) -> None:
        super().__init__(name="inferq-jobs", daemon=True)
        self.allow = allow
        self.ctx, self.engine, self.tok, self.generator = ctx, engine, tok, generator
        self.worker, self.recover_every_s = worker, recover_every_s
        self.token = secrets.token_hex(16)
        self.writer = ThreadPoolExecutor(2, thread_name_prefix="inferq-jobs-write")
        self.stopping = threading.Event()

    def run(self) -> None:
        last_recover = 0.0
        ttl = self.ctx.settings.lease_seconds
        while not self.stopping.is_set():
            try:
                if time.monotonic() - last_recover > min(self.recover_every_s, ttl / 3):
                    asyncjobs.renew(self.ctx, self.token, ttl)  # jobs still in the engine
                    asyncjobs.recover(self.ctx)
                    last_recover = time.monotonic()
                if not self.allow():  # the circuit breaker is open
                    time.sleep(0.5)
                    continue
                got = self.ctx.redis.blpop([asyncjobs.QUEUE], timeout=1)
                if got is None:
                    continue
                ids = [got[1].decode()]
                ids += [x.decode() for x in self.ctx.redis.lpop(asyncjobs.QUEUE,
                                                                self.burst - 1) or []]
                for job in asyncjobs.claim(self.ctx, ids, self.worker, self.token,
                                           self.ctx.settings.lease_seconds):
                    self.start_job(job)
            except Exception as e:  # noqa: BLE001 - keep consuming; recovery re-pushes
                log.warning("jobs lane: %s", e)
                time.sleep(1)

    def start_job(self, job: Any) -> None:
        if job.endpoint == EMBEDDINGS:
            req = parse_embeddings(job.body, 1 << 30)
            ids = self.tok.tokenize(req.inputs())
            futures = self.engine.submit(ids, JOBS)
            pending = [len(futures)]
            lock = threading.Lock()

            def one_done(_: Future[np.ndarray]) -> None:
                with lock:
                    pending[0] -= 1
                    if pending[0]:
                        return
                self.writer.submit(self.finish_embeddings, job, req, futures,
                                   sum(map(len, ids)))

            for f in futures:
                f.add_done_callback(one_done)
            return
        try:
            if self.generator is None:
                raise Unavailable("no chat model is loaded on this worker")
            gen = self.generator()
            greq = build_request(gen.model, job.endpoint, job.body)
        except InferqError as e:
            self.writer.submit(asyncjobs.complete, self.ctx, job.id, self.token, None, _err(e))
            return
        sink = Collect(on_done=lambda c: self.writer.submit(self.finish_generation, job, c))
        gen.submit(greq, sink, JOBS)

    def finish_embeddings(self, job: Any, req: Any, futures: list[Any], ntok: int) -> None:
        try:
            body = embeddings_body(req, [f.result() for f in futures], ntok)
            result = orjson.loads(dumps(body))
            asyncjobs.complete(self.ctx, job.id, self.token, result, None)
        except Exception as e:  # noqa: BLE001 - recorded on the job
            asyncjobs.complete(self.ctx, job.id, self.token, None, failure(e)[1])

    def finish_generation(self, job: Any, c: Collect) -> None:
        if c.error is not None:
            asyncjobs.complete(self.ctx, job.id, self.token, None, failure(c.error)[1])
            return
        build = shapes.chat_completion if job.endpoint == CHAT else shapes.text_completion
        body = build(job.body["model"], c.text, c.reason, c.usage.prompt_tokens,
                     c.usage.completion_tokens)
        body["inferq"] = {"batch_rows": c.usage.batch_rows}
        asyncjobs.complete(self.ctx, job.id, self.token, body, None)


class Janitor(threading.Thread):
    """Runs jobs.janitor.sweep every few seconds in the control worker."""

    def __init__(self, ctx: Any, every_s: float) -> None:
        super().__init__(name="inferq-janitor", daemon=True)
        self.ctx, self.every_s = ctx, every_s
        self.stopping = threading.Event()

    def run(self) -> None:
        from jobs.janitor import sweep

        while not self.stopping.wait(self.every_s):
            try:
                rep = sweep(self.ctx)
                if rep.requeued or rep.failed or rep.expired:
                    log.info("janitor: requeued %s, failed %s, expired %s", rep.requeued,
                             rep.failed, rep.expired)
            except Exception as e:  # noqa: BLE001 - the next sweep tries again
                log.warning("janitor: %s", e)
