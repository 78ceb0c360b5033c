"""Work for a model version no live worker can take ends with ``model_not_loaded`` in
bounded time, whenever the heartbeats say so: a job pushed while no jobs worker was
live (its heartbeat late) is placed by the next janitor sweep once one is, and when
its load fails it is refused; a realtime request waiting for a load that will not
come (failed, or placed on a worker that died) is answered with the error, not held
until its own timeout. Real PostgreSQL and Redis; the test plays the worker (its
heartbeat, its model commands with a model store that cannot give the files, its jobs
lane) in this process."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

import orjson
import pytest

from jobs.asyncjobs import lifecycle as asyncjobs
from jobs.batches import janitor
from jobs.core import redis_keys, refs
from jobs.core.context import Context
from jobs.core.errors import InferqError, ModelLoading, ModelNotLoaded
from jobs.core.schema import Model
from jobs.core.settings import Settings
from jobs.core.status import JobStatus
from jobs.fleet import heartbeats, placement, registry
from jobs.protocol.endpoints import CHAT
from jobs.realtime import client as realtime
from jobs.realtime.client import RealtimeClient, TokenStream
from jobs.tenants import auth
from tests.polling import until
from workers.lanes.jobs import JobsConsumer
from workers.models.residency import Commands, Residency, Resident

EMBEDDER, TALKER = "unplaceable-embedder", "unplaceable-talker"
FILES = [{"path": "config.json", "bytes": 2, "sha256": "0" * 64}]


def no_files(m: Model) -> Resident:
    """The model store of these workers: it has none of the version's files."""
    raise FileNotFoundError(f"{m.name}@{m.version}/config.json is not in the store")


class Worker:
    """A model worker's parts that decide about versions, in this process: what it holds
    (nothing it can load), its model commands, its heartbeat, its jobs lane."""

    def __init__(self, ctx: Context, name: str, lanes: list[str]) -> None:
        self.ctx, self.name, self.lanes = ctx, name, lanes
        self.residency = Residency(ctx, no_files, worker=name)
        self.commands = Commands(ctx, name, self.residency)
        self.jobs = JobsConsumer(ctx, self.residency, name, allow=lambda: True)

    def beat(self) -> None:
        """A heartbeat, late or not: current from now on."""
        heartbeats.write(self.ctx.redis, self.name, {
            "name": self.name, "lanes": self.lanes, "breaker": "closed",
            "models": self.residency.names(), "resident": self.residency.refs(),
            "residency": self.residency.snapshot()}, 3600)

    def dies(self) -> None:
        self.ctx.redis.delete(redis_keys.WORKERS + self.name)

    def commands_sent(self) -> list[dict[str, Any]]:
        return [orjson.loads(c) for c in
                self.ctx.redis.lrange(placement.command_list(self.name), 0, -1)]

    def take_commands(self) -> None:
        while (raw := self.ctx.redis.lpop(placement.command_list(self.name))) is not None:
            self.commands.execute(cast(bytes, raw))


@pytest.fixture
def pctx(own_settings: Settings) -> Iterator[Context]:
    """A database and a Redis DB of its own: no worker of a running stack beats here."""
    c = Context(own_settings)
    registry.register(c, EMBEDDER, "1", "embeddings", "test", FILES, 128)
    registry.register(c, TALKER, "1", "chat", "test", FILES, 2048)
    yield c
    c.close()


@pytest.fixture
def tenant(pctx: Context) -> str:
    return auth.authenticate(pctx, auth.create_tenant(pctx, "unplaceable")[1]).tenant_id


