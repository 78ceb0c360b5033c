"""The janitor breaks the lease of a shard whose worker's heartbeat has expired, long
before the lease itself would lapse, and leaves live workers' leases alone; the lease
token fences off the old holder if it was only slow (real PostgreSQL and Redis)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from jobs.batches import janitor
from jobs.batches import queries as repo
from jobs.batches.janitor import holders_without_heartbeat
from jobs.batches.outputs import Tokens
from jobs.core import redis_keys
from jobs.core.context import Context
from jobs.core.settings import Settings
from jobs.core.status import ShardStatus
from jobs.fleet import heartbeats
from tests.factories import make_batch, sent, shard_row


@pytest.fixture
def hctx(own_settings: Settings) -> Iterator[Context]:
    """A database and Redis DB of its own, heartbeats every 0.5 s (a TTL of 1.5 s)."""
    c = Context(own_settings.model_copy(update={"worker_heartbeat_s": 0.5}))
    # The janitor trusts a missing heartbeat only from a Redis up for one heartbeat TTL.
    while float(c.redis.info("server")["uptime_in_seconds"]) < c.settings.heartbeat_ttl_s:
        time.sleep(0.2)
    yield c
    c.close()


def running(worker: str, claimed_at: float, token: str) -> dict[str, object]:
    return {"status": ShardStatus.RUNNING, "attempt": 1, "lease_token": token,
            "lease_expires_at": time.time() + 3600, "worker": worker, "claimed_at": claimed_at}


def test_a_gone_workers_shard_is_handed_back_and_a_live_ones_is_not(hctx: Context) -> None:
    ttl = hctx.settings.heartbeat_ttl_s
    long_ago = time.time() - 100 * ttl
    heartbeats.write(hctx.redis, "host:live", {"name": "host:live"}, 3600)
    gone, live, just_claimed = make_batch(hctx, [
        running("host:gone", long_ago, "a"),  # no heartbeat: killed
        running("host:live", long_ago, "b"),
        # Claimed less than a heartbeat TTL ago: never broken on the heartbeat alone.
        running("host:new", time.time() + 3600, "c"),
    ])
    rep = janitor.sweep(hctx)
    assert rep.requeued == [gone] and rep.failed == []
    assert shard_row(hctx, gone).status == ShardStatus.QUEUED
    assert shard_row(hctx, gone).lease_token is None
    assert shard_row(hctx, live).status == ShardStatus.RUNNING
    assert shard_row(hctx, just_claimed).status == ShardStatus.RUNNING
    assert sent(hctx) == [gone]

    # Had the holder only been slow, its next checkpoint is fenced off.
    with hctx.db.session() as s:
        assert not repo.checkpoint(s, gone, "a", 1, 1, 10, 10, 0, Tokens(), 60)
        assert repo.claim_shard(s, gone, "d", "host:live", 60) is not None
    assert shard_row(hctx, gone).lease_token == "d"


def test_a_heartbeat_that_expires_lets_the_next_sweep_break_the_lease(hctx: Context) -> None:
    heartbeats.write(hctx.redis, "host:dying", {"name": "host:dying"}, 3600)
    (sid,) = make_batch(hctx, [running("host:dying", time.time() - 3600, "a")])
    assert janitor.sweep(hctx).requeued == []
    hctx.redis.delete(redis_keys.WORKERS + "host:dying")  # as its TTL would, three beats on
    assert janitor.sweep(hctx).requeued == [sid]


def test_missing_heartbeats_are_not_trusted_from_a_redis_that_just_started() -> None:
    workers = {"host:1", "host:2"}
    assert holders_without_heartbeat(workers, {"host:1"}, redis_uptime_s=60,
                                     heartbeat_ttl_s=15) == {"host:2"}
    # Restarted (or its keys expired while it was down): the workers beat again soon.
    assert holders_without_heartbeat(workers, set(), redis_uptime_s=3,
                                     heartbeat_ttl_s=15) == set()


def test_a_poked_heartbeat_beats_at_once_and_stops_at_once(hctx: Context) -> None:
    """What a worker holds changed: its next beat does not wait for the tick (placement
    reads residency from heartbeats), and stopping does not wait for it either."""
    from workers.process.heartbeat import Heartbeat

    held = ["m@1"]
    beat = Heartbeat(hctx.redis, "poked-worker", lambda: {"resident": list(held)},
                     every_s=60)
    beat.start()
    try:
        deadline = time.monotonic() + 10

        def resident() -> list[str]:
            got = [b for b in heartbeats.current(hctx.redis) if "resident" in b]
            return got[0]["resident"] if got else []

        while resident() != ["m@1"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        held.append("m@2")
        beat.poke()
        while resident() != ["m@1", "m@2"]:  # long before the 60 s tick
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        beat.stop()
        beat.join(timeout=10)
    assert not beat.is_alive()
