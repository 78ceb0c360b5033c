"""Token streams of realtime generation, worker side: the events of each stream are
published on its Redis channel, and callers that went away are heard of.

The API subscribes to a request's channel before it enqueues the request and
publishes the request id on the cancel channel when its client disconnects.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
import redis

from jobs.core import redis_keys
from jobs.core.status import StreamEvent
from workers.engines.responses import failure

if TYPE_CHECKING:  # annotations only
    from workers.engines.sinks import FinishReason, Usage

log = logging.getLogger("inferq.streams")


# A step run in the publisher's pipeline, in order with the events (e.g. a request's
# bookkeeping once its last event is out).
Step = Callable[[Any], None]


class Publisher(threading.Thread):
    """Publishes stream events off the engine thread, a pipeline per burst; what is still
    queued when it stops is sent before it ends."""

    def __init__(self, r: redis.Redis) -> None:
        super().__init__(name="inferq-publisher", daemon=True)
        self.r = r
        self.q: queue.SimpleQueue[tuple[str, bytes] | Step] = queue.SimpleQueue()
        self.stopping = threading.Event()

    def put(self, channel: str, data: bytes) -> None:
        self.q.put((channel, data))

    def then(self, step: Step) -> None:
        """Run ``step(pipeline)`` after the events put before it."""
        self.q.put(step)

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                batch = [self.q.get(timeout=0.5)]
            except queue.Empty:
                continue
            self.send(batch)
        self.send([])  # what came in before the stop

    def send(self, batch: list[tuple[str, bytes] | Step]) -> None:
        while not self.q.empty() and len(batch) < 512:
            batch.append(self.q.get_nowait())
        if not batch:
            return
        try:
            with self.r.pipeline(transaction=False) as p:
                for item in batch:
                    if isinstance(item, tuple):
                        p.publish(*item)
                    else:
                        item(p)
                p.execute()
        except redis.RedisError as e:  # subscribers see the gap and end their streams
            log.warning("publishing %d stream events failed: %s", len(batch), e)


class CancelListener(threading.Thread):
    """Request ids whose caller went away (published by the API on disconnect)."""

    def __init__(self, r: redis.Redis, ttl_s: float = 600) -> None:
        super().__init__(name="inferq-cancels", daemon=True)
        self.r, self.ttl_s = r, ttl_s
        self.ids: dict[str, float] = {}
        self.stopping = threading.Event()

    def __contains__(self, rid: str) -> bool:
        return rid in self.ids

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                with self.r.pubsub(ignore_subscribe_messages=True) as ps:
                    ps.subscribe(redis_keys.CANCEL_CHANNEL)
                    while not self.stopping.is_set():
                        msg = ps.get_message(timeout=0.5)
                        if msg is not None:
                            self.heard(msg["data"].decode())
            except redis.RedisError as e:
                log.warning("cancel listener: %s; resubscribing", e)
                self.stopping.wait(1)

    def heard(self, rid: str) -> None:
        now = time.time()
        self.ids[rid] = now
        if len(self.ids) > 10_000:
            self.ids = {k: t for k, t in self.ids.items() if now - t < self.ttl_s}


class PubSink:
    """Engine sink for one realtime stream: numbered events on the request's channel. Its
    first ``done`` or ``error`` event is its last (``on_end`` is called then): anything
    sent after it is dropped, and the engine is told to drop the sequence."""

    def __init__(self, publisher: Publisher, rid: str, cancels: CancelListener,
                 on_end: Callable[[], None] | None = None) -> None:
        self.publisher, self.rid, self.cancels = publisher, rid, cancels
        self.channel = redis_keys.stream(rid)
        self.n = 0
        self.on_end, self.ended = on_end, False

    def _send(self, ev: dict[str, Any]) -> None:
        if self.ended:
            return
        ev["n"] = self.n
        self.n += 1
        self.publisher.put(self.channel, orjson.dumps(ev))
        if ev["t"] in (StreamEvent.DONE, StreamEvent.ERROR):
            self.end()

    def end(self) -> None:
        """Nothing more is sent (its last event is out, or its client went away)."""
        if not self.ended:
            self.ended = True
            if self.on_end is not None:
                self.on_end()

    def start(self) -> None:
        self._send({"t": StreamEvent.START})

    def delta(self, text: str) -> None:
        self._send({"t": StreamEvent.DELTA, "text": text})

    def finish(self, reason: FinishReason, usage: Usage) -> None:
        self._send({"t": StreamEvent.DONE, "finish_reason": reason,
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "batch_rows": usage.batch_rows})

    def fail(self, error: Exception) -> None:
        self.error(*failure(error))

    def error(self, status: int, err: dict[str, Any]) -> None:
        self._send({"t": StreamEvent.ERROR, "status": status, "error": err})

    def cancelled(self) -> bool:
        return self.ended or self.rid in self.cancels