def test_a_job_pushed_while_no_jobs_worker_was_live_fails_once_one_is(
        pctx: Context, tenant: str) -> None:
    ref = refs.model_ref(EMBEDDER, "1")
    job = asyncjobs.create(pctx, tenant, "/v1/embeddings", {"model": EMBEDDER, "input": "hi"})
    # No jobs worker is live (its heartbeat is late): the job waits on its version's list.
    assert pctx.redis.lrange(redis_keys.jobs_queue(ref), 0, -1) == [job.id.encode()]
    janitor.sweep(pctx)  # still none live: it keeps waiting there
    assert pctx.redis.lrange(redis_keys.jobs_queue(ref), 0, -1) == [job.id.encode()]

    w = Worker(pctx, "host:late", ["jobs"])
    w.beat()  # its heartbeat comes back
    janitor.sweep(pctx)  # the next sweep places the version on it
    assert [(c["op"], c["ref"]) for c in w.commands_sent()] == [("load", ref)]
    w.take_commands()  # the load fails: the job goes to the common list
    assert pctx.redis.lrange(redis_keys.JOBS_QUEUE, 0, -1) == [job.id.encode()]
    assert not pctx.redis.exists(redis_keys.jobs_queue(ref))

    w.jobs.take_burst()  # which its jobs lane takes from, and refuses
    w.jobs.writer.shutdown(wait=True)
    done = asyncjobs.get(pctx, tenant, job.id)
    assert done.status == JobStatus.FAILED and done.result is None
    assert done.error is not None and done.error["code"] == "model_not_loaded"
    assert f"no worker serves model '{EMBEDDER}'" in done.error["message"]


def test_a_job_pushed_as_its_load_failed_goes_where_it_is_refused(
        pctx: Context, tenant: str) -> None:
    ref = refs.model_ref(EMBEDDER, "1")
    w = Worker(pctx, "host:w", ["jobs"])
    w.beat()
    first = asyncjobs.create(pctx, tenant, "/v1/embeddings", {"model": EMBEDDER, "input": "a"})
    assert pctx.redis.get(placement.placing_key(ref)) == w.name.encode()
    # The load fails; a second job is pushed after the failed load emptied the version's
    # list but before the placement's marker was cleared (the worker's two steps).
    pctx.redis.lpop(placement.command_list(w.name))
    placement.load_failed(pctx, ref, "FileNotFoundError: config.json")
    second = asyncjobs.create(pctx, tenant, "/v1/embeddings", {"model": EMBEDDER, "input": "b"})
    placement.placed(pctx.redis, ref, w.name)
    stranded = pctx.redis.lrange(redis_keys.jobs_queue(ref), 0, -1)
    assert pctx.redis.lrange(redis_keys.JOBS_QUEUE, 0, -1) + stranded == [
        first.id.encode(), second.id.encode()]
    janitor.sweep(pctx)
    assert pctx.redis.lrange(redis_keys.JOBS_QUEUE, 0, -1) == [first.id.encode(),
                                                          second.id.encode()]
    assert w.commands_sent() == []  # a failed load is not tried again meanwhile


def test_a_job_left_on_the_list_of_a_version_whose_load_failed_is_refused(
        pctx: Context, tenant: str) -> None:
    ref = refs.model_ref(EMBEDDER, "1")
    job = asyncjobs.create(pctx, tenant, "/v1/embeddings", {"model": EMBEDDER, "input": "a"})
    w = Worker(pctx, "host:w", ["jobs"])
    w.beat()
    # Its last load failed, and the job is on the version's list all the same (pushed
    # by a placement decided just before the failure emptied that list).
    pctx.redis.set(placement.FAILED + ref, "FileNotFoundError: config.json")
    assert pctx.redis.lrange(redis_keys.jobs_queue(ref), 0, -1) == [job.id.encode()]
    janitor.sweep(pctx)
    assert pctx.redis.lrange(redis_keys.JOBS_QUEUE, 0, -1) == [job.id.encode()]
    assert not pctx.redis.exists(redis_keys.jobs_queue(ref)) and w.commands_sent() == []


def test_a_job_placed_on_a_worker_that_died_is_placed_again(pctx: Context,
                                                            tenant: str) -> None:
    ref = refs.model_ref(EMBEDDER, "1")
    a, b = Worker(pctx, "host:a", ["jobs"]), Worker(pctx, "host:b", ["jobs"])
    a.beat()
    job = asyncjobs.create(pctx, tenant, "/v1/embeddings", {"model": EMBEDDER, "input": "a"})
    assert [c["ref"] for c in a.commands_sent()] == [ref]
    a.dies()  # before it took the command
    b.beat()
    janitor.sweep(pctx)
    assert [(c["op"], c["ref"]) for c in b.commands_sent()] == [("load", ref)]
    b.take_commands()
    assert pctx.redis.lrange(redis_keys.JOBS_QUEUE, 0, -1) == [job.id.encode()]


