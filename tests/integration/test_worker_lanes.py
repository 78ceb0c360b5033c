"""The realtime and jobs lanes of a worker, on real Redis and PostgreSQL with the packaged
embeddings model: whatever goes wrong with one request becomes that request's own
error answer, and the lane keeps serving. A malformed message or a chat model that
cannot be loaded does not kill the realtime thread; a job that cannot start or whose
outcome cannot be stored does not stay ``running``; a model the worker does not
hold is refused, never answered by another."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import redis as redis_lib
from sqlalchemy import select, update

from jobs.asyncjobs import lifecycle as asyncjobs
from jobs.core import redis_keys
from jobs.core.context import Context
from jobs.core.errors import InferqError
from jobs.core.schema import Job, new_id, now
from jobs.core.settings import Settings
from jobs.fleet import builtin_models, heartbeats
from jobs.protocol.endpoints import CHAT, EMBEDDINGS
from jobs.realtime import client as realtime
from jobs.realtime.client import RealtimeClient, TokenStream
from jobs.tenants import auth
from tests.helpers import held_models

MODEL = "all-MiniLM-L6-v2"
CHAT_MODEL = "SmolLM2-135M-Instruct"


def broken_chat(model: str) -> Any:
    """The chat model holder of a worker whose model store fails (an error that is no
    InferqError); ``tiny-chat`` fails with a message PostgreSQL cannot store."""
    if model == "tiny-chat":
        raise RuntimeError("weights unreadable: \x00")
    raise RuntimeError("object store unreachable")


def workers_models(minilm: Any, engine: Any) -> Any:
    """What the worker holds: the embeddings model, and chat models that fail to load."""
    return held_models(((minilm, engine),), {m: lambda m=m: broken_chat(m)
                                             for m in (CHAT_MODEL, "tiny-chat")})


# The realtime lane ---------------------------------------------------------------------


@pytest.fixture
def r(own_redis_url: str, minilm, minilm_engine) -> Iterator[redis_lib.Redis]:  # type: ignore[no-untyped-def,type-arg]
    """A Redis DB of this test's own, a realtime consumer on it, and its heartbeat."""
    from workers.lanes.realtime import RealtimeConsumer

    client = redis_lib.Redis.from_url(own_redis_url)
    lane = RealtimeConsumer(client, workers_models(minilm, minilm_engine), 100,
                            allow=lambda: True)
    lane.start()
    heartbeats.write(client, "w", {"name": "w", "lanes": ["realtime"],
                                     "models": [MODEL, CHAT_MODEL]}, 60)
    yield client
    lane.stop()
    client.close()


def call(r: redis_lib.Redis, body: dict[str, Any]) -> Any:  # type: ignore[type-arg]
    answer = RealtimeClient(r).answer("embeddings", body, 20)
    assert answer.queued_s is not None and 0 <= answer.queued_s < 20  # measured
    return orjson.loads(answer.body)


def reply_to(r: redis_lib.Redis, msg: dict[str, Any]) -> dict[str, Any]:  # type: ignore[type-arg]
    """Queue a raw message on the model's list and wait for its reply."""
    r.lpush(redis_keys.realtime_queue(MODEL), orjson.dumps(msg))
    got = r.blpop([redis_keys.reply(msg["id"])], timeout=20)
    assert got is not None, "no reply: the realtime thread died"
    out: dict[str, Any] = orjson.loads(got[1])
    return out


def test_realtime_errors_are_answered_and_the_lane_lives_on(r) -> None:  # type: ignore[no-untyped-def]
    deadline = time.time() + 30
    r.lpush(redis_keys.realtime_queue(MODEL), b"{not json")  # nobody to answer
    missing_kind = reply_to(r, {"id": "req_a", "deadline": deadline, "body": {}})
    assert missing_kind["status"] == 500 and missing_kind["error"]["type"] == "server_error"

    with pytest.raises(InferqError) as e:  # the chat model cannot be loaded
        TokenStream(r, CHAT, {"model": CHAT_MODEL, "messages": [
            {"role": "user", "content": "hi"}]}, first_event_s=20, idle_s=20).open()
    assert e.value.status == 500
    assert e.value.message == "inference failed: object store unreachable"

    ok = call(r, {"model": MODEL, "input": "still serving", "encoding_format": "float"})
    assert ok["model"] == MODEL and len(ok["data"][0]["embedding"]) == 384


