"""The realtime lane: interactive requests answered by workers through Redis.

A request is pushed on its model's Redis list, which only the realtime consumers
of workers holding that model block on; the answer comes back on a per-request
list the API blocks on. Lists (unlike pub/sub) keep a reply that arrives before
the API starts waiting. A request carries its deadline; a worker drops requests
whose caller has given up. It also carries the project and key it is billed to
(``tenant_id``, ``api_key_id``): the worker that answers it records its usage; a
generation also carries the tokens it may reserve (``max_reserved_tokens``: n x
max_tokens, checked by the worker once the prompt's length is known), and the queue
it was pushed on (``queue``): a worker that takes it and dies before starting it has
it given back there (``jobs.realtime.taken``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson
import redis

from jobs.core import lanes, logs, redis_keys, refs, tracing
from jobs.core.errors import InferqError, ModelLoading, ModelNotLoaded, RequestTimeout, Unavailable
from jobs.core.schema import new_id
from jobs.core.status import StreamEvent
from jobs.fleet import heartbeats, placement
from storage import pubsub

REPLY_TTL_S = 60


# Places a version no live worker holds; True when a copy is or will be resident.
Placer = Callable[[str], bool]


def ON_DEMAND(model_ref: str) -> bool:  # noqa: N802 - a marker, compared by identity
    """The placer of INFERQ_PLACEMENT=on_demand: every request goes on one queue
    (``redis_keys.REALTIME_ANY``), whichever worker takes it loads its version."""
    return True


# A request waiting for its version's load asks the placement again this often; when
# the answer is no (the load failed, or nobody has room) and no worker has taken it
# yet, it is taken back and answered 503 ``model_not_loaded``. One still waiting when
# its first-event timeout passes (a load slower than that) is taken back too and
# answered 503 ``model_loading`` + retry-after, which clients retry, rather than 504.
PLACEMENT_CHECK_S = 1.0


class Admission(NamedTuple):
    queue: str
    placing: str | None  # the version placed for it (no live worker held it): it waits


def queue_for(r: redis.Redis, model: str, max_queue: int, version: str | None = None,
          place: Placer | None = None) -> Admission:
    """The queue to push a realtime request for ``model`` (routed to ``version``) on:
    that version's. A version no live worker holds is placed first (``place``) and the
    request waits on its queue for the load (``Admission.placing``). 503 + retry-after
    when no worker serves the lane, the version cannot be had, or its queue is full. A
    worker announcing names only (``models``, no ``resident``) takes the name's own
    queue."""
    beats = heartbeats.live_workers(r, lanes.REALTIME)
    if not beats:
        raise Unavailable("no worker is serving the realtime lane", retry_after=5)
    ref = refs.model_ref(model, version)
    placing = None
    if place is ON_DEMAND:
        queue = redis_keys.REALTIME_ANY
    elif any(heartbeats.holds(b, ref) for b in beats):
        queue = redis_keys.realtime_queue(ref)
    elif any("resident" not in b and heartbeats.holds(b, model) for b in beats):
        queue = redis_keys.realtime_queue(model)
    elif version and place is not None and place(ref):
        queue, placing = redis_keys.realtime_queue(ref), ref
    else:
        raise ModelNotLoaded(model)
    if r.llen(queue) >= max_queue:
        raise Unavailable("the realtime queue is full", retry_after=2)
    return Admission(queue, placing)


def withdrawn(r: redis.Redis, admitted: Admission, raw: bytes, place: Placer | None
              ) -> ModelNotLoaded | None:
    """For a request (``raw``, as pushed) waiting for its version's load: when the
    placement now says no copy will be had and no worker has taken the request yet, it
    is taken off its queue and this is its error; None while it is still to be
    answered by a worker."""
    ref, message = admitted.placing, raw.decode()  # (the same bytes, sent as UTF-8)
    if ref is None or place is None or r.lpos(admitted.queue, message) is None:
        return None  # no load awaited, or a worker has it: its answer comes from there
    if place(ref) or not r.lrem(admitted.queue, 1, message):
        return None
    name, _ = refs.split_ref(ref)
    err = ModelNotLoaded(name)
    if (why := placement.failure(r, ref)) is not None:
        err.message = f"{err.message} ({ref} could not be loaded: {why.split(':', 1)[0]})"
    return err


def _origin() -> dict[str, str]:
    """The API request a message comes from (``request_id``, for the worker's log lines);
    its ``traceparent`` is added by the send's span."""
    rid = logs.current("request_id")
    return {"request_id": rid} if rid else {}


def _send_attributes(queue: str, rid: str) -> dict[str, str]:
    return {"messaging.system": "redis", "messaging.destination.name": queue,
            "messaging.message.id": rid}


class Answer(NamedTuple):
    """A worker's answer: the JSON response body and how long the request waited for
    the engine (from the push until its first pass started; None if not measured)."""

    body: bytes
    queued_s: float | None


class RealtimeClient:
    """Realtime requests of one caller: billed to ``tenant_id`` and ``api_key_id`` (none
    for a shadow's mirrored request), for ``version`` of the body's model."""

    def __init__(self, r: redis.Redis, max_queue: int = 1000, tenant_id: str | None = None,
                 api_key_id: str | None = None, version: str | None = None,
                 place: Placer | None = None) -> None:
        self.r = r
        self.max_queue = max_queue
        self.payer = {"tenant_id": tenant_id, "api_key_id": api_key_id}
        self.version, self.place = version, place

    def call(self, kind: str, body: dict[str, Any], timeout_s: float) -> bytes:
        """Send one request and wait for the worker's answer (the JSON response body)."""
        return self.answer(kind, body, timeout_s).body

    def answer(self, kind: str, body: dict[str, Any], timeout_s: float) -> Answer:
        """Send one request and wait for the worker's answer."""
        admitted = queue_for(self.r, body["model"], self.max_queue, self.version, self.place)
        rid = new_id("req_")
        msg = {"id": rid, "kind": kind, "body": body, "deadline": time.time() + timeout_s,
               "enqueued_at": time.time(), "version": self.version, "queue": admitted.queue,
               **self.payer}  # enqueued_at: queue-time metrics
        msg.update(_origin())
        with tracing.producer(f"realtime send {kind}", msg,
                              _send_attributes(admitted.queue, rid)):
            raw = orjson.dumps(msg)
            self.r.lpush(admitted.queue, raw)
        deadline = time.monotonic() + max(1.0, timeout_s)
        while True:  # for a load awaited, asking the placement again between waits
            left = deadline - time.monotonic()
            step = left if admitted.placing is None else min(left, PLACEMENT_CHECK_S)
            got = self.r.blpop([redis_keys.reply(rid)], timeout=max(0.1, step))
            if got is not None:
                break
            if time.monotonic() >= deadline:
                raise RequestTimeout(f"no answer within {timeout_s:.0f} s")
            if (refused := withdrawn(self.r, admitted, raw, self.place)) is not None:
                raise refused
        reply = orjson.loads(got[1])
        if "error" in reply:
            raise error_from_event(reply)
        queued = reply.get("queued_s")
        return Answer(reply["body"].encode() if isinstance(reply["body"], str)
                      else orjson.dumps(reply["body"]),
                      float(queued) if isinstance(queued, int | float) else None)


# Token streams -----------------------------------------------------------------------------

class StreamBroken(InferqError, status=502, type="server_error", code="stream_interrupted"):
    """A stream whose events stopped or came torn: it ends with this error."""


class TokenStream:
    """One generation request on the realtime lane, its events read from pub/sub (on
    the process's one pub/sub connection, ``storage.pubsub``).

    The subscription is confirmed before the request is enqueued, so no event can
    be published before someone listens. Events carry a sequence number: a gap
    (a subscriber that lost messages) ends the stream with an error instead of
    delivering a torn answer. An event marked ``gone`` (no number: published by the
    reaper of a dead worker's requests, ``jobs.realtime.taken``) is an error that ends
    it at once. Closing early publishes a cancel for the worker.
    """

    def __init__(self, r: redis.Redis, kind: str, body: dict[str, Any], *,
                 first_event_s: float, idle_s: float, keepalive_s: float = 10.0,
                 tenant_id: str | None = None, api_key_id: str | None = None,
                 version: str | None = None, place: Placer | None = None,
                 max_reserved_tokens: int = 0) -> None:
        self.r, self.kind, self.body = r, kind, body
        self.payer: dict[str, Any] = {"tenant_id": tenant_id, "api_key_id": api_key_id}
        if max_reserved_tokens > 0:  # n x max_tokens it may reserve, checked by the worker
            self.payer["max_reserved_tokens"] = max_reserved_tokens
        self.version, self.place = version, place
        self.first_event_s, self.idle_s, self.keepalive_s = first_event_s, idle_s, keepalive_s
        self.id = new_id("req_")
        self.sub: pubsub.Subscription | None = None
        self.expected = 0
        self.finished = False

    def open(self, max_queue: int = 1000) -> dict[str, Any]:
        """Subscribe, enqueue, and return the first event (``start``); errors raise."""
        admitted = queue_for(self.r, self.body["model"], max_queue, self.version, self.place)
        try:  # confirmed by the server before the request is sent
            self.sub = pubsub.hub(self.r).subscribe(redis_keys.stream(self.id))
        except TimeoutError:
            raise Unavailable("could not subscribe to the token stream", retry_after=2) from None
        msg = {"id": self.id, "kind": self.kind, "body": self.body,
               "deadline": time.time() + self.first_event_s, "enqueued_at": time.time(),
               "version": self.version, "queue": admitted.queue, **self.payer}
        msg.update(_origin())
        with tracing.producer(f"realtime send {self.kind}", msg,
                              _send_attributes(admitted.queue, self.id)):
            raw = orjson.dumps(msg)
            self.r.lpush(admitted.queue, raw)
        first = self.first_event(admitted, raw)
        if first is None:
            self.close(cancel=True)
            raise RequestTimeout(f"no worker took the request within {self.first_event_s:.0f} s")
        if first["t"] == StreamEvent.ERROR:
            self.close()
            raise error_from_event(first)
        return first

    def first_event(self, admitted: Admission, raw: bytes) -> dict[str, Any] | None:
        """The first event within ``first_event_s``; for a load awaited, the placement is
        asked again between waits (``withdrawn``)."""
        if admitted.placing is None:
            return self.next_event(self.first_event_s)
        deadline = time.monotonic() + self.first_event_s
        while (left := deadline - time.monotonic()) > 0:
            if (ev := self.next_event(min(left, PLACEMENT_CHECK_S))) is not None:
                return ev
            if (refused := withdrawn(self.r, admitted, raw, self.place)) is not None:
                self.close()
                raise refused
        if self.r.lrem(admitted.queue, 1, raw.decode()):  # still queued: not taken yet
            self.close()
            raise ModelLoading(admitted.placing, self.first_event_s)
        return self.next_event(self.first_event_s)  # a worker has just taken it

    def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The next event in order, or None when nothing came within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            assert self.sub is not None, "open() first"
            data = self.sub.get(left)
            if data is None:
                continue
            ev: dict[str, Any] = orjson.loads(data)
            if ev.get("gone"):  # its worker died (jobs.realtime.taken): the last event
                self.finished = True
                return ev
            if ev["n"] != self.expected:
                raise StreamBroken(f"the token stream lost events ({self.expected} expected, "
                                   f"{ev['n']} received)")
            self.expected += 1
            if ev["t"] in (StreamEvent.DONE, StreamEvent.ERROR):
                self.finished = True
            return ev

    def events(self) -> Any:
        """Events after ``start`` until done/error; ``None`` marks a keep-alive tick."""
        idle_since = time.monotonic()
        while not self.finished:
            ev = self.next_event(self.keepalive_s)
            if ev is None:
                if time.monotonic() - idle_since > self.idle_s:
                    raise RequestTimeout(f"no progress for {self.idle_s:.0f} s")
                yield None
                continue
            idle_since = time.monotonic()
            yield ev

    def close(self, cancel: bool = False) -> None:
        if cancel or not self.finished:
            try:
                self.r.publish(redis_keys.CANCEL_CHANNEL, self.id)
            except redis.RedisError:
                pass
        if self.sub is not None:
            self.sub.close()


def error_from_event(ev: dict[str, Any]) -> InferqError:
    """The error a worker answered with; a 503 (e.g. a model it does not hold) is to be
    retried, so it carries ``retry-after``."""
    e = ev["error"]
    err = InferqError(e["message"], e.get("param"), e.get("code"))
    err.status = ev.get("status", 500)
    if err.status == 503:
        err.headers = {"retry-after": "5"}
    err.type = e.get("type", "server_error")
    return err
