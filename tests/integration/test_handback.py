"""Work a worker pops for a model version it no longer holds (the version was unloaded
while the pop was waiting, or its shard's message was already on its way) goes back,
unclaimed, to be served by the version's holder: never refused with
``model_not_loaded``, never lost. Real Redis and PostgreSQL; the worker's lanes and its
runtime are the real classes, holding nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis as redis_lib

from jobs.core import redis_keys
from jobs.core.context import Context
from jobs.core.dispatch import shard_queue
from jobs.core.schema import Shard
from jobs.core.settings import Settings
from jobs.core.status import ShardOutcome, ShardStatus
from tests.factories import make_batch, sent
from tests.helpers import held_models

GONE = "gone-model@1"  # the version just unloaded


@pytest.fixture
def hctx(own_settings: Settings) -> Iterator[Context]:
    c = Context(own_settings)
    yield c
    c.close()


def test_a_realtime_request_goes_back_to_the_head_of_its_queue(hctx: Context) -> None:
    from workers.lanes.realtime import RealtimeConsumer

    r: redis_lib.Redis = hctx.redis  # type: ignore[type-arg]
    lane = RealtimeConsumer(r, held_models(), 100, allow=lambda: True)
    queue = redis_keys.realtime_queue(GONE)
    r.lpush(queue, b"popped", b"sent later")
    assert lane.taker.take_now([queue]) == (queue, [b"popped"])  # into its taken list
    assert lane.handed_back(queue.encode(), b"popped")
    assert r.llen(redis_keys.realtime_taken(lane.taker.name)) == 0  # out of it
    assert r.brpop([queue], timeout=1) == (queue.encode(), b"popped")  # next in line
    assert r.brpop([queue], timeout=1) == (queue.encode(), b"sent later")
    assert not lane.handed_back(redis_keys.REALTIME_ANY.encode(), b"any worker's")


def test_a_job_goes_back_to_the_head_of_its_list(hctx: Context) -> None:
    from workers.lanes.jobs import JobsConsumer

    r: redis_lib.Redis = hctx.redis  # type: ignore[type-arg]
    lane = JobsConsumer(hctx, held_models(), "test-worker", allow=lambda: True)
    queue = redis_keys.jobs_queue(GONE)
    r.rpush(queue, b"job_later")
    assert lane.handed_back(queue.encode(), b"job_popped")
    assert r.lrange(queue, 0, -1) == [b"job_popped", b"job_later"]
    # The common list is every worker's: what comes from it is refused, not returned.
    assert not lane.handed_back(redis_keys.JOBS_QUEUE.encode(), b"job_common")


def test_a_shard_is_sent_again_unclaimed(hctx: Context) -> None:
    from workers.lanes.batch import run_shard
    from workers.process.breaker import Breaker
    from workers.process.runtime import WorkerRuntime

    name, version = GONE.split("@")
    [sid] = make_batch(hctx, [{}], model=name, model_version=version)
    rt = WorkerRuntime(hctx.settings, hctx, "test-worker", Breaker(3, 1.0), held_models(),
                       "simulated")
    got = run_shard(rt, sid, lambda: False, queue=shard_queue("batch", GONE))
    assert got == ShardOutcome.HANDED_BACK
    assert sent(hctx, shard_queue("batch", GONE)) == [sid]  # for the version's holder
    with hctx.db.session() as s:
        sh = s.get(Shard, sid)
        assert sh is not None
        assert (sh.status, sh.attempt, sh.worker) == (ShardStatus.QUEUED, 0, None)