def test_realtime_refuses_ids_outside_the_vocabulary(r) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InferqError) as e:
        call(r, {"model": MODEL, "input": [99999]})
    assert (e.value.status, e.value.code) == (400, "invalid_token_id")
    assert call(r, {"model": MODEL, "input": [7592]})["data"]  # the lane still serves


def test_realtime_refuses_a_model_it_does_not_hold(r) -> None:  # type: ignore[no-untyped-def]
    """Queued where this worker reads (a stale heartbeat, say), it is still refused."""
    got = reply_to(r, {"id": "req_b", "kind": "embeddings", "deadline": time.time() + 30,
                       "body": {"model": "bge-small", "input": "x"}})
    assert got["status"] == 503 and got["error"]["code"] == "model_not_loaded"
    err = realtime.error_from_event(got)
    assert err.headers == {"retry-after": "5"}
    assert err.message.startswith("no worker serves model 'bge-small' right now")


def test_a_busy_worker_leaves_requests_on_the_shared_queue(own_redis_url: str, minilm,  # type: ignore[no-untyped-def]
                                                          minilm_engine) -> None:
    """While its engine runs or holds work, a worker pops nothing: the requests stay on
    the model's list for whichever worker frees first. Freed, it takes those waiting
    (up to a pass of rows) at once, and they run in one pass."""
    from workers.engines.scheduling import BATCH, REALTIME
    from workers.lanes.realtime import RealtimeConsumer

    client = redis_lib.Redis.from_url(own_redis_url)
    lane = RealtimeConsumer(client, workers_models(minilm, minilm_engine), 100,
                            allow=lambda: True, max_pending=8)
    lane.start()
    try:
        with minilm_engine.gathering():  # busy: a row waits for a pass
            busy = minilm_engine.submit([[101, 7592, 102]], REALTIME)
            time.sleep(1.5)  # past the pop the lane was blocked in while it was idle
            ids = [f"req_q{i}" for i in range(3)]
            for rid in ids:
                client.lpush(redis_keys.realtime_queue(MODEL), orjson.dumps(
                    {"id": rid, "kind": EMBEDDINGS, "deadline": time.time() + 30,
                     "body": {"model": MODEL, "input": f"waiting {rid}"}}))
            time.sleep(0.5)
            assert client.llen(redis_keys.realtime_queue(MODEL)) == 3  # none taken
            batches = minilm_engine.stats.batches
        busy[0].result(timeout=20)
        for rid in ids:
            got = client.blpop([redis_keys.reply(rid)], timeout=20)
            assert got is not None and len(orjson.loads(got[1])["body"]["data"]) == 1
        assert client.llen(redis_keys.realtime_queue(MODEL)) == 0
        assert minilm_engine.stats.batches == batches + 2  # the held row, then the three
        # Work of the batch lane does not keep realtime requests waiting: they overtake it.
        with minilm_engine.gathering():
            shard_rows = minilm_engine.submit([[101, 7592, 102]] * 4, BATCH)
            time.sleep(1.5)
            client.lpush(redis_keys.realtime_queue(MODEL), orjson.dumps(
                {"id": "req_over", "kind": EMBEDDINGS, "deadline": time.time() + 30,
                 "body": {"model": MODEL, "input": "overtakes"}}))
            deadline = time.monotonic() + 10
            while client.llen(redis_keys.realtime_queue(MODEL)):
                assert time.monotonic() < deadline, "a batch row kept the request waiting"
                time.sleep(0.05)
        got = client.blpop([redis_keys.reply("req_over")], timeout=20)
        assert got is not None and "body" in orjson.loads(got[1])
        for f in shard_rows:
            f.result(timeout=20)
    finally:
        lane.stop()
        client.close()


# The jobs lane -------------------------------------------------------------------------


@pytest.fixture
def jctx(own_settings: Settings) -> Iterator[Context]:
    """A database and a Redis DB of its own: a running stack's workers must not take
    these jobs."""
    c = Context(own_settings.model_copy(update={"lease_seconds": 3}))
    yield c
    c.close()


