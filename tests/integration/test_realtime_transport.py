"""The realtime transport on a real Redis, with this test playing the worker: the
subscription is confirmed before the request is queued, gaps end the stream with an
error rather than a torn answer, and the first-event and no-progress deadlines hold.
A request goes only to workers that announce its model; for a model none announces
it is refused at once with 503 + retry-after."""

from __future__ import annotations

import threading
import time

import orjson
import pytest
import redis as redis_lib

from jobs.core import redis_keys
from jobs.core.errors import ModelNotLoaded, RequestTimeout
from jobs.core.redis_keys import stream as stream_channel
from jobs.fleet import heartbeats
from jobs.realtime.client import RealtimeClient, StreamBroken, TokenStream


@pytest.fixture
def r(own_redis_url: str):  # type: ignore[no-untyped-def]
    """A Redis DB of this test's own: no real worker takes the requests it queues."""
    client = redis_lib.Redis.from_url(own_redis_url)
    heartbeats.write(client, "test-worker", {"name": "test-worker", "lanes": ["realtime"],
                                               "models": ["m"]}, 60)
    yield client
    client.close()


def fake_worker(r: redis_lib.Redis, events: list[dict], delay: float = 0.0) -> threading.Thread:  # type: ignore[type-arg]
    """Pops the request and publishes ``events`` numbered as given, on a connection of
    its own (it may still publish after the test closed ``r``)."""
    kw = r.connection_pool.connection_kwargs
    own = redis_lib.Redis(host=kw["host"], port=kw["port"], db=kw.get("db", 0))

    def run() -> None:
        with own:
            got = own.brpop([redis_keys.realtime_queue("m")], timeout=10)
            assert got is not None
            rid = orjson.loads(got[1])["id"]
            for ev in events:
                time.sleep(delay)
                own.publish(stream_channel(rid), orjson.dumps(ev))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def stream(r: redis_lib.Redis, first: float = 5, idle: float = 5) -> TokenStream:
    return TokenStream(r, "/v1/chat/completions", {"model": "m"}, first_event_s=first,
                       idle_s=idle, keepalive_s=0.2)


def test_events_published_right_after_enqueue_all_arrive(r) -> None:  # type: ignore[no-untyped-def]
    evs = [{"n": 0, "t": "start"}] + [{"n": i, "t": "delta", "text": f"t{i}"}
                                       for i in range(1, 200)]
    evs.append({"n": 200, "t": "done", "finish_reason": "stop", "prompt_tokens": 1,
                "completion_tokens": 199})
    fake_worker(r, evs)
    ts = stream(r)
    assert ts.open()["t"] == "start"
    got = [e for e in ts.events() if e is not None]
    ts.close()
    assert [e["text"] for e in got if e["t"] == "delta"] == [f"t{i}" for i in range(1, 200)]
    assert got[-1]["t"] == "done"


def test_a_gap_ends_the_stream_with_an_error(r) -> None:  # type: ignore[no-untyped-def]
    fake_worker(r, [{"n": 0, "t": "start"}, {"n": 1, "t": "delta", "text": "a"},
                    {"n": 3, "t": "delta", "text": "c"}])
    ts = stream(r)
    ts.open()
    with pytest.raises(StreamBroken):
        for _ in ts.events():
            pass
    ts.close()


def test_first_event_deadline(r) -> None:  # type: ignore[no-untyped-def]
    ts = stream(r, first=1)
    t0 = time.monotonic()
    with pytest.raises(RequestTimeout):
        ts.open()  # a live worker heartbeat, but nobody answers
    assert time.monotonic() - t0 < 5


def test_no_progress_deadline(r) -> None:  # type: ignore[no-untyped-def]
    fake_worker(r, [{"n": 0, "t": "start"}, {"n": 1, "t": "delta", "text": "a"}])
    ts = stream(r, idle=1)
    ts.open()
    seen = []
    with pytest.raises(RequestTimeout):
        for ev in ts.events():
            seen.append(ev)
    assert any(e and e["t"] == "delta" for e in seen) and None in seen  # keep-alives ticked
    ts.close()


def test_closing_early_publishes_a_cancel(r) -> None:  # type: ignore[no-untyped-def]
    cancels = r.pubsub()
    cancels.subscribe(redis_keys.CANCEL_CHANNEL)
    assert cancels.get_message(timeout=2)["type"] == "subscribe"
    fake_worker(r, [{"n": 0, "t": "start"}])
    ts = stream(r)
    ts.open()
    ts.close()
    msg = cancels.get_message(timeout=2)
    assert msg is not None and msg["data"].decode() == ts.id
    cancels.close()


def test_a_model_no_live_worker_announces_is_refused_at_once(r) -> None:  # type: ignore[no-untyped-def]
    """The test's worker announces only "m": nothing is queued for "other"."""
    t0 = time.monotonic()
    with pytest.raises(ModelNotLoaded) as e:
        TokenStream(r, "/v1/chat/completions", {"model": "other"}, first_event_s=30,
                    idle_s=30).open()
    with pytest.raises(ModelNotLoaded):
        RealtimeClient(r).call("/v1/embeddings", {"model": "other", "input": "x"}, 30)
    assert time.monotonic() - t0 < 5  # refused, not timed out
    assert (e.value.status, e.value.code) == (503, "model_not_loaded")
    assert e.value.headers["retry-after"] == "5"
    assert e.value.message.startswith("no worker serves model 'other' right now")
    assert r.llen(redis_keys.realtime_queue("other")) == 0


def test_a_request_waits_on_its_own_models_queue(r) -> None:  # type: ignore[no-untyped-def]
    heartbeats.write(r, "worker-2", {"name": "worker-2", "lanes": ["realtime"],
                                       "models": ["m", "e"]}, 60)
    answered: list[dict] = []  # type: ignore[type-arg]

    def worker() -> None:
        _, raw = r.brpop([redis_keys.realtime_queue("e")], timeout=10)
        msg = orjson.loads(raw)
        answered.append(msg)
        r.lpush(redis_keys.reply(msg["id"]), orjson.dumps({"body": {"ok": True}}))

    threading.Thread(target=worker, daemon=True).start()
    body = RealtimeClient(r).call("/v1/embeddings", {"model": "e", "input": "x"}, 10)
    assert orjson.loads(body) == {"ok": True}
    assert answered[0]["body"]["model"] == "e" and r.llen(redis_keys.realtime_queue("m")) == 0