# Realtime ------------------------------------------------------------------------------


def in_background(call: Callable[[], Any]) -> Callable[[], Any]:
    """Run ``call`` in a thread; the returned function waits (bounded) for its outcome:
    its result, or the exception it raised."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as e:  # noqa: BLE001 - handed to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def outcome() -> Any:
        t.join(timeout=30)
        assert not t.is_alive(), "still waiting"
        return out[0]

    return outcome


def placer(ctx: Context) -> realtime.Placer:
    return lambda ref: placement.ensure(ctx, ref, "realtime")


def refused(e: Any) -> None:
    assert isinstance(e, ModelNotLoaded), e
    assert e.status == 503 and e.headers.get("retry-after")


def test_a_realtime_request_sent_as_its_load_failed_gets_the_error(pctx: Context) -> None:
    ref = refs.model_ref(EMBEDDER, "1")
    w = Worker(pctx, "host:rt", ["realtime"])
    w.beat()
    place = placer(pctx)

    def place_then_fail(r: str) -> bool:
        """The placement says yes; the load fails before the request is on the queue
        (the worker answered those already waiting, and this one is not yet)."""
        yes = place(r)
        pctx.redis.lpop(placement.command_list(w.name))
        placement.load_failed(pctx, r, "FileNotFoundError: config.json")
        placement.placed(pctx.redis, r, w.name)
        return yes

    client = RealtimeClient(pctx.redis, version="1", place=place_then_fail)
    e = in_background(lambda: client.call("embeddings", {"model": EMBEDDER, "input": "hi"},
                                          timeout_s=120))()
    refused(e)
    assert f"no worker serves model '{EMBEDDER}'" in e.message
    assert not pctx.redis.exists(redis_keys.realtime_queue(ref))  # taken back


def test_a_realtime_request_placed_on_a_worker_that_died_is_placed_again(
        pctx: Context) -> None:
    ref = refs.model_ref(TALKER, "1")
    a, b = Worker(pctx, "host:a", ["realtime"]), Worker(pctx, "host:b", ["realtime"])
    a.beat()
    b.beat()
    stream = TokenStream(pctx.redis, CHAT, {"model": TALKER, "messages": [
        {"role": "user", "content": "hi"}]}, first_event_s=120, idle_s=120,
        version="1", place=placer(pctx))
    outcome = in_background(stream.open)
    until(lambda: a.commands_sent())  # placed on host:a (the first by name)
    a.dies()  # before it took the command
    until(lambda: b.commands_sent())  # placed again, on the live one
    assert [(c["op"], c["ref"]) for c in b.commands_sent()] == [("load", ref)]
    b.take_commands()  # and that load fails too
    e = outcome()
    refused(e)
    assert isinstance(e, InferqError) and "could not be loaded" in e.message
    assert not pctx.redis.exists(redis_keys.realtime_queue(ref))


def test_a_realtime_request_outwaited_by_its_load_is_a_503_to_retry(pctx: Context) -> None:
    """A load slower than the request's wait for a worker (a cold start of a large
    model): the request is taken back and answered 503 ``model_loading`` with
    retry-after, which clients retry, not 504."""
    ref = refs.model_ref(TALKER, "1")
    w = Worker(pctx, "host:slow", ["realtime"])
    w.beat()
    stream = TokenStream(pctx.redis, CHAT, {"model": TALKER, "messages": [
        {"role": "user", "content": "hi"}]}, first_event_s=3, idle_s=120,
        version="1", place=placer(pctx))
    outcome = in_background(stream.open)
    until(lambda: w.commands_sent())  # placed on it; its load goes on past the wait
    e = outcome()
    assert isinstance(e, ModelLoading), e
    assert e.status == 503 and e.headers.get("retry-after") and ref in e.message
    assert not pctx.redis.exists(redis_keys.realtime_queue(ref))  # taken back