@pytest.fixture
def tenant(jctx: Context) -> str:
    builtin_models.register_builtin_models(jctx)
    return auth.authenticate(jctx, auth.create_tenant(jctx, "lanes")[1]).tenant_id


def queued(jctx: Context, tenant: str, endpoint: str, body: dict[str, Any]) -> str:
    """A job row as the API stores it, for bodies validation would refuse (a model
    that is not registered) as well."""
    job_id = new_id("job_")
    with jctx.db.session() as s:
        s.add(Job(id=job_id, tenant_id=tenant, endpoint=endpoint, body=body, status="queued",
                  created_at=now()))
    jctx.redis.rpush(redis_keys.JOBS_QUEUE, job_id)
    return job_id


def ended(jctx: Context, ids: list[str], timeout: float = 60) -> dict[str, Job]:
    deadline = time.monotonic() + timeout
    while True:
        with jctx.db.session() as s:
            jobs = {j.id: j for j in s.scalars(select(Job).where(Job.id.in_(ids)))}
        if all(j.status in ("completed", "failed") for j in jobs.values()):
            return jobs
        assert time.monotonic() < deadline, {j.id: j.status for j in jobs.values()}
        time.sleep(0.1)


def test_every_job_of_a_burst_ends(jctx: Context, tenant: str, minilm, minilm_engine) -> None:  # type: ignore[no-untyped-def]
    from workers.lanes.jobs import JobsConsumer

    msgs = [{"role": "user", "content": "hi"}]
    ids = {
        "chat": queued(jctx, tenant, CHAT, {"model": CHAT_MODEL, "messages": msgs}),
        "unstorable": queued(jctx, tenant, CHAT, {"model": "tiny-chat", "messages": msgs}),
        "ok": queued(jctx, tenant, EMBEDDINGS, {"model": MODEL, "input": "hello"}),
        "vocab": queued(jctx, tenant, EMBEDDINGS, {"model": MODEL, "input": [99999]}),
        "other": queued(jctx, tenant, EMBEDDINGS, {"model": "bge-small", "input": "hi"}),
    }
    lane = JobsConsumer(jctx, workers_models(minilm, minilm_engine), "test-worker",
                        allow=lambda: True)
    lane.start()
    try:
        jobs = ended(jctx, list(ids.values()))
        assert lane.in_flight() == []  # nothing left whose lease it would renew
    finally:
        lane.stop()
    by = {k: jobs[v] for k, v in ids.items()}
    assert by["ok"].status == "completed" and by["ok"].result["model"] == MODEL
    assert by["chat"].error["message"] == "inference failed: object store unreachable"
    assert by["unstorable"].error == {
        "message": "the job's outcome could not be stored (DataError)", "type": "server_error",
        "param": None, "code": "server_error"}
    assert by["vocab"].error["code"] == "invalid_token_id"
    assert by["other"].error["code"] == "model_not_loaded"
    assert "no worker serves model 'bge-small'" in by["other"].error["message"]
    with pytest.raises(RuntimeError):  # stop() shut the writer pool down
        lane.writer.submit(print)


def test_only_jobs_in_flight_are_renewed(jctx: Context, tenant: str) -> None:
    a = queued(jctx, tenant, EMBEDDINGS, {"model": MODEL, "input": "a"})
    b = queued(jctx, tenant, EMBEDDINGS, {"model": MODEL, "input": "b"})
    asyncjobs.claim(jctx, [a, b], "w", "tok", ttl_s=0.5)
    assert asyncjobs.renew(jctx, "tok", 60, [a]) == 1
    assert asyncjobs.renew(jctx, "tok", 60, []) == 0
    with jctx.db.session() as s:
        leases = {j.id: j.lease_expires_at for j in s.scalars(
            select(Job).where(Job.id.in_([a, b])))}
    assert leases[a] > time.time() + 30 and leases[b] < time.time() + 1
    with jctx.db.session() as s:  # b's lease lapses: recovery hands it on
        s.execute(update(Job).where(Job.id == b).values(lease_expires_at=0))
    assert b in asyncjobs.recover(jctx) and a not in asyncjobs.recover(jctx)
