"""Taking realtime requests reliably, on a real Redis with this test playing the workers
(workers.lanes.taking, jobs.realtime.taken): a request moves from its queue into the
worker's taken list in one step; when the worker's lease lapses, one it had not started
goes back to the head of its queue for another worker, and a started stream ends at
once with ``worker_gone`` (never run twice); one past its deadline is dropped."""

from __future__ import annotations

import threading
import time

import orjson
import pytest
import redis as redis_lib

from jobs.core import redis_keys
from jobs.core.errors import InferqError
from jobs.fleet import heartbeats
from jobs.realtime import taken
from jobs.realtime.client import TokenStream
from tests.polling import until
from workers.lanes.taking import Taker

QUEUE = redis_keys.realtime_queue("m")


@pytest.fixture
def r(own_redis_url: str):  # type: ignore[no-untyped-def]
    client = redis_lib.Redis.from_url(own_redis_url)
    heartbeats.write(client, "test-worker", {"name": "test-worker", "lanes": ["realtime"],
                                               "models": ["m"]}, 60)
    # The reaper acts once Redis has been up for a lease (none lost in a restart).
    until(lambda: float(client.info("server")["uptime_in_seconds"]) >= taken.LEASE_TTL_S,
          what="Redis up for a lease")
    yield client
    client.close()


def msg(rid: str, deadline_s: float = 30) -> bytes:
    return orjson.dumps({"id": rid, "kind": "/v1/chat/completions", "body": {"model": "m"},
                         "deadline": time.time() + deadline_s, "queue": QUEUE})


def dies(r: redis_lib.Redis, worker: Taker) -> None:  # type: ignore[type-arg]
    """As a SIGKILL leaves it: its lease lapses, its taken list stays."""
    r.delete(redis_keys.realtime_lease(worker.name))


def test_a_take_moves_the_request_and_an_answer_forgets_it(r) -> None:  # type: ignore[no-untyped-def]
    w = Taker(r, "w1")
    r.lpush(QUEUE, msg("req_1"), msg("req_2"))
    got = w.take([redis_keys.realtime_queue("other"), QUEUE], timeout=1)
    assert got is not None and got[0] == QUEUE and orjson.loads(got[1][0])["id"] == "req_1"
    assert r.lrange(redis_keys.realtime_taken("w1"), 0, -1) == got[1]
    assert r.llen(QUEUE) == 1  # the other is still waiting
    w.forget(got[1][0], "req_1")
    assert r.llen(redis_keys.realtime_taken("w1")) == 0
    # Blocked on an empty queue, it takes what arrives.
    r.delete(QUEUE)
    later = threading.Timer(0.3, lambda: r.lpush(QUEUE, msg("req_3")))
    later.start()
    got = w.take([QUEUE], timeout=5)
    later.join(10)  # its push answered before the test's Redis client is closed
    assert got is not None and orjson.loads(got[1][0])["id"] == "req_3"
    assert r.llen(redis_keys.realtime_taken("w1")) == 1


def test_a_dead_workers_unstarted_request_goes_to_the_head_of_its_queue(r) -> None:  # type: ignore[no-untyped-def]
    dead, other = Taker(r, "dead"), Taker(r, "other")
    r.lpush(QUEUE, msg("req_a"), msg("req_later"))
    got = dead.take([QUEUE], timeout=1)
    assert got is not None
    late = msg("req_late", deadline_s=-1)  # its caller has given up
    r.lpush(redis_keys.realtime_taken("dead"), late)
    assert taken.reap(r) == {}  # its lease holds: nothing to do
    dies(r, dead)
    assert taken.reap(r) == {"dead": taken.Reaped(given_back=1, ended=0, dropped=1)}
    again = other.take([QUEUE], timeout=1)
    assert again is not None and again[1] == got[1]  # next in line, before req_later
    assert r.llen(redis_keys.realtime_taken("dead")) == 0
    assert b"dead" not in r.smembers(redis_keys.REALTIME_TAKERS)
    assert taken.reap(r) == {}  # once


def test_a_started_stream_of_a_dead_worker_ends_at_once(r) -> None:  # type: ignore[no-untyped-def]
    """The API's stream gets the error as soon as the reaper knows, not after its idle
    timeout; a request that was started is never given to another worker."""
    ts = TokenStream(r, "/v1/chat/completions", {"model": "m"}, first_event_s=10,
                     idle_s=60, keepalive_s=0.2)
    worker = Taker(r, "w2")
    events: list[dict] = []  # type: ignore[type-arg]
    errors: list[InferqError] = []

    def api() -> None:
        try:
            events.append(ts.open())
            events.extend(e for e in ts.events() if e is not None)
        except InferqError as e:
            errors.append(e)

    t = threading.Thread(target=api, daemon=True)
    t.start()
    got = None
    while got is None:
        got = worker.take([QUEUE], timeout=1)
    rid = orjson.loads(got[1][0])["id"]
    worker.hold(orjson.loads(got[1][0]), got[1][0])
    assert worker.start_work(rid)
    for n, ev in enumerate([{"t": "start"}, {"t": "delta", "text": "a"}]):
        r.publish(redis_keys.stream(rid), orjson.dumps({**ev, "n": n}))
    time.sleep(0.5)
    dies(r, worker)
    t0 = time.monotonic()
    assert taken.reap(r) == {"w2": taken.Reaped(given_back=0, ended=1, dropped=0)}
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 5
    ts.close()
    assert [e["t"] for e in events] == ["start", "delta", "error"], (events, errors)
    assert (events[-1]["status"], events[-1]["error"]["code"]) == (503, "worker_gone")
    assert r.llen(QUEUE) == 0  # not given to another worker
    # A worker whose lease lapsed cannot start what was given to another.
    r.lpush(QUEUE, msg("req_b"))
    slow = Taker(r, "slow")
    got = slow.take([QUEUE], timeout=1)
    assert got is not None
    slow.hold(orjson.loads(got[1][0]), got[1][0])
    dies(r, slow)
    taken.reap(r)
    assert not slow.start_work("req_b")
    assert slow.held == {}
    assert r.llen(QUEUE) == 1
