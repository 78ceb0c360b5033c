"""storage.pubsub on a real Redis: many subscribers share one connection, each gets
its own channel's messages in order, and a lost connection fails every subscriber."""

from __future__ import annotations

import pytest
import redis

from storage import pubsub


def pubsub_clients(r: redis.Redis, db: int) -> list[dict[str, str]]:
    return [c for c in r.client_list() if int(c.get("db", -1)) == db and
            int(c.get("sub", 0)) > 0]


def test_many_subscribers_one_connection_each_its_own_messages(own_redis_url: str) -> None:
    r = redis.Redis.from_url(own_redis_url)
    db = r.connection_pool.connection_kwargs.get("db", 0)
    hub = pubsub.hub(r)
    assert pubsub.hub(r) is hub
    subs = [hub.subscribe(f"test:{i}") for i in range(200)]
    try:
        assert len(pubsub_clients(r, db)) == 1
        for i in (0, 7, 199):
            for n in range(3):
                assert r.publish(f"test:{i}", f"{i}-{n}") == 1
        for i in (0, 7, 199):
            assert [subs[i].get(5) for _ in range(3)] == [f"{i}-{n}".encode() for n in range(3)]
        assert subs[1].get(0.2) is None  # nothing of another channel
    finally:
        for s in subs:
            s.close()
    assert hub.subscribers() == 0


def test_a_lost_connection_fails_every_subscriber_and_the_next_one_reconnects(
        own_redis_url: str) -> None:
    r = redis.Redis.from_url(own_redis_url)
    db = r.connection_pool.connection_kwargs.get("db", 0)
    hub = pubsub.hub(r)
    subs = [hub.subscribe(f"lost:{i}") for i in range(3)]
    (conn,) = pubsub_clients(r, db)
    r.client_kill_filter(_id=conn["id"])
    for s in subs:
        with pytest.raises(redis.ConnectionError):
            for _ in range(3):
                s.get(5)
    fresh = hub.subscribe("lost:again")
    try:
        r.publish("lost:again", "hi")
        assert fresh.get(5) == b"hi"
    finally:
        fresh.close()
